package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fairshard/fairshard/outbox"
)

// Route stores an appended batch where its rows belong and returns one
// Outcome per row, in order, once every row is durable on at least the
// write-copies minimum of members of its replica set (DESIGN.md
// "Replicated shards", write path). Each row goes to its shard's primary,
// which coordinates the write (Write); rows whose primary cannot be
// reached (or refuses, not being a replica by its view) go to the next
// replica of the set, and so on; never to a member outside the set. Rows
// coordinated here are written locally. Rows carry instants stamped by
// this node's clock; forwarded rows travel as delays (see Peers.Forward).
//
// Errors (nothing is reported stored; retrying the same batch is safe,
// appends being idempotent by dispatch_key): one wrapping
// ErrInsufficientCopies when a coordinator could not make a row durable
// on enough replicas, ErrNoReplica when a row's shard has no live replica
// or none of them answered, or the local store's error.
//
// Views differ for a moment after a membership change (a replica that
// just left the set by its own view answers ErrNotReplica, a leaving one
// refuses rows, a dead one is not declared dead yet): when every replica
// of some row failed, Route waits for the next view and tries again, for
// up to routeRetry.
func (r *Replicator) Route(ctx context.Context, rows []outbox.Row) ([]Outcome, error) {
	deadline := time.Now().Add(routeRetry)
	for {
		v := r.view.Load()
		if v == nil {
			return nil, fmt.Errorf("%w: this node has not joined the cluster yet", ErrNoReplica)
		}
		out, err := r.route(ctx, v, rows)
		if err == nil || !errors.Is(err, ErrNoReplica) || ctx.Err() != nil || time.Now().After(deadline) {
			return out, err
		}
		// Wait for a new view (at most a quarter second), then retry.
		for i := 0; i < 5 && r.view.Load() == v; i++ {
			select {
			case <-ctx.Done():
				return nil, err
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
}

// routeRetry bounds how long Route retries rows none of whose replicas
// took them, waiting for the views to agree.
const routeRetry = 3 * time.Second

// route is one placement attempt of Route in view v.
func (r *Replicator) route(ctx context.Context, v *View, rows []outbox.Row) ([]Outcome, error) {
	out := make([]Outcome, len(rows))
	attempt := make([]int, len(rows))
	todo := make([]int, len(rows))
	for i := range rows {
		rows[i].Shard = r.shardOf(rows[i].DispatchKey)
		todo[i] = i
	}
	var lastErr error
	for len(todo) > 0 {
		// Group the rows still to store by the replica to try next.
		groups := map[string][]int{}
		var order []string
		for _, i := range todo {
			set := v.set(rows[i].Shard)
			if attempt[i] >= len(set) {
				if lastErr == nil {
					lastErr = fmt.Errorf("shard %d has no active member", rows[i].Shard)
				}
				return nil, fmt.Errorf("%w: row %q (shard %d): no replica of %v answered: %w",
					ErrNoReplica, rows[i].DispatchKey, rows[i].Shard, set, lastErr)
			}
			m := set[attempt[i]]
			if _, ok := groups[m]; !ok {
				order = append(order, m)
			}
			groups[m] = append(groups[m], i)
		}
		type result struct {
			member string
			idx    []int
			out    []Outcome
			err    error
		}
		results := make([]result, len(order))
		var wg sync.WaitGroup
		for gi, m := range order {
			idx := groups[m]
			batch := make([]outbox.Row, len(idx))
			for j, i := range idx {
				batch[j] = rows[i]
			}
			wg.Go(func() {
				res := result{member: m, idx: idx}
				if m == v.Self {
					res.out, res.err = r.Write(ctx, batch)
				} else if addr, ok := v.Addrs[m]; !ok || addr == "" {
					res.err = fmt.Errorf("member %s has no API address", m)
				} else {
					cctx, cancel := context.WithTimeout(ctx, r.cfg.WriteTimeout+5*time.Second)
					res.out, res.err = r.cfg.Peers.Forward(cctx, addr, batch)
					cancel()
					if res.err == nil && len(res.out) != len(batch) {
						res.err = fmt.Errorf("member %s answered %d outcomes for %d rows", m, len(res.out), len(batch))
					}
				}
				results[gi] = res
			})
		}
		wg.Wait()
		todo = todo[:0]
		for _, res := range results {
			switch {
			case res.err == nil:
				for j, i := range res.idx {
					out[i] = res.out[j]
				}
			case errors.Is(res.err, ErrInsufficientCopies):
				return nil, res.err
			case res.member == v.Self && !errors.Is(res.err, ErrNotReplica):
				return nil, res.err // our own store failed
			case ctx.Err() != nil:
				return nil, fmt.Errorf("append: %w", ctx.Err())
			default:
				if res.member != v.Self {
					r.m.forwardFailures.Inc()
					r.log.Warn("forward to replica failed; trying the next replica of the set",
						"member", res.member, "rows", len(res.idx), "err", res.err)
				}
				lastErr = fmt.Errorf("%s: %w", res.member, res.err)
				for _, i := range res.idx {
					attempt[i]++
					todo = append(todo, i)
				}
			}
		}
		slices.Sort(todo)
	}
	return out, nil
}

// Write coordinates the write of rows whose replica sets include this
// node (a forwarded append, or rows Route keeps here): it stores them
// locally and on every other member of each row's set at once (an insert
// or ignore by dispatch_key, like Local.Append), then sends the current
// copy of rows that already existed here (duplicates) to those members
// with Merge, so no backup keeps a newer append of an older or finished
// row. A row counts a copy per member that made it durable; Write returns
// the outcomes once the fan-out ended, or an error wrapping
// ErrInsufficientCopies when some row has fewer copies than the
// write-copies minimum (the rows stay where they were stored: a retry
// finds them as duplicates and copies them again), ErrNotReplica when a
// row's set does not include this node, or the local store's error.
// Rows must carry their instants (CreatedAt, VisibleAfter).
func (r *Replicator) Write(ctx context.Context, rows []outbox.Row) ([]Outcome, error) {
	v := r.view.Load()
	if v == nil || v.Leaving {
		return nil, fmt.Errorf("%w: this node is not serving a membership view", ErrNotReplica)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	r.mu.Lock()
	need := r.writeCopiesLocked(v)
	r.mu.Unlock()
	backups := map[string][]int{}
	var members []string
	for i := range rows {
		rows[i].Shard = r.shardOf(rows[i].DispatchKey)
		set := v.set(rows[i].Shard)
		if !slices.Contains(set, v.Self) {
			return nil, fmt.Errorf("%w: row %q: shard %d's replica set is %v", ErrNotReplica, rows[i].DispatchKey, rows[i].Shard, set)
		}
		for _, m := range set {
			if m == v.Self {
				continue
			}
			if _, ok := backups[m]; !ok {
				members = append(members, m)
			}
			backups[m] = append(backups[m], i)
		}
	}
	fctx, cancel := context.WithTimeout(ctx, r.cfg.WriteTimeout)
	defer cancel()
	// Phase 1: the local append and every backup's at once.
	acked := make([][]bool, len(members)) // acked[m][j]: member m holds its j-th row
	var errMu sync.Mutex
	var backupErr error // the first backup failure, for the error message
	noteErr := func(m string, err error) {
		errMu.Lock()
		if backupErr == nil {
			backupErr = fmt.Errorf("%s: %w", m, err)
		}
		errMu.Unlock()
	}
	var wg sync.WaitGroup
	for mi, m := range members {
		idx := backups[m]
		acked[mi] = make([]bool, len(idx))
		batch := make([]outbox.Row, len(idx))
		for j, i := range idx {
			batch[j] = rows[i]
			outbox.NewRow(&batch[j], batch[j].CreatedAt)
			batch[j].Shard = rows[i].Shard
		}
		wg.Go(func() {
			addr := v.Addrs[m]
			if addr == "" {
				noteErr(m, errors.New("no API address"))
				return
			}
			outs, err := r.appends.append(fctx, addr, batch)
			if err == nil && len(outs) != len(batch) {
				err = fmt.Errorf("answered %d outcomes for %d rows", len(outs), len(batch))
			}
			if err != nil {
				r.log.Debug("append to backup failed", "member", m, "rows", len(batch), "err", err)
				noteErr(m, err)
				return
			}
			for j := range outs {
				acked[mi][j] = true
			}
		})
	}
	local, err := r.cfg.Local.Append(ctx, rows)
	wg.Wait()
	if err != nil {
		r.m.writes.WithLabelValues("error").Inc()
		return nil, fmt.Errorf("store %d rows on %s: %w", len(rows), v.Self, err)
	}
	copies := make([]int, len(rows))
	var dups []int
	for i, o := range local {
		copies[i] = 1
		if o == outbox.AppendDuplicate {
			dups = append(dups, i)
		}
	}
	for mi := range members {
		for j, i := range backups[members[mi]] {
			if acked[mi][j] && local[i] == outbox.AppendCreated {
				copies[i]++
			}
		}
	}
	// Phase 2: duplicates: make sure every backup holds our copy's state
	// (the backup may have created a new pending row in phase 1).
	if len(dups) > 0 {
		for mi, m := range members {
			for j, i := range backups[m] {
				if local[i] == outbox.AppendDuplicate {
					acked[mi][j] = false // counted only once phase 2 copied our state
				}
			}
		}
		cur := map[int]outbox.Row{}
		for _, i := range dups {
			row, err := r.cfg.Local.Get(ctx, rows[i].DispatchKey)
			if err != nil {
				// Expired between the append and now: nothing to copy.
				continue
			}
			cur[i] = row
		}
		for mi, m := range members {
			var batch []outbox.Row
			var idx []int
			for _, i := range backups[m] {
				if row, ok := cur[i]; ok {
					batch = append(batch, row)
					idx = append(idx, i)
				}
			}
			if len(batch) == 0 {
				continue
			}
			wg.Go(func() {
				addr := v.Addrs[m]
				if addr == "" {
					return
				}
				if _, err := r.cfg.Peers.Merge(fctx, addr, batch); err != nil {
					r.log.Debug("copy of duplicate rows to backup failed", "member", m, "rows", len(batch), "err", err)
					noteErr(m, err)
					return
				}
				for _, i := range idx {
					acked[mi][slices.Index(backups[m], i)] = true
				}
			})
		}
		wg.Wait()
		for mi, m := range members {
			for j, i := range backups[m] {
				if local[i] == outbox.AppendDuplicate && acked[mi][j] {
					if _, ok := cur[i]; ok {
						copies[i]++
					}
				}
			}
		}
	}
	if r.cfg.Wake != nil {
		r.cfg.Wake()
	}
	out := make([]Outcome, len(rows))
	short := 0
	for i := range rows {
		out[i] = Outcome{Status: local[i], Node: v.Self, Copies: copies[i]}
		if copies[i] < need {
			short++
		}
	}
	if short > 0 {
		r.m.writes.WithLabelValues("insufficient_copies").Inc()
		return out, fmt.Errorf("%w: %d of %d rows are durable on fewer than %d replicas (copies of the first: %d; %v)",
			ErrInsufficientCopies, short, len(rows), need, copies[firstShort(copies, need)], backupErr)
	}
	r.m.writes.WithLabelValues("ok").Inc()
	return out, nil
}

func firstShort(copies []int, need int) int {
	for i, c := range copies {
		if c < need {
			return i
		}
	}
	return 0
}
