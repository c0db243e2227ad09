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

// checkTx is Check inside the writer's transaction: bbolt's page check and
// the meta shard count, then a recount of the rows and packed rows, which
// every index, counter and digest must match exactly. It returns the first
// difference found.
func (s *Store) checkTx(w *wtx) error {
	if err := checkPages(w.tx); err != nil {
		return err
	}
	if v := w.b.meta.Get(metaShardCount); len(v) != 4 || binary.BigEndian.Uint32(v) != s.opts.ShardCount {
		return fmt.Errorf("meta shard_count %x, want %d", v, s.opts.ShardCount)
	}
	rc := newRecount()
	if err := s.recountRows(w, rc); err != nil {
		return err
	}
	if err := s.recountBundles(w, rc); err != nil {
		return err
	}
	if err := checkIndexSizes(w, rc); err != nil {
		return err
	}
	for _, cb := range []struct {
		name string
		b    *bolt.Bucket
		want map[string]counts
		n    int
	}{
		{"routes", w.b.routes, rc.routes, 1}, {"namespace", w.b.ns, rc.ns, nsCountsLen},
		{"namespace×shard", w.b.nsShard, rc.nsShard, nssCountsLen}, {"shard", w.b.shards, rc.shards, shCountsLen},
	} {
		if err := checkCounters(cb.name, cb.b, cb.want, cb.n); err != nil {
			return err
		}
	}
	return checkDigests(w.b.digests, rc.digests)
}

// checkPages runs bbolt's page-level check and returns the first problem
// it reports.
func checkPages(tx *bolt.Tx) error {
	var first error
	for err := range tx.Check() {
		if first == nil {
			first = fmt.Errorf("bbolt page check: %w", err)
		}
	}
	return first
}

// recount is what the rows and packed rows say the indexes, counters and
// digests must hold: entries per index (by its name in messages), counters
// by their bucket key, and each shard's digest.
type recount struct {
	entries                     map[string]int
	routes, ns, nsShard, shards map[string]counts
	digests                     map[uint32]*outbox.ShardDigest
}

func newRecount() *recount {
	return &recount{
		entries: map[string]int{},
		routes:  map[string]counts{}, ns: map[string]counts{}, nsShard: map[string]counts{}, shards: map[string]counts{},
		digests: map[uint32]*outbox.ShardDigest{},
	}
}

// count adds one to slot i of m's counters at key, which have n slots.
func (rc *recount) count(m map[string]counts, key []byte, n, i int) {
	c := m[string(key)]
	if c == nil {
		c = make(counts, n)
		m[string(key)] = c
	}
	c[i]++
}

// digest adds row to its shard's digest.
func (rc *recount) digest(row *outbox.Row) {
	d := rc.digests[row.Shard]
	if d == nil {
		d = &outbox.ShardDigest{Shard: row.Shard}
		rc.digests[row.Shard] = d
	}
	d.Add(row)
}

// bucketHas reports whether b holds key.
func bucketHas(b *bolt.Bucket, key []byte) bool {
	k, _ := b.Cursor().Seek(key)
	return k != nil && bytes.Equal(k, key)
}

// recountRows checks every rows entry and counts it into rc: its key's
// shard is the one it records, it is not both claimed and marked
// in-transfer, and every index entry its status calls for is present.
func (s *Store) recountRows(w *wtx, rc *recount) error {
	c := w.b.rows.Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		row, err := decodeRow(k, v)
		if err != nil {
			return err
		}
		if want := shards.ShardOf(row.DispatchKey, s.opts.ShardCount); row.Shard != want {
			return fmt.Errorf("row %q records shard %d, its shard is %d", row.DispatchKey, row.Shard, want)
		}
		xfer := bucketHas(w.b.transfer, k)
		if xfer && row.Status == outbox.StatusClaimed {
			return fmt.Errorf("row %q is claimed and marked in-transfer", row.DispatchKey)
		}
		if xfer {
			rc.entries["transfer"]++
		}
		keys := keysOf(&row, xfer)
		if err := checkRowEntries(w, rc, &row, keys); err != nil {
			return err
		}
		rc.countRow(&row, keys, xfer)
	}
	return nil
}

// checkRowEntries requires each index entry of row (keys) to be present,
// the byshard one recording row's shard, and counts them into rc.
func checkRowEntries(w *wtx, rc *recount, row *outbox.Row, keys indexKeys) error {
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
		if !bucketHas(e.b, e.key) {
			return fmt.Errorf("row %q (%s): %s index entry missing", row.DispatchKey, row.Status, e.name)
		}
		if e.name == "byshard" && !bytes.Equal(e.b.Get(e.key), appendShard(nil, row.Shard)) {
			return fmt.Errorf("row %q: byshard entry records shard %x, want %d", row.DispatchKey, e.b.Get(e.key), row.Shard)
		}
		rc.entries[e.name]++
	}
	return nil
}

// countRow adds a rows entry to the counters it moves: its route (if its
// status has one), its namespace's status slot, its shard's and
// namespace×shard's pending or claimed slot (the shard's terminal slot
// otherwise), its shard's transfer slot when marked, and its shard's
// digest.
func (rc *recount) countRow(row *outbox.Row, keys indexKeys, xfer bool) {
	if keys.route != nil {
		rc.count(rc.routes, keys.route, 1, 0)
	}
	rc.count(rc.ns, []byte(row.Namespace), nsCountsLen, nsIndex(row.Status))
	sk := appendShard(nil, row.Shard)
	switch row.Status {
	case outbox.StatusPending:
		rc.count(rc.shards, sk, shCountsLen, shPending)
		rc.count(rc.nsShard, nsShardKey(row.Namespace, row.Shard), nssCountsLen, nssPending)
	case outbox.StatusClaimed:
		rc.count(rc.shards, sk, shCountsLen, shClaimed)
		rc.count(rc.nsShard, nsShardKey(row.Namespace, row.Shard), nssCountsLen, nssClaimed)
	default:
		rc.count(rc.shards, sk, shCountsLen, shTerminal)
	}
	if xfer {
		rc.count(rc.shards, sk, shCountsLen, shTransfer)
	}
	rc.digest(row)
}

// recountBundles checks the packed rows and counts them into rc: every
// bundle decodes, starts at its key's first dispatch_key, does not overlap
// the shard's bundle before it, holds only done or cancelled rows of its
// shard that have no rows entry, and has its bexp entry; the bexp bucket
// holds nothing else.
func (s *Store) recountBundles(w *wtx, rc *recount) error {
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
			if rows[i].FinishedAt.Before(earliest) {
				earliest = rows[i].FinishedAt
			}
			if err := s.recountPackedRow(w, rc, &rows[i]); err != nil {
				return err
			}
		}
		if !bucketHas(w.b.bexp, bexpKey(earliest, bk)) {
			return fmt.Errorf("bundle %x: expiry entry at %s missing", bk, earliest)
		}
	}
	if got := w.b.bexp.Stats().KeyN; got != bundles {
		return fmt.Errorf("bundle expiry index has %d entries for %d bundles", got, bundles)
	}
	return nil
}

// recountPackedRow checks one packed row (its bundle's shard is its
// shard, it is done or cancelled, it has no rows entry) and counts it into
// rc: its namespace's status slot, its shard's terminal slot, its
// transfer mark and its shard's digest.
func (s *Store) recountPackedRow(w *wtx, rc *recount, row *outbox.Row) error {
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
	rc.count(rc.ns, []byte(row.Namespace), nsCountsLen, nsIndex(row.Status))
	sk := appendShard(nil, row.Shard)
	rc.count(rc.shards, sk, shCountsLen, shTerminal)
	if bucketHas(w.b.transfer, rk) {
		rc.entries["transfer"]++
		rc.count(rc.shards, sk, shCountsLen, shTransfer)
	}
	rc.digest(row)
	return nil
}

// checkIndexSizes requires each index to hold exactly the entries the
// rows account for: recountRows found every expected entry present, so an
// equal count means no entry beyond them.
func checkIndexSizes(w *wtx, rc *recount) error {
	for _, idx := range []struct {
		name string
		b    *bolt.Bucket
	}{
		{"byshard", w.b.byShard}, {"pending", w.b.pending}, {"claimed", w.b.claimed}, {"tombs", w.b.tombs},
		{"dead", w.b.dead}, {"dlq", w.b.dlq}, {"transfer", w.b.transfer},
	} {
		if got := idx.b.Stats().KeyN; got != rc.entries[idx.name] {
			return fmt.Errorf("%s index has %d entries, rows account for %d", idx.name, got, rc.entries[idx.name])
		}
	}
	return nil
}

// checkCounters compares counter bucket b (name in messages; n slots per
// counter) with want, in both directions: every stored counter decodes and
// equals the recount, and every recounted key is stored.
func checkCounters(name string, b *bolt.Bucket, want map[string]counts, n int) error {
	seen := 0
	err := b.ForEach(func(k, v []byte) error {
		got, err := decodeCounts(v, n)
		if err != nil {
			return fmt.Errorf("%s counter %x: %w", name, k, err)
		}
		w := want[string(k)]
		if w == nil {
			return fmt.Errorf("%s counter %x = %v, rows account for none", name, k, got)
		}
		if !slices.Equal(got, w) {
			return fmt.Errorf("%s counter %x = %v, rows account for %v", name, k, got, w)
		}
		seen++
		return nil
	})
	if err != nil {
		return err
	}
	if seen != len(want) {
		for k, w := range want {
			if v := b.Get([]byte(k)); v == nil {
				return fmt.Errorf("%s counter %x missing, rows account for %v", name, k, w)
			}
		}
	}
	return nil
}

// checkDigests compares the digests bucket b with want, in both
// directions: every stored digest has a 4-byte shard key, decodes and
// equals the one recomputed from the shard's rows, and every shard with
// rows has one.
func checkDigests(b *bolt.Bucket, want map[uint32]*outbox.ShardDigest) error {
	seen := 0
	err := b.ForEach(func(k, v []byte) error {
		if len(k) != 4 {
			return fmt.Errorf("digests key %x", k)
		}
		shard := binary.BigEndian.Uint32(k)
		rows, sum, err := decodeDigest(v)
		if err != nil {
			return fmt.Errorf("digest of shard %d: %w", shard, err)
		}
		w := want[shard]
		if w == nil {
			return fmt.Errorf("digest of shard %d = %d rows, sum %016x; the shard holds no row", shard, rows, sum)
		}
		if rows != w.Rows || sum != w.Sum {
			return fmt.Errorf("digest of shard %d = %d rows, sum %016x; its rows make %d rows, sum %016x", shard, rows, sum, w.Rows, w.Sum)
		}
		seen++
		return nil
	})
	if err != nil {
		return err
	}
	if seen != len(want) {
		for shard, w := range want {
			if b.Get(appendShard(nil, shard)) == nil {
				return fmt.Errorf("digest of shard %d missing; its rows make %d rows, sum %016x", shard, w.Rows, w.Sum)
			}
		}
	}
	return nil
}
