package boltstore

import (
	"bytes"
	"cmp"
	"container/heap"
	"context"
	"fmt"
	"time"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
	bolt "go.etcd.io/bbolt"
)

// validateRow checks what Append and Merge require of row i:
// outbox.ValidateForAppend (a dispatch_key, namespace and task_queue) plus
// the byte limits that keep every index key under bbolt's key limit.
func validateRow(i int, r *outbox.Row) error {
	if err := outbox.ValidateForAppend(i, r); err != nil {
		return err
	}
	switch {
	case len(r.DispatchKey) > MaxDispatchKeyBytes:
		return fmt.Errorf("%w: rows[%d].dispatch_key is %d bytes (max %d)", outbox.ErrInvalidRow, i, len(r.DispatchKey), MaxDispatchKeyBytes)
	case len(r.Namespace) > MaxNameBytes || len(r.TaskQueue) > MaxNameBytes:
		return fmt.Errorf("%w: rows[%d] (key %q): namespace or task_queue longer than %d bytes", outbox.ErrInvalidRow, i, r.DispatchKey, MaxNameBytes)
	}
	return nil
}

// prepared is a row validated, defaulted and encoded on the caller's
// goroutine, so the writer only does bbolt work.
type prepared struct {
	rk  []byte
	row outbox.Row
	enc []byte
}

// Append implements outbox.Store: insert-or-ignore on dispatch_key. Rows
// are validated, defaulted (outbox.NewRow at the store clock: pending,
// Attempt 1 if zero, CreatedAt now if zero, VisibleAfter = CreatedAt if
// zero, Version FirstVersion; Shard = shards.ShardOf) and encoded before
// they are queued; an invalid row fails
// the call with outbox.ErrInvalidRow and nothing is written. It returns
// after the group commit holding the batch has been fsync'd. A row whose key
// exists, live or tombstone (packed or not), on any shard, is
// AppendDuplicate.
func (s *Store) Append(ctx context.Context, rows []outbox.Row) ([]outbox.AppendOutcome, error) {
	now := s.now()
	prep := make([]prepared, len(rows))
	for i := range rows {
		r := rows[i]
		if err := validateRow(i, &r); err != nil {
			return nil, fmt.Errorf("boltstore: append: %w", err)
		}
		outbox.NewRow(&r, now)
		r.Shard = shards.ShardOf(r.DispatchKey, s.opts.ShardCount)
		prep[i] = prepared{rk: rowKey(r.DispatchKey), row: r, enc: encodeRow(nil, &r)}
	}
	outcomes := make([]outbox.AppendOutcome, len(rows))
	if len(rows) == 0 {
		return outcomes, s.checkOpen("append")
	}
	err := s.submit(ctx, "append", len(rows), func(w *wtx) error {
		for i := range prep {
			if w.b.rows.Get(prep[i].rk) != nil {
				outcomes[i] = outbox.AppendDuplicate
				continue
			}
			if packed, err := w.isBundled(prep[i].row.Shard, prep[i].row.DispatchKey); err != nil {
				return err
			} else if packed {
				outcomes[i] = outbox.AppendDuplicate
				continue
			}
			if err := w.write(prep[i].rk, nil, false, &prep[i].row, false, prep[i].enc); err != nil {
				return err
			}
			outcomes[i] = outbox.AppendCreated
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return outcomes, nil
}

// checkOpen returns ErrClosed after Close (for calls with nothing to do).
func (s *Store) checkOpen(what string) error {
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return fmt.Errorf("boltstore: %s: %w", what, outbox.ErrClosed)
	}
	return nil
}

// claimCand is a pending row found by a claim scan.
type claimCand struct {
	rk  []byte
	row outbox.Row
}

// scanRoute collects up to limit claimable rows of one route in (VisibleAfter,
// DispatchKey) order: a seek to the route's range of the pending index,
// reading until the first entry visible after now. Entries of non-owned
// shards and of excluded workflows are skipped (rows in transfer have no
// entry at all).
func scanRoute(w *wtx, route []byte, p *outbox.ClaimParams, owned *ownedSet, shardCount uint32, limit int, out []claimCand) ([]claimCand, error) {
	n := 0
	c := w.b.pending.Cursor()
	for k, _ := c.Seek(route); k != nil && bytes.HasPrefix(k, route) && n < limit; k, _ = c.Next() {
		tail := k[len(route):]
		if len(tail) < timeKeyLen {
			return out, fmt.Errorf("%w: pending index key %x", ErrCorrupt, k)
		}
		if decodeTimeKey(tail).After(p.Now) {
			break
		}
		dk := string(tail[timeKeyLen:])
		shard := shards.ShardOf(dk, shardCount)
		if !owned.has(shard) {
			continue
		}
		rk := rowKey(dk)
		row, _, ok, err := w.getRow(rk)
		if err != nil {
			return out, err
		}
		if !ok || row.Status != outbox.StatusPending {
			return out, fmt.Errorf("%w: pending index entry for %q without a pending row", ErrCorrupt, dk)
		}
		if _, held := p.ExcludeWorkflows[row.WorkflowID]; held {
			continue
		}
		out = append(out, claimCand{rk: rk, row: row})
		n++
	}
	return out, nil
}

// routeHead is one route's cursor in the unscoped claim's k-way merge,
// positioned on its next claimable entry (key copied; tail = time ‖ key).
type routeHead struct {
	c     *bolt.Cursor
	route []byte
	key   []byte
}

func (h *routeHead) tail() []byte { return h.key[len(h.route):] }

type routeHeap []*routeHead

func (h routeHeap) Len() int           { return len(h) }
func (h routeHeap) Less(i, j int) bool { return bytes.Compare(h[i].tail(), h[j].tail()) < 0 }
func (h routeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *routeHeap) Push(x any)        { *h = append(*h, x.(*routeHead)) }
func (h *routeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// advance moves h from cursor key k to the first entry that is in its route,
// visible at now and of an owned shard; false when the route has none left.
func (h *routeHead) advance(k []byte, now time.Time, owned *ownedSet, shardCount uint32) (bool, error) {
	for ; k != nil && bytes.HasPrefix(k, h.route); k, _ = h.c.Next() {
		tail := k[len(h.route):]
		if len(tail) < timeKeyLen {
			return false, fmt.Errorf("%w: pending index key %x", ErrCorrupt, k)
		}
		if decodeTimeKey(tail).After(now) {
			return false, nil
		}
		if owned.all || owned.has(shards.ShardOf(string(tail[timeKeyLen:]), shardCount)) {
			h.key = append(h.key[:0], k...)
			return true, nil
		}
	}
	return false, nil
}

// mergeRoutes is the unscoped claim: a k-way merge of every route's range
// of the pending index by (VisibleAfter, DispatchKey), which the index keys'
// tails encode, so only the rows taken (and held ones stepped over) are
// read. Cost: one seek per route holding pending rows, plus
// O(Limit · log routes).
func mergeRoutes(w *wtx, p *outbox.ClaimParams, owned *ownedSet, shardCount uint32) ([]claimCand, error) {
	var h routeHeap
	c := w.b.routes.Cursor()
	for r, _ := c.First(); r != nil; r, _ = c.Next() {
		head := &routeHead{c: w.b.pending.Cursor(), route: append([]byte(nil), r...)}
		k, _ := head.c.Seek(head.route)
		ok, err := head.advance(k, p.Now, owned, shardCount)
		if err != nil {
			return nil, err
		}
		if ok {
			h = append(h, head)
		}
	}
	heap.Init(&h)
	var out []claimCand
	for len(out) < p.Limit && h.Len() > 0 {
		head := h[0]
		dk := string(head.tail()[timeKeyLen:])
		rk := rowKey(dk)
		row, _, ok, err := w.getRow(rk)
		if err != nil {
			return nil, err
		}
		if !ok || row.Status != outbox.StatusPending {
			return nil, fmt.Errorf("%w: pending index entry for %q without a pending row", ErrCorrupt, dk)
		}
		if _, held := p.ExcludeWorkflows[row.WorkflowID]; !held {
			out = append(out, claimCand{rk: rk, row: row})
		}
		// Each head owns its cursor and nothing is written during the
		// merge, so the cursor still sits on head.key.
		k, _ := head.c.Next()
		more, err := head.advance(k, p.Now, owned, shardCount)
		if err != nil {
			return nil, err
		}
		if more {
			heap.Fix(&h, 0)
		} else {
			heap.Pop(&h)
		}
	}
	return out, nil
}

// Claim implements outbox.Store. Only rows of owned shards that are not in
// transfer are claimed. A scoped claim is one cursor seek into the route's
// range of the pending index; an unscoped claim merges the ranges of every
// route holding pending rows (see mergeRoutes). Rows of held workflows (ExcludeWorkflows)
// are skipped, not counted: a route whose visible head is held costs a scan
// of the held rows.
func (s *Store) Claim(ctx context.Context, p outbox.ClaimParams) ([]outbox.Row, error) {
	if p.Limit <= 0 {
		return nil, s.checkOpen("claim")
	}
	if p.Now.IsZero() {
		p.Now = s.now()
	}
	var out []outbox.Row
	err := s.submit(ctx, "claim", p.Limit, func(w *wtx) error {
		var err error
		out, err = s.claimTx(w, p)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// claimTx is one claim inside the writer's transaction w.
func (s *Store) claimTx(w *wtx, p outbox.ClaimParams) ([]outbox.Row, error) {
	if p.Limit <= 0 {
		return nil, nil
	}
	if p.Now.IsZero() {
		p.Now = s.now()
	}
	owned := s.owned.Load()
	var cands []claimCand
	var err error
	if p.Scope != nil {
		cands, err = scanRoute(w, routeKey(p.Scope.Namespace, p.Scope.TaskQueue), &p, owned, s.opts.ShardCount, p.Limit, nil)
		if err != nil {
			return nil, err
		}
	} else if cands, err = mergeRoutes(w, &p, owned, s.opts.ShardCount); err != nil {
		return nil, err
	}
	out := make([]outbox.Row, 0, len(cands))
	for i := range cands {
		old := cands[i].row
		nw := old
		outbox.ApplyClaim(&nw, p.Now)
		if err := w.write(cands[i].rk, &old, false, &nw, false, nil); err != nil {
			return nil, err
		}
		out = append(out, nw)
	}
	return out, nil
}

// ClaimBatch runs every claim run makes in ONE group commit (one fsync),
// which is what a planner sweep over many routes needs: without it each
// scoped claim is its own commit. It implements backpressure.BatchClaimer:
// the claims take effect together when ClaimBatch returns nil and not at all
// when it returns an error; run may be called more than once (when another
// operation of the same group commit fails, the commit is retried without
// it), so run must start from scratch each time.
func (s *Store) ClaimBatch(ctx context.Context, run func(claim func(outbox.ClaimParams) ([]outbox.Row, error)) error) error {
	return s.submit(ctx, "claim batch", 256, func(w *wtx) error {
		return run(func(p outbox.ClaimParams) ([]outbox.Row, error) { return s.claimTx(w, p) })
	})
}

// RearmStale implements outbox.Store: it walks the claimed index (ordered by
// ClaimedAt) from the oldest claim, so it costs the rows it re-arms plus the
// excluded ones it steps over. It sees every shard, owned or not: a re-armed
// row of a non-owned shard becomes transferable.
func (s *Store) RearmStale(ctx context.Context, p outbox.RearmParams) ([]outbox.Row, error) {
	if p.Limit <= 0 {
		return nil, s.checkOpen("rearm stale claims")
	}
	var out []outbox.Row
	err := s.submit(ctx, "rearm stale claims", p.Limit, func(w *wtx) error {
		out = out[:0]
		var rks [][]byte
		c := w.b.claimed.Cursor()
		for k, _ := c.First(); k != nil && len(rks) < p.Limit; k, _ = c.Next() {
			if len(k) < timeKeyLen {
				return fmt.Errorf("%w: claimed index key %x", ErrCorrupt, k)
			}
			if !decodeTimeKey(k).Before(p.OlderThan) {
				break
			}
			dk := string(k[timeKeyLen:])
			if _, skip := p.ExcludeKeys[dk]; skip {
				continue
			}
			rks = append(rks, rowKey(dk))
		}
		for _, rk := range rks {
			old, _, ok, err := w.getRow(rk)
			if err != nil {
				return err
			}
			if !ok || old.Status != outbox.StatusClaimed {
				return fmt.Errorf("%w: claimed index entry for %q without a claimed row", ErrCorrupt, rk)
			}
			nw := old
			outbox.ApplyRearm(&nw, p.VisibleAfter)
			if err := w.write(rk, &old, false, &nw, false, nil); err != nil {
				return err
			}
			out = append(out, nw)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// RearmAllClaimed re-arms every claimed row (any shard) to pending with the
// given VisibleAfter, in transactions of at most 1000 rows. A node calls it
// at start-up: claims held when it stopped were abandoned. It returns the
// number of rows re-armed.
func (s *Store) RearmAllClaimed(ctx context.Context, visibleAfter time.Time) (int, error) {
	far := time.Unix(1<<62, 0)
	total := 0
	for {
		rows, err := s.RearmStale(ctx, outbox.RearmParams{OlderThan: far, VisibleAfter: visibleAfter, Limit: GCBatchRows})
		total += len(rows)
		if err != nil || len(rows) < GCBatchRows {
			return total, err
		}
	}
}

// settle applies change to the row of dispatchKey if it exists; change
// returns false to leave the row as it is (the contract's no-op cases). A
// changed row loses any transfer mark: its state changed, so the handoff
// must resend it (CompleteTransfer deletes only rows still marked). It
// reports whether the row changed.
func (s *Store) settle(ctx context.Context, what, dispatchKey string, change func(r *outbox.Row) bool) (bool, error) {
	rk := rowKey(dispatchKey)
	var changed bool
	err := s.submit(ctx, what, 1, func(w *wtx) error {
		changed = false
		old, xfer, ok, err := w.getRow(rk)
		if err != nil || !ok {
			return err
		}
		nw := old
		if !change(&nw) {
			return nil
		}
		changed = true
		return w.write(rk, &old, xfer, &nw, false, nil)
	})
	return changed, err
}

// Complete implements outbox.Store with outbox.ApplyComplete: the row
// claimed under p.Claim (or pending in its generation) becomes done,
// FinishedAt = p.Now (the store clock if zero). Anything else is a no-op.
func (s *Store) Complete(ctx context.Context, p outbox.CompleteParams) error {
	now := cmp.Or(p.Now, s.now())
	return s.settleRecording(ctx, "complete "+p.DispatchKey, p.DispatchKey, outbox.AttemptDone, p.StatusCode, "", now, func(r *outbox.Row) bool {
		return outbox.ApplyComplete(r, p, now)
	})
}

// Retry implements outbox.Store with outbox.ApplyRetry: the row claimed
// under p.Claim goes back to pending with Attempt = p.NextAttempt
// (Attempt+1 if zero), VisibleAfter and LastError. Anything else is a
// no-op.
func (s *Store) Retry(ctx context.Context, p outbox.RetryParams) error {
	if p.Unattempted {
		_, err := s.settle(ctx, "retry "+p.DispatchKey, p.DispatchKey, func(r *outbox.Row) bool { return outbox.ApplyRetry(r, p) })
		return err
	}
	now := cmp.Or(p.Now, s.now())
	return s.settleRecording(ctx, "retry "+p.DispatchKey, p.DispatchKey, outbox.AttemptRetry, p.StatusCode, p.LastError, now, func(r *outbox.Row) bool {
		return outbox.ApplyRetry(r, p)
	})
}

// Fail implements outbox.Store with outbox.ApplyFail: the row claimed
// under p.Claim becomes failed (dead letter), LastError set, FinishedAt =
// p.Now (the store clock if zero). Anything else is a no-op.
func (s *Store) Fail(ctx context.Context, p outbox.FailParams) error {
	now := cmp.Or(p.Now, s.now())
	return s.settleRecording(ctx, "fail "+p.DispatchKey, p.DispatchKey, outbox.AttemptFailed, p.StatusCode, p.LastError, now, func(r *outbox.Row) bool {
		return outbox.ApplyFail(r, p, now)
	})
}

// Cancel implements outbox.Store with outbox.ApplyCancel: a pending row
// (in transfer or not) becomes cancelled, FinishedAt = p.Now (the store
// clock if zero), LastError = p.Reason when set. It reports whether it did.
func (s *Store) Cancel(ctx context.Context, p outbox.CancelParams) (bool, error) {
	now := cmp.Or(p.Now, s.now())
	return s.settle(ctx, "cancel "+p.DispatchKey, p.DispatchKey, func(r *outbox.Row) bool {
		return outbox.ApplyCancel(r, p, now)
	})
}
