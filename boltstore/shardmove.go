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

// Moving and copying shards, as package transfer drives it (DESIGN.md
// "Data placement and handoff"):
//
//  1. ForeignShards lists non-owned shards holding pending or terminal rows
//     here (claimed rows finish here first), in transfer or not.
//  2. ReadShard with Mark reads a page of one such shard, bounded by rows
//     and bytes, from a resume token, and marks its rows in-transfer in the
//     same transaction: a marked row is never claimable.
//  3. The caller sends the page; the owner calls Merge and acks once durable.
//  4. CompleteTransfer deletes the rows still marked; AbortTransfer unmarks
//     them if the send failed.
//
// Any change to a marked row (settle, cancel, Merge, Redrive) clears its
// mark, so CompleteTransfer leaves it alone and a later pass resends the
// new state; the receiver's Merge keeps the newer copy. Open clears every
// mark (the sender crashed mid-transfer): resending is harmless. ReadShard
// without Mark is a copy (a replica sync): a read-only page of every row.

// ForeignShards returns, ascending, the shards this node does not own that
// hold rows here a handoff still has to move: pending or terminal rows,
// marked in-transfer or not (a marked row is still here until its
// transfer completes, so a shard whose rows are all on the wire, or whose
// marks a failed CompleteTransfer or AbortTransfer left, still counts).
// Cost: one pass over the per-shard counters.
func (s *Store) ForeignShards(ctx context.Context) ([]uint32, error) {
	var out []uint32
	err := s.view(ctx, "foreign shards", func(_ *bolt.Tx, b buckets) error {
		var err error
		out, err = foreignShards(b, s.owned.Load(), func(c counts) bool {
			return c[shPending]+c[shTerminal] > 0
		})
		return err
	})
	return out, err
}

// MarkedRows counts the rows marked in-transfer (on the wire, or left by a
// CompleteTransfer or AbortTransfer that failed and is being retried).
// Cost: one pass over the per-shard counters.
func (s *Store) MarkedRows(ctx context.Context) (int, error) {
	var n int64
	err := s.view(ctx, "count marked rows", func(_ *bolt.Tx, b buckets) error {
		return b.shards.ForEach(func(k, v []byte) error {
			c, err := decodeCounts(v, shCountsLen)
			if err != nil {
				return fmt.Errorf("%w: shard %x counters", ErrCorrupt, k)
			}
			n += c[shTransfer]
			return nil
		})
	})
	return int(n), err
}

// ReadShard reads the next page of one shard's rows (see outbox.ShardRead
// and outbox.ShardPage): first its rows entries in (CreatedAt,
// dispatch_key) order, the shard's entries of the byshard index after
// p.After, which is the byshard key of the last row examined (the resume
// token; valid across restarts), then its packed rows (bundle.go) in
// dispatch_key order, whose tokens are group ‖ 0xFF×12 ‖ dispatch_key. Entries
// of the other shards of the same byshard group are stepped over by value
// (at most ~16 entries read per row returned). A page holds at most
// p.MaxRows rows and, past its first row, at most p.MaxBytes bytes as
// outbox.RowBytes counts them.
//
// With p.Mark (a move) it is a write: pending and terminal rows not
// already marked are marked in-transfer in the same transaction (claimed
// and marked rows are stepped over); a shard owned when the transaction
// runs, or ≥ ShardCount, fails with outbox.ErrShardOwned. Without it (a
// copy) it is a short read transaction returning every row as stored.
// A token that is not a byshard key of the shard's group fails with
// outbox.ErrInvalidToken.
func (s *Store) ReadShard(ctx context.Context, p outbox.ShardRead) (outbox.ShardPage, error) {
	what := fmt.Sprintf("read shard %d", p.Shard)
	if p.Mark {
		what = fmt.Sprintf("mark rows of shard %d for transfer", p.Shard)
	}
	if p.MaxRows <= 0 {
		return outbox.ShardPage{Next: p.After}, s.checkOpen(what)
	}
	if err := checkToken(p); err != nil {
		return outbox.ShardPage{Next: p.After}, fmt.Errorf("boltstore: %s: %w", what, err)
	}
	var page outbox.ShardPage
	if !p.Mark {
		err := s.view(ctx, what, func(_ *bolt.Tx, b buckets) error {
			var err error
			page, _, err = scanShard(b, p, nil)
			return err
		})
		if err != nil {
			return outbox.ShardPage{Next: p.After}, err
		}
		return page, nil
	}
	err := s.submit(ctx, what, p.MaxRows, func(w *wtx) error {
		if p.Shard >= s.opts.ShardCount || s.owned.Load().has(p.Shard) {
			return fmt.Errorf("boltstore: %s: %w", what, outbox.ErrShardOwned)
		}
		var err error
		page, err = markShard(w, p)
		return err
	})
	if err != nil {
		return outbox.ShardPage{Next: p.After}, err
	}
	return page, nil
}

// ReadShards is a marking ReadShard of several shards in ONE transaction
// (one fsync), sharing one budget: reads[i] is read with what is left of
// maxRows and maxBytes after the pages before it (each read's own MaxRows,
// MaxBytes and Mark are ignored; every read marks). It stops once the
// budget is spent and returns the pages of the reads it made, in order
// (fewer than len(reads) when the budget ran out). A shard this node owns
// (or ≥ ShardCount) is not read: its page is empty and Done. A node
// draining a few rows from each of hundreds of shards pays one commit per
// batch instead of one per shard. A bad token fails the whole call with
// outbox.ErrInvalidToken, nothing marked.
func (s *Store) ReadShards(ctx context.Context, reads []outbox.ShardRead, maxRows, maxBytes int) ([]outbox.ShardPage, error) {
	const what = "mark rows of shards for transfer"
	if maxRows <= 0 || len(reads) == 0 {
		return nil, s.checkOpen(what)
	}
	for _, p := range reads {
		if err := checkToken(p); err != nil {
			return nil, fmt.Errorf("boltstore: %s: shard %d: %w", what, p.Shard, err)
		}
	}
	var pages []outbox.ShardPage
	err := s.submit(ctx, what, maxRows, func(w *wtx) error {
		pages = pages[:0]
		owned := s.owned.Load()
		rows, size := 0, 0
		for _, p := range reads {
			if rows >= maxRows || (maxBytes > 0 && size >= maxBytes) {
				break
			}
			if p.Shard >= s.opts.ShardCount || owned.has(p.Shard) {
				pages = append(pages, outbox.ShardPage{Next: p.After, Done: true})
				continue
			}
			p.Mark, p.MaxRows, p.MaxBytes = true, maxRows-rows, 0
			if maxBytes > 0 {
				p.MaxBytes = maxBytes - size
			}
			page, err := markShard(w, p)
			if err != nil {
				return err
			}
			rows += len(page.Rows)
			for i := range page.Rows {
				size += outbox.RowBytes(&page.Rows[i])
			}
			pages = append(pages, page)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return pages, nil
}

// checkToken verifies that p.After, if set, is a byshard key of p.Shard's
// group.
func checkToken(p outbox.ShardRead) error {
	group := byShardGroup(p.Shard)
	if len(p.After) > 0 && (len(p.After) < len(group)+timeKeyLen || !bytes.HasPrefix(p.After, group)) {
		return fmt.Errorf("%w: %x is not a token of shard %d", outbox.ErrInvalidToken, p.After, p.Shard)
	}
	return nil
}

// markShard is a marking read inside the writer's transaction: scanShard,
// then the page's rows are marked in-transfer.
func markShard(w *wtx, p outbox.ShardRead) (outbox.ShardPage, error) {
	page, rks, err := scanShard(w.b, p, w.marked)
	if err != nil {
		return page, err
	}
	for i, rk := range rks {
		if err := w.write(rk, &page.Rows[i], false, &page.Rows[i], true, nil); err != nil {
			return page, err
		}
	}
	return page, nil
}

// bundlePhase is the time part of a resume token past the shard's byshard
// entries: the page goes on in its packed rows (no time key is all 0xFF:
// its nanoseconds would exceed a second).
var bundlePhase = bytes.Repeat([]byte{0xFF}, timeKeyLen)

// scanShard reads one page of p.Shard (see ReadShard): first the byshard
// index (rows entries, in CreatedAt order), then the shard's bundles
// (packed rows, in dispatch_key order; their tokens are group ‖
// bundlePhase ‖ dispatch_key). With p.Mark it steps over claimed rows and
// rows xferOf says are marked. It returns the page and its rows' keys.
func scanShard(b buckets, p outbox.ShardRead, xferOf func(rk []byte) bool) (outbox.ShardPage, [][]byte, error) {
	sc := &shardScan{p: p, xferOf: xferOf, page: outbox.ShardPage{Next: p.After, Done: true}}
	group := byShardGroup(p.Shard)
	phase := append(slices.Clone(group), bundlePhase...)
	afterPacked := ""
	if bytes.HasPrefix(p.After, phase) {
		afterPacked = string(p.After[len(phase):])
	} else {
		more, err := sc.rowsEntries(b, group)
		if err != nil {
			return sc.page, nil, err
		}
		if !more {
			return sc.page, sc.rks, nil
		}
	}
	if err := sc.packedRows(b, phase, afterPacked); err != nil {
		return sc.page, nil, err
	}
	return sc.page, sc.rks, nil
}

// shardScan is one scanShard call's page as it fills: the page, its rows'
// keys and their size as outbox.RowBytes counts it.
type shardScan struct {
	p      outbox.ShardRead
	xferOf func(rk []byte) bool
	page   outbox.ShardPage
	rks    [][]byte
	size   int
}

// add appends row (key rk, resume token token) unless the page is full:
// p.MaxRows rows, or, past its first row, p.MaxBytes bytes. False: the
// page is full and not done; stop here.
func (sc *shardScan) add(rk []byte, row *outbox.Row, token []byte) bool {
	if len(sc.page.Rows) >= sc.p.MaxRows {
		sc.page.Done = false
		return false
	}
	n := outbox.RowBytes(row)
	if sc.p.MaxBytes > 0 && len(sc.page.Rows) > 0 && sc.size+n > sc.p.MaxBytes {
		sc.page.Done = false
		return false
	}
	sc.size += n
	sc.page.Rows = append(sc.page.Rows, *row)
	sc.page.Next = token
	sc.rks = append(sc.rks, rk)
	return true
}

// stepOver moves the page's token past a row a marking read does not
// offer (claimed or already marked), unless the page already holds
// p.MaxRows rows: then it is not done and its token stays at its last row,
// where the next read resumes. False: stop here.
func (sc *shardScan) stepOver(token []byte) bool {
	if len(sc.page.Rows) >= sc.p.MaxRows {
		sc.page.Done = false
		return false
	}
	sc.page.Next = token
	return true
}

// rowsEntries pages through the shard's entries of its byshard group
// after p.After, stepping over the other shards' entries of the group.
// False: the page is full; the packed rows are not reached.
func (sc *shardScan) rowsEntries(b buckets, group []byte) (bool, error) {
	want := appendShard(nil, sc.p.Shard)
	c := b.byShard.Cursor()
	k, v := c.Seek(group)
	if len(sc.p.After) > 0 {
		k, v = c.Seek(sc.p.After)
		if bytes.Equal(k, sc.p.After) {
			k, v = c.Next()
		}
	}
	for ; k != nil && bytes.HasPrefix(k, group); k, v = c.Next() {
		if len(k) < len(group)+timeKeyLen {
			return false, fmt.Errorf("%w: byshard key %x", ErrCorrupt, k)
		}
		if !bytes.Equal(v, want) {
			continue
		}
		rk := rowKey(string(k[len(group)+timeKeyLen:]))
		if sc.p.Mark && sc.xferOf(rk) {
			if !sc.stepOver(append([]byte(nil), k...)) {
				return false, nil
			}
			continue
		}
		val := b.rows.Get(rk)
		if val == nil {
			return false, fmt.Errorf("%w: byshard entry for %q without a row", ErrCorrupt, rk)
		}
		row, err := decodeRow(rk, val)
		if err != nil {
			return false, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		if sc.p.Mark && row.Status == outbox.StatusClaimed {
			if !sc.stepOver(append([]byte(nil), k...)) {
				return false, nil
			}
			continue
		}
		if !sc.add(rk, &row, append([]byte(nil), k...)) {
			return false, nil
		}
	}
	return true, nil
}

// packedRows pages through the shard's packed rows after afterPacked (""
// for all), from the bundle holding it; a row's token is phase ‖ its row
// key. Packed rows are never claimed: a marking read steps over the
// marked ones only.
func (sc *shardScan) packedRows(b buckets, phase []byte, afterPacked string) error {
	want := appendShard(nil, sc.p.Shard)
	c := b.bundles.Cursor()
	var bk, bv []byte
	if afterPacked != "" {
		if bk, _ = findBundle(c, sc.p.Shard, afterPacked); bk != nil {
			bk, bv = c.Seek(bk)
		}
	}
	if bk == nil {
		bk, bv = c.Seek(want)
	}
	for ; bk != nil && bytes.HasPrefix(bk, want); bk, bv = c.Next() {
		br, err := openBundle(bk, bv)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		rows, err := br.all()
		if err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		for i := range rows {
			if rows[i].DispatchKey <= afterPacked {
				continue
			}
			rk := rowKey(rows[i].DispatchKey)
			token := append(slices.Clone(phase), rk...)
			if sc.p.Mark && sc.xferOf(rk) {
				if !sc.stepOver(token) {
					return nil
				}
				continue
			}
			if !sc.add(rk, &rows[i], token) {
				return nil
			}
		}
	}
	return nil
}

// CompleteTransfer deletes the rows of keys that are still marked
// in-transfer: call it once the receiver has acknowledged them durably.
// Keys no longer marked (changed or aborted since) or absent are skipped.
// It returns the number of rows deleted.
func (s *Store) CompleteTransfer(ctx context.Context, keys []string) (int, error) {
	return s.endTransfer(ctx, "complete transfer", keys, true)
}

// AbortTransfer unmarks the rows of keys still marked in-transfer, making
// them claimable again if their shard is owned (the send failed). It
// returns the number of rows unmarked.
func (s *Store) AbortTransfer(ctx context.Context, keys []string) (int, error) {
	return s.endTransfer(ctx, "abort transfer", keys, false)
}

func (s *Store) endTransfer(ctx context.Context, what string, keys []string, del bool) (int, error) {
	if len(keys) == 0 {
		return 0, s.checkOpen(what)
	}
	n := 0
	err := s.submit(ctx, what, len(keys), func(w *wtx) error {
		n = 0
		for _, dk := range keys {
			rk := rowKey(dk)
			row, xfer, ok, packed, err := w.getAny(rk)
			if err != nil {
				return err
			}
			if !ok || !xfer {
				continue
			}
			if del {
				if packed {
					if err := w.unbundle(&row); err != nil {
						return err
					}
				}
				err = w.writeFrom(rk, &row, true, nil, false, nil, packed)
			} else {
				err = w.write(rk, &row, true, &row, false, nil)
			}
			if err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}

// Merge stores copies of rows received from other nodes (hand-off, sync,
// replication), deduplicating by dispatch_key. The whole batch is
// validated first (outbox.ErrInvalidRow, nothing written). Each copy is
// given its defaults by outbox.NormalizeIncoming (a claimed copy becomes
// pending: claims are local to the node delivering the row), its Shard is
// recomputed from the key, and it is merged with the stored copy by
// outbox.MergeIncoming: the newer state wins by the row version (a
// redriven row beats any copy of its dead letter; terminal beats live
// within a generation; a claim here beats every live copy of its
// generation: its delivery runs), and
// the earlier CreatedAt is kept. Rows repeated within a batch are merged
// in order. A stored row the merge changes loses its transfer mark; so
// does a marked row it leaves unchanged (the row came back while we were
// sending it away: the sender gave its copy up, so our own pending
// CompleteTransfer must not delete the last copy). It returns how many
// rows were created, updated and skipped (unchanged).
func (s *Store) Merge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
	now := s.now()
	prep := make([]prepared, len(rows))
	for i := range rows {
		r := rows[i]
		if err := validateRow(i, &r); err != nil {
			return outbox.MergeResult{}, fmt.Errorf("boltstore: merge: %w", err)
		}
		if !r.Status.Valid() {
			return outbox.MergeResult{}, fmt.Errorf("boltstore: merge row %d: %w: dispatch_key %q: status %q", i, outbox.ErrInvalidRow, r.DispatchKey, r.Status)
		}
		outbox.NormalizeIncoming(&r, now)
		r.Shard = shards.ShardOf(r.DispatchKey, s.opts.ShardCount)
		prep[i] = prepared{rk: rowKey(r.DispatchKey), row: r}
	}
	if len(rows) == 0 {
		return outbox.MergeResult{}, s.checkOpen("merge")
	}
	var res outbox.MergeResult
	err := s.submit(ctx, "merge", len(rows), func(w *wtx) error {
		res = outbox.MergeResult{}
		for i := range prep {
			in := prep[i].row
			old, xfer, ok, packed, err := w.getAny(prep[i].rk)
			if err != nil {
				return err
			}
			if !ok {
				if err := w.write(prep[i].rk, nil, false, &in, false, nil); err != nil {
					return err
				}
				res.Created++
				continue
			}
			merged := outbox.MergeIncoming(old, in)
			if outbox.Compare(merged, old) == 0 && merged.CreatedAt.Equal(old.CreatedAt) {
				if xfer {
					if err := w.write(prep[i].rk, &old, true, &old, false, nil); err != nil {
						return err
					}
				}
				res.Skipped++
				continue
			}
			if packed {
				// A newer state of a packed row: it leaves its bundle and
				// becomes a rows entry again (packed anew when finished).
				if err := w.unbundle(&old); err != nil {
					return err
				}
			}
			if err := w.writeFrom(prep[i].rk, &old, xfer, &merged, false, nil, packed); err != nil {
				return err
			}
			res.Updated++
		}
		return nil
	})
	if err != nil {
		return outbox.MergeResult{}, err
	}
	return res, nil
}

// ShardDigest returns the digest of the rows of shard held here (every
// row, owned shard or not, in transfer or not), as maintained in the
// transaction of every change: see outbox.ShardDigest. A shard holding
// nothing has the zero digest. Cost: one read.
func (s *Store) ShardDigest(ctx context.Context, shard uint32) (outbox.ShardDigest, error) {
	d := outbox.ShardDigest{Shard: shard}
	err := s.view(ctx, fmt.Sprintf("read digest of shard %d", shard), func(_ *bolt.Tx, b buckets) error {
		v := b.digests.Get(appendShard(nil, shard))
		if v == nil {
			return nil
		}
		var err error
		if d.Rows, d.Sum, err = decodeDigest(v); err != nil {
			return fmt.Errorf("%w: digest of shard %d", ErrCorrupt, shard)
		}
		return nil
	})
	return d, err
}

// ShardDigests returns the digests of every shard holding rows here,
// ascending by shard. Cost: one pass over at most ShardCount small entries.
func (s *Store) ShardDigests(ctx context.Context) ([]outbox.ShardDigest, error) {
	var out []outbox.ShardDigest
	err := s.view(ctx, "read shard digests", func(_ *bolt.Tx, b buckets) error {
		return b.digests.ForEach(func(k, v []byte) error {
			if len(k) != 4 {
				return fmt.Errorf("%w: digests key %x", ErrCorrupt, k)
			}
			d := outbox.ShardDigest{Shard: binary.BigEndian.Uint32(k)}
			var err error
			if d.Rows, d.Sum, err = decodeDigest(v); err != nil {
				return fmt.Errorf("%w: digest of shard %d", ErrCorrupt, d.Shard)
			}
			out = append(out, d)
			return nil
		})
	})
	return out, err
}
