package boltstore

import (
	"bytes"
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// Handoff, as the node's handoff loop drives it (DESIGN.md "Data placement
// and handoff"):
//
//  1. ForeignShards lists non-owned shards holding transferable rows
//     (pending rows and tombstones; claimed rows finish here first).
//  2. BeginTransfer reads a batch of one such shard and marks it
//     in-transfer in the same transaction: a marked row is never claimable.
//  3. The loop sends the batch; the owner calls Merge and acks once durable.
//  4. CompleteTransfer deletes the rows still marked; AbortTransfer unmarks
//     them if the send failed.
//
// Any change to a marked row (Complete, Fail, Merge, Redrive) clears its
// mark, so CompleteTransfer leaves it alone and a later round resends the
// new state; the receiver's Merge rules let the newer state win. Open clears
// every mark (the sender crashed mid-transfer): resending is harmless.

// ForeignShards returns, ascending, the shards this node does not own that
// hold rows here which could be handed off now (pending or terminal, not
// already in transfer). Cost: one pass over the per-shard counters.
func (s *Store) ForeignShards(ctx context.Context) ([]uint32, error) {
	var out []uint32
	err := s.view(ctx, "foreign shards", func(_ *bolt.Tx, b buckets) error {
		var err error
		out, err = foreignShards(b, s.owned.Load(), func(c counts) bool {
			return c[shPending]+c[shTerminal]-c[shTransfer] > 0
		})
		return err
	})
	return out, err
}

// BeginTransfer reads up to limit transferable rows of a non-owned shard
// (pending and terminal rows not already in transfer; claimed rows are
// skipped until they settle), in CreatedAt order from where the previous
// call for the shard stopped (wrapping around), and marks them
// in-transfer in the same transaction. It fails with ErrShardOwned if shard
// is owned (or ≥ ShardCount) when the transaction runs. An empty result
// means nothing is left to send.
func (s *Store) BeginTransfer(ctx context.Context, shard uint32, limit int) ([]outbox.Row, error) {
	what := fmt.Sprintf("begin transfer of shard %d", shard)
	if limit <= 0 {
		return nil, s.checkOpen(what)
	}
	var out []outbox.Row
	var resume []byte
	err := s.submit(ctx, what, limit, func(w *wtx) error {
		out = out[:0]
		if shard >= s.opts.ShardCount || s.owned.Load().has(shard) {
			return fmt.Errorf("boltstore: %s: %w", what, ErrShardOwned)
		}
		// A circular scan of the shard's group in byshard, from just after
		// where the previous call for this shard stopped: each call costs
		// what it returns (plus the group's other shards' entries stepped
		// over), and a full lap sees every row, including rows unmarked by
		// AbortTransfer or a restart behind the resume point.
		group := byShardGroup(shard)
		want := appendShard(nil, shard)
		from := s.transferResume(shard)
		resume = nil
		var rks [][]byte
		c := w.b.byShard.Cursor()
		visit := func(k, v []byte) error {
			if len(k) < len(group)+timeKeyLen {
				return fmt.Errorf("%w: byshard key %x", ErrCorrupt, k)
			}
			if !bytes.Equal(v, want) {
				return nil
			}
			rk := rowKey(string(k[len(group)+timeKeyLen:]))
			row, xfer, ok, err := w.getRow(rk)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%w: byshard entry for %q without a row", ErrCorrupt, rk)
			}
			if row.Status == outbox.StatusClaimed || xfer {
				return nil
			}
			rks = append(rks, rk)
			out = append(out, row)
			resume = append(resume[:0], k...)
			return nil
		}
		start := group
		if len(from) > 0 {
			start = from
		}
		k, v := c.Seek(start)
		if len(from) > 0 && bytes.Equal(k, from) {
			k, v = c.Next()
		}
		for ; k != nil && bytes.HasPrefix(k, group) && len(rks) < limit; k, v = c.Next() {
			if err := visit(k, v); err != nil {
				return err
			}
		}
		if len(rks) < limit && len(from) > 0 {
			// Wrap: from the group's start up to the resume point.
			for k, v = c.Seek(group); k != nil && bytes.Compare(k, from) <= 0 && len(rks) < limit; k, v = c.Next() {
				if err := visit(k, v); err != nil {
					return err
				}
			}
		}
		for i, rk := range rks {
			if err := w.write(rk, &out[i], false, &out[i], true, nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) > 0 {
		s.setTransferResume(shard, resume)
	}
	return out, nil
}

// transferResume returns a copy of the byshard key where the last
// BeginTransfer of shard stopped (nil: start of the group). It is only a
// starting point: the scan is circular, so a stale or lost value costs time,
// never rows.
func (s *Store) transferResume(shard uint32) []byte {
	s.resumeMu.Lock()
	defer s.resumeMu.Unlock()
	return append([]byte(nil), s.resume[shard]...)
}

func (s *Store) setTransferResume(shard uint32, key []byte) {
	s.resumeMu.Lock()
	defer s.resumeMu.Unlock()
	if s.resume == nil {
		s.resume = make(map[uint32][]byte)
	}
	s.resume[shard] = key
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
			row, xfer, ok, err := w.getRow(rk)
			if err != nil {
				return err
			}
			if !ok || !xfer {
				continue
			}
			if del {
				err = w.write(rk, &row, true, nil, false, nil)
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

// Merge stores rows received by handoff, deduplicating by dispatch_key. The
// whole batch is validated first (outbox.ErrInvalidRow, nothing written).
// Incoming rows are normalised: Shard is recomputed from the key; a claimed
// row becomes pending (its sender is not delivering it any more: handoff
// never sends claimed rows, so this is only a guard) with ClaimedAt
// cleared; Attempt 0 becomes 1; a zero CreatedAt becomes the store clock and
// a zero VisibleAfter becomes CreatedAt; a terminal row without FinishedAt
// gets the store clock.
//
// Rules, for an incoming row whose key already exists here:
//
//	existing terminal                  → keep existing (skipped): a finished row never comes back
//	incoming terminal, existing live   → take incoming (updated): terminal beats live
//	existing claimed, incoming pending → keep existing (skipped): a claim in progress is not undone
//	both pending                       → take incoming iff its Attempt is higher, or equal with a
//	                                     later VisibleAfter (it carries more delivery history);
//	                                     otherwise keep existing (skipped)
//
// A taken row keeps the earlier of the two CreatedAt. Rows repeated within a
// batch are merged in order. A merge that changes a row clears its transfer
// mark. It returns how many rows were created, updated and skipped.
func (s *Store) Merge(ctx context.Context, rows []outbox.Row) (created, updated, skipped int, err error) {
	now := s.now()
	prep := make([]prepared, len(rows))
	for i := range rows {
		r := rows[i]
		if err := validateRow(i, &r); err != nil {
			return 0, 0, 0, fmt.Errorf("boltstore: merge: %w", err)
		}
		if !r.Status.Valid() {
			return 0, 0, 0, fmt.Errorf("boltstore: merge row %d: %w: dispatch_key %q: status %q", i, outbox.ErrInvalidRow, r.DispatchKey, r.Status)
		}
		normalizeIncoming(&r, now)
		r.Shard = shards.ShardOf(r.DispatchKey, s.opts.ShardCount)
		prep[i] = prepared{rk: rowKey(r.DispatchKey), row: r}
	}
	if len(rows) == 0 {
		return 0, 0, 0, s.checkOpen("merge")
	}
	err = s.submit(ctx, "merge", len(rows), func(w *wtx) error {
		created, updated, skipped = 0, 0, 0
		for i := range prep {
			in := prep[i].row
			old, xfer, ok, err := w.getRow(prep[i].rk)
			if err != nil {
				return err
			}
			if !ok {
				if err := w.write(prep[i].rk, nil, false, &in, false, nil); err != nil {
					return err
				}
				created++
				continue
			}
			if !mergeTakesIncoming(&old, &in) {
				if xfer {
					// The row came back while we were sending it away (the
					// two views disagreed, or ownership flipped back). The
					// sender has given its copy up, so ours must not be
					// deleted by our own pending CompleteTransfer: drop the
					// mark, keep the row.
					if err := w.write(prep[i].rk, &old, true, &old, false, nil); err != nil {
						return err
					}
				}
				skipped++
				continue
			}
			if !old.CreatedAt.IsZero() && old.CreatedAt.Before(in.CreatedAt) {
				in.CreatedAt = old.CreatedAt
			}
			if err := w.write(prep[i].rk, &old, xfer, &in, false, nil); err != nil {
				return err
			}
			updated++
		}
		return nil
	})
	if err != nil {
		return 0, 0, 0, err
	}
	return created, updated, skipped, nil
}

// normalizeIncoming fills a row's defaults as Append and Merge store it:
// attempt 1, created and visible now, no claim (an incoming claimed copy is
// pending here), FinishedAt only on terminal rows.
func normalizeIncoming(r *outbox.Row, now time.Time) {
	if r.Status == outbox.StatusClaimed {
		r.Status = outbox.StatusPending
	}
	if r.Attempt == 0 {
		r.Attempt = 1
	}
	if r.CreatedAt.IsZero() {
		r.CreatedAt = now
	}
	if r.VisibleAfter.IsZero() {
		r.VisibleAfter = r.CreatedAt
	}
	r.ClaimedAt = time.Time{}
	if r.Status.Terminal() {
		if r.FinishedAt.IsZero() {
			r.FinishedAt = now
		}
	} else {
		r.FinishedAt = time.Time{}
	}
}

// mergeTakesIncoming applies Merge's rules to an existing and an incoming
// (normalised, so never claimed) row of the same key.
func mergeTakesIncoming(existing, incoming *outbox.Row) bool {
	switch {
	case existing.Status.Terminal():
		return false
	case incoming.Status.Terminal():
		return true
	case existing.Status == outbox.StatusClaimed:
		return false
	case incoming.Attempt != existing.Attempt:
		return incoming.Attempt > existing.Attempt
	default:
		return incoming.VisibleAfter.After(existing.VisibleAfter)
	}
}
