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
	w, err := newCoordinatedWrite(r, v, rows)
	if err != nil {
		return nil, err
	}
	fctx, cancel := context.WithTimeout(ctx, r.cfg.WriteTimeout)
	defer cancel()
	local, err := w.appendEverywhere(ctx, fctx)
	if err != nil {
		r.m.writes.WithLabelValues("error").Inc()
		return nil, fmt.Errorf("store %d rows on %s: %w", len(rows), v.Self, err)
	}
	copies := w.createdCopies(local)
	w.copyDuplicates(ctx, fctx, local, copies)
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
			ErrInsufficientCopies, short, len(rows), need, copies[firstShort(copies, need)], w.firstErr())
	}
	r.m.writes.WithLabelValues("ok").Inc()
	return out, nil
}

// coordinatedWrite is one Write's fan-out: the rows, the backups each
// goes to (the other members of its shard's replica set) and which of
// them hold which row.
type coordinatedWrite struct {
	r    *Replicator
	v    *View
	rows []outbox.Row
	// backups[m] are the indexes in rows of the rows member m backs up;
	// members lists the backups in the order first met.
	backups map[string][]int
	members []string
	// acked[mi][j]: members[mi] holds its j-th row (backups[members[mi]][j]).
	acked [][]bool

	errMu     sync.Mutex
	backupErr error // the first backup failure, for the error message
}

// newCoordinatedWrite stamps each row's shard and groups the rows by
// backup. Every row's replica set must include this node: otherwise it
// returns an error wrapping ErrNotReplica naming the row and its shard.
func newCoordinatedWrite(r *Replicator, v *View, rows []outbox.Row) (*coordinatedWrite, error) {
	w := &coordinatedWrite{r: r, v: v, rows: rows, backups: map[string][]int{}}
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
			if _, ok := w.backups[m]; !ok {
				w.members = append(w.members, m)
			}
			w.backups[m] = append(w.backups[m], i)
		}
	}
	w.acked = make([][]bool, len(w.members))
	for mi, m := range w.members {
		w.acked[mi] = make([]bool, len(w.backups[m]))
	}
	return w, nil
}

// noteErr keeps member m's failure if it is the write's first.
func (w *coordinatedWrite) noteErr(m string, err error) {
	w.errMu.Lock()
	if w.backupErr == nil {
		w.backupErr = fmt.Errorf("%s: %w", m, err)
	}
	w.errMu.Unlock()
}

// firstErr is the first backup failure, nil when none failed.
func (w *coordinatedWrite) firstErr() error {
	w.errMu.Lock()
	defer w.errMu.Unlock()
	return w.backupErr
}

// appendEverywhere is the write's first phase: the local append and every
// backup's at once, each backup getting its rows as new pending rows
// (insert or ignore). A backup holds its rows once it answered an outcome
// per row; a backup that failed is noted, not fatal. It returns the local
// outcomes, or the local store's error once every backup call ended.
func (w *coordinatedWrite) appendEverywhere(ctx, fctx context.Context) ([]outbox.AppendOutcome, error) {
	var wg sync.WaitGroup
	for mi, m := range w.members {
		idx := w.backups[m]
		batch := make([]outbox.Row, len(idx))
		for j, i := range idx {
			batch[j] = w.rows[i]
			outbox.NewRow(&batch[j], batch[j].CreatedAt)
			batch[j].Shard = w.rows[i].Shard
		}
		wg.Go(func() {
			addr := w.v.Addrs[m]
			if addr == "" {
				w.noteErr(m, errors.New("no API address"))
				return
			}
			outs, err := w.r.appends.append(fctx, addr, batch)
			if err == nil && len(outs) != len(batch) {
				err = fmt.Errorf("answered %d outcomes for %d rows", len(outs), len(batch))
			}
			if err != nil {
				w.r.log.Debug("append to backup failed", "member", m, "rows", len(batch), "err", err)
				w.noteErr(m, err)
				return
			}
			for j := range outs {
				w.acked[mi][j] = true
			}
		})
	}
	local, err := w.r.cfg.Local.Append(ctx, w.rows)
	wg.Wait()
	return local, err
}

// createdCopies counts each row's durable copies after the first phase:
// one here, plus, for a row created here, one per backup that holds it.
// A duplicate's backups count only once the second phase copied our
// state to them (copyDuplicates).
func (w *coordinatedWrite) createdCopies(local []outbox.AppendOutcome) []int {
	copies := make([]int, len(w.rows))
	for i := range local {
		copies[i] = 1
	}
	for mi, m := range w.members {
		for j, i := range w.backups[m] {
			if w.acked[mi][j] && local[i] == outbox.AppendCreated {
				copies[i]++
			}
		}
	}
	return copies
}

// copyDuplicates is the write's second phase: every backup of a row that
// already existed here gets our current copy by Merge (the first phase
// may have created a new pending row there), and each backup that merged
// it counts a copy in copies. A duplicate that expired here since the
// append has nothing to copy and counts no backup.
func (w *coordinatedWrite) copyDuplicates(ctx, fctx context.Context, local []outbox.AppendOutcome, copies []int) {
	var dups []int
	for i, o := range local {
		if o == outbox.AppendDuplicate {
			dups = append(dups, i)
		}
	}
	if len(dups) == 0 {
		return
	}
	for mi, m := range w.members {
		for j, i := range w.backups[m] {
			if local[i] == outbox.AppendDuplicate {
				w.acked[mi][j] = false // counted only once phase 2 copied our state
			}
		}
	}
	cur := map[int]outbox.Row{}
	for _, i := range dups {
		row, err := w.r.cfg.Local.Get(ctx, w.rows[i].DispatchKey)
		if err != nil {
			// Expired between the append and now: nothing to copy.
			continue
		}
		cur[i] = row
	}
	var wg sync.WaitGroup
	for mi, m := range w.members {
		var batch []outbox.Row
		var idx []int
		for _, i := range w.backups[m] {
			if row, ok := cur[i]; ok {
				batch = append(batch, row)
				idx = append(idx, i)
			}
		}
		if len(batch) == 0 {
			continue
		}
		wg.Go(func() {
			addr := w.v.Addrs[m]
			if addr == "" {
				return
			}
			if _, err := w.r.cfg.Peers.Merge(fctx, addr, batch); err != nil {
				w.r.log.Debug("copy of duplicate rows to backup failed", "member", m, "rows", len(batch), "err", err)
				w.noteErr(m, err)
				return
			}
			for _, i := range idx {
				w.acked[mi][slices.Index(w.backups[m], i)] = true
			}
		})
	}
	wg.Wait()
	for mi, m := range w.members {
		for j, i := range w.backups[m] {
			if local[i] == outbox.AppendDuplicate && w.acked[mi][j] {
				if _, ok := cur[i]; ok {
					copies[i]++
				}
			}
		}
	}
}

func firstShort(copies []int, need int) int {
	for i, c := range copies {
		if c < need {
			return i
		}
	}
	return 0
}
