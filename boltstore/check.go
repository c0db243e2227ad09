package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"slices"

	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// Check verifies the whole file and returns the first problem found,
// wrapping ErrCorrupt, or nil. It runs bbolt's page-level tx.Check, then
// recounts every row and compares each index (pending, claimed, tombstone,
// dead-letter, transfer) and counter (routes, namespace, namespace×shard,
// shard) with the recount, entry by entry in both directions, and every
// shard's digest (outbox.ShardDigest: row count and sum of
// outbox.DigestOf) with one recomputed from the rows, packed rows
// included: every bundle must decode, hold its shard's done and cancelled
// rows in key order without overlapping its neighbours or the rows
// bucket, and have its expiry entry. It checks the
// invariants the indexes encode: a row's key prefix is its shard, a transfer
// mark is only on pending or terminal rows, and every row is in exactly one
// status index. It runs as a write operation (bbolt's check is only safe
// without a concurrent writer), so it holds the writer for its duration:
// O(rows) time and memory. For tests and admin use, not the hot path.
func (s *Store) Check(ctx context.Context) error {
	var result error
	err := s.submit(ctx, "check", 1, func(w *wtx) error {
		result = nil
		if err := s.checkTx(w); err != nil {
			result = fmt.Errorf("boltstore: check %s: %w: %w", s.path, ErrCorrupt, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	return result
}

func (s *Store) checkTx(w *wtx) error {
	var first error
	for err := range w.tx.Check() {
		if first == nil {
			first = fmt.Errorf("bbolt page check: %w", err)
		}
	}
	if first != nil {
		return first
	}
	if v := w.b.meta.Get(metaShardCount); len(v) != 4 || binary.BigEndian.Uint32(v) != s.opts.ShardCount {
		return fmt.Errorf("meta shard_count %x, want %d", v, s.opts.ShardCount)
	}

	var (
		nIdx     = map[string]int{}
		nsWant   = map[string]counts{}
		nssWant  = map[string]counts{}
		shWant   = map[string]counts{}
		rtWant   = map[string]counts{}
		dgWant   = map[uint32]*outbox.ShardDigest{}
		idxOrder = []struct {
			name string
			b    *bolt.Bucket
		}{
			{"byshard", w.b.byShard}, {"pending", w.b.pending}, {"claimed", w.b.claimed}, {"tombs", w.b.tombs},
			{"dead", w.b.dead}, {"dlq", w.b.dlq}, {"transfer", w.b.transfer},
		}
	)
	add := func(m map[string]counts, key []byte, n, i int) {
		c := m[string(key)]
		if c == nil {
			c = make(counts, n)
			m[string(key)] = c
		}
		c[i]++
	}
	has := func(b *bolt.Bucket, key []byte) bool {
		k, _ := b.Cursor().Seek(key)
		return k != nil && bytes.Equal(k, key)
	}
	c := w.b.rows.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		row, err := decodeRow(k, v)
		if err != nil {
			return err
		}
		if want := shards.ShardOf(row.DispatchKey, s.opts.ShardCount); row.Shard != want {
			return fmt.Errorf("row %q records shard %d, its shard is %d", row.DispatchKey, row.Shard, want)
		}
		xfer := has(w.b.transfer, k)
		if xfer && row.Status == outbox.StatusClaimed {
			return fmt.Errorf("row %q is claimed and marked in-transfer", row.DispatchKey)
		}
		if xfer {
			nIdx["transfer"]++
		}
		keys := keysOf(&row, xfer)
		for _, e := range []struct {
			name string
			b    *bolt.Bucket
			key  []byte
		}{
			{"byshard", w.b.byShard, keys.byShard},
			{"pending", w.b.pending, keys.pending}, {"claimed", w.b.claimed, keys.claimed},
			{"tombs", w.b.tombs, keys.tomb}, {"dead", w.b.dead, keys.dead}, {"dlq", w.b.dlq, keys.dlq},
		} {
			if e.key == nil {
				continue
			}
			if !has(e.b, e.key) {
				return fmt.Errorf("row %q (%s): %s index entry missing", row.DispatchKey, row.Status, e.name)
			}
			if e.name == "byshard" && !bytes.Equal(e.b.Get(e.key), appendShard(nil, row.Shard)) {
				return fmt.Errorf("row %q: byshard entry records shard %x, want %d", row.DispatchKey, e.b.Get(e.key), row.Shard)
			}
			nIdx[e.name]++
		}
		if keys.route != nil {
			add(rtWant, keys.route, 1, 0)
		}
		add(nsWant, []byte(row.Namespace), nsCountsLen, nsIndex(row.Status))
		sk := appendShard(nil, row.Shard)
		switch row.Status {
		case outbox.StatusPending:
			add(shWant, sk, shCountsLen, shPending)
			add(nssWant, nsShardKey(row.Namespace, row.Shard), nssCountsLen, nssPending)
		case outbox.StatusClaimed:
			add(shWant, sk, shCountsLen, shClaimed)
			add(nssWant, nsShardKey(row.Namespace, row.Shard), nssCountsLen, nssClaimed)
		default:
			add(shWant, sk, shCountsLen, shTerminal)
		}
		if xfer {
			add(shWant, sk, shCountsLen, shTransfer)
		}
		d := dgWant[row.Shard]
		if d == nil {
			d = &outbox.ShardDigest{Shard: row.Shard}
			dgWant[row.Shard] = d
		}
		d.Add(&row)
	}
	// Packed rows: every bundle decodes, holds keys of its shard in order
	// (from its own key's first key, after the previous bundle's), done
	// or cancelled rows with no rows entry, and has its bexp entry.
	bundles := 0
	var prevShard uint32
	var prevLast string
	bc := w.b.bundles.Cursor()
	for bk, bv := bc.First(); bk != nil; bk, bv = bc.Next() {
		br, err := openBundle(bk, bv)
		if err != nil {
			return err
		}
		rows, err := br.all()
		if err != nil {
			return fmt.Errorf("bundle %x: %w", bk, err)
		}
		if rows[0].DispatchKey != string(bk[4:]) {
			return fmt.Errorf("bundle %x starts at %q", bk, rows[0].DispatchKey)
		}
		if bundles > 0 && prevShard == br.shard && prevLast >= rows[0].DispatchKey {
			return fmt.Errorf("bundle %x overlaps the one before it (which ends at %q)", bk, prevLast)
		}
		bundles++
		prevShard, prevLast = br.shard, rows[len(rows)-1].DispatchKey
		earliest := rows[0].FinishedAt
		for i := range rows {
			row := &rows[i]
			if row.FinishedAt.Before(earliest) {
				earliest = row.FinishedAt
			}
			if want := shards.ShardOf(row.DispatchKey, s.opts.ShardCount); row.Shard != want {
				return fmt.Errorf("packed row %q is in a bundle of shard %d, its shard is %d", row.DispatchKey, row.Shard, want)
			}
			if row.Status != outbox.StatusDone && row.Status != outbox.StatusCancelled {
				return fmt.Errorf("packed row %q is %s", row.DispatchKey, row.Status)
			}
			rk := rowKey(row.DispatchKey)
			if w.b.rows.Get(rk) != nil {
				return fmt.Errorf("row %q is both packed and a rows entry", row.DispatchKey)
			}
			add(nsWant, []byte(row.Namespace), nsCountsLen, nsIndex(row.Status))
			sk := appendShard(nil, row.Shard)
			add(shWant, sk, shCountsLen, shTerminal)
			if has(w.b.transfer, rk) {
				nIdx["transfer"]++
				add(shWant, sk, shCountsLen, shTransfer)
			}
			d := dgWant[row.Shard]
			if d == nil {
				d = &outbox.ShardDigest{Shard: row.Shard}
				dgWant[row.Shard] = d
			}
			d.Add(row)
		}
		if !has(w.b.bexp, bexpKey(earliest, bk)) {
			return fmt.Errorf("bundle %x: expiry entry at %s missing", bk, earliest)
		}
	}
	if got := w.b.bexp.Stats().KeyN; got != bundles {
		return fmt.Errorf("bundle expiry index has %d entries for %d bundles", got, bundles)
	}

	// Entries present for every row; now no entry beyond them.
	for _, idx := range idxOrder {
		if got := idx.b.Stats().KeyN; got != nIdx[idx.name] {
			return fmt.Errorf("%s index has %d entries, rows account for %d", idx.name, got, nIdx[idx.name])
		}
	}
	for _, cb := range []struct {
		name string
		b    *bolt.Bucket
		want map[string]counts
		n    int
	}{
		{"routes", w.b.routes, rtWant, 1}, {"namespace", w.b.ns, nsWant, nsCountsLen},
		{"namespace×shard", w.b.nsShard, nssWant, nssCountsLen}, {"shard", w.b.shards, shWant, shCountsLen},
	} {
		seen := 0
		err := cb.b.ForEach(func(k, v []byte) error {
			got, err := decodeCounts(v, cb.n)
			if err != nil {
				return fmt.Errorf("%s counter %x: %w", cb.name, k, err)
			}
			want := cb.want[string(k)]
			if want == nil {
				return fmt.Errorf("%s counter %x = %v, rows account for none", cb.name, k, got)
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("%s counter %x = %v, rows account for %v", cb.name, k, got, want)
			}
			seen++
			return nil
		})
		if err != nil {
			return err
		}
		if seen != len(cb.want) {
			for k, want := range cb.want {
				if v := cb.b.Get([]byte(k)); v == nil {
					return fmt.Errorf("%s counter %x missing, rows account for %v", cb.name, k, want)
				}
			}
		}
	}
	seen := 0
	err := w.b.digests.ForEach(func(k, v []byte) error {
		if len(k) != 4 {
			return fmt.Errorf("digests key %x", k)
		}
		shard := binary.BigEndian.Uint32(k)
		rows, sum, err := decodeDigest(v)
		if err != nil {
			return fmt.Errorf("digest of shard %d: %w", shard, err)
		}
		want := dgWant[shard]
		if want == nil {
			return fmt.Errorf("digest of shard %d = %d rows, sum %016x; the shard holds no row", shard, rows, sum)
		}
		if rows != want.Rows || sum != want.Sum {
			return fmt.Errorf("digest of shard %d = %d rows, sum %016x; its rows make %d rows, sum %016x", shard, rows, sum, want.Rows, want.Sum)
		}
		seen++
		return nil
	})
	if err != nil {
		return err
	}
	if seen != len(dgWant) {
		for shard, want := range dgWant {
			if w.b.digests.Get(appendShard(nil, shard)) == nil {
				return fmt.Errorf("digest of shard %d missing; its rows make %d rows, sum %016x", shard, want.Rows, want.Sum)
			}
		}
	}
	return nil
}
