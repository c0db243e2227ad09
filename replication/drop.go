package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fairshard/fairshard/outbox"
)

// Dropping copies. A node holding rows of a shard it is not a replica of
// (it left the set on a rebalance, it is draining, or it was given rows
// while views differed) deletes them only once the shard's current set
// holds them: every batch is read with transfer marks (transfer.Mover: the
// rows are not claimable meanwhile, and any change clears the mark), each
// member of the set is asked which of the batch's key/versions it lacks
// (Missing) and sent those, and only then are the rows still marked
// deleted. Claimed rows finish here first (a marking read skips them);
// their settles reach the set by the state shipping.
//
// On a rebalance a copy is dropped only when every member of the new set
// reports itself a synced replica (the set holds R synced copies, or as
// many as there are members); while a member syncs, the old copy stays.
// On a drain (Drain) the node is leaving: it only confirms that the set's
// members hold its rows (sending what they lack) and then deletes them.

func (r *Replicator) dropLoop(ctx context.Context) error {
	for {
		if !r.draining.Load() {
			if _, err := r.dropRound(ctx, false); err != nil && ctx.Err() == nil {
				r.log.Info("dropping copies of shards no longer replicated here: incomplete; retrying", "err", err)
			}
		}
		if !sleep(ctx, r.cfg.LeftoverInterval, r.dropWake) {
			return nil
		}
	}
}

// Leftovers lists the shards holding rows here (pending or terminal) that
// this node is not a replica of: what the drop loop, or a drain, still has
// to hand to their replica sets.
func (r *Replicator) Leftovers(ctx context.Context) ([]uint32, error) {
	v := r.view.Load()
	foreign, err := r.cfg.Store.ForeignShards(ctx)
	if err != nil {
		return nil, fmt.Errorf("list shards outside the claim scope: %w", err)
	}
	out := foreign[:0]
	for _, s := range foreign {
		if v == nil || v.Leaving || !v.inSet(v.Self, s) {
			out = append(out, s)
		}
	}
	return out, nil
}

// dropRound hands the rows of leftover shards to their sets and deletes
// them; it returns how many leftover shards remain.
func (r *Replicator) dropRound(ctx context.Context, drain bool) (int, error) {
	v := r.view.Load()
	if v == nil {
		return 0, nil
	}
	// Marks whose release failed earlier are released first.
	if err := r.mover.RetryStranded(ctx); err != nil {
		return -1, err
	}
	left, err := r.Leftovers(ctx)
	if err != nil {
		return -1, err
	}
	if len(left) == 0 {
		return 0, nil
	}
	var ready []uint32
	if drain {
		for _, s := range left {
			if len(v.set(s)) > 0 {
				ready = append(ready, s)
			}
		}
	} else {
		ready = r.syncedSets(ctx, v, left)
	}
	if len(ready) == 0 {
		return len(left), nil
	}
	st, err := r.mover.Move(ctx, dropSink{r: r, v: v, drain: drain}, ready)
	if st.Deleted > 0 {
		r.m.dropped.Add(float64(st.Deleted))
		r.log.Info("copies handed to their replica sets and dropped", "rows", st.Deleted, "sent", st.Rows, "shards", len(ready), "drain", drain)
	}
	rest, lerr := r.Leftovers(ctx)
	if lerr != nil {
		return -1, errors.Join(err, lerr)
	}
	return len(rest), err
}

// syncedSets returns the shards of left whose every replica reports
// itself synced now.
func (r *Replicator) syncedSets(ctx context.Context, v *View, left []uint32) []uint32 {
	byMember := map[string][]uint32{}
	for _, s := range left {
		for _, m := range v.set(s) {
			byMember[m] = append(byMember[m], s)
		}
	}
	var members []string
	for m := range byMember {
		members = append(members, m)
	}
	answers := map[string]StatesReply{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, m := range members {
		addr := v.Addrs[m]
		if addr == "" {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
			defer cancel()
			rep, err := r.cfg.Peers.States(cctx, addr, byMember[m])
			if err != nil {
				return
			}
			mu.Lock()
			answers[m] = rep
			mu.Unlock()
		})
	}
	wg.Wait()
	var ready []uint32
	for _, s := range left {
		set := v.set(s)
		ok := len(set) > 0
		for _, m := range set {
			rep, answered := answers[m]
			st, _ := stateOf(rep, s)
			if !answered || !rep.Joined || !st.Replica || !st.Synced {
				ok = false
				break
			}
		}
		if ok {
			ready = append(ready, s)
		}
	}
	return ready
}

// Drain hands every row this node holds to the replica sets of their
// shards (this node is leaving: it is in no set) and deletes them once
// the sets' members confirmed holding them. It returns when nothing is
// left, or at once when no other member can take the rows (this is the
// last node: they stay on disk), or when ctx ends (an error naming how
// many shards still hold rows).
func (r *Replicator) Drain(ctx context.Context) error {
	r.draining.Store(true)
	defer r.draining.Store(false)
	for {
		left, err := r.dropRound(ctx, true)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("drain pass incomplete; retrying", "err", err)
		}
		if left == 0 {
			return nil
		}
		if v := r.view.Load(); v != nil && left > 0 && !r.anyReplica(v) {
			r.log.Warn("no other member replicates the shards this node holds rows of; they stay on disk", "shards", left)
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drain: %d shards still hold rows here: %w", left, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// anyReplica reports whether some shard has a replica other than this
// node.
func (r *Replicator) anyReplica(v *View) bool {
	for _, set := range v.Sets {
		for _, m := range set {
			if m != v.Self {
				return true
			}
		}
	}
	return false
}

// dropSink is the transfer.Sink of a drop: it makes every member of each
// row's replica set hold the row (asking what it lacks, sending only
// that), and fails unless all of them did (and, outside a drain, all
// report themselves synced replicas of the shard).
type dropSink struct {
	r     *Replicator
	v     *View
	drain bool
}

func (d dropSink) Merge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
	byMember := map[string][]int{}
	for i := range rows {
		set := d.v.set(rows[i].Shard)
		if len(set) == 0 {
			return outbox.MergeResult{}, fmt.Errorf("%w: shard %d", ErrNoReplica, rows[i].Shard)
		}
		for _, m := range set {
			if m != d.v.Self {
				byMember[m] = append(byMember[m], i)
			}
		}
	}
	var res outbox.MergeResult
	var mu sync.Mutex
	errs := make(chan error, len(byMember))
	var wg sync.WaitGroup
	for m, idx := range byMember {
		wg.Go(func() {
			r, err := d.sendTo(ctx, m, rows, idx)
			mu.Lock()
			res.Created += r.Created
			res.Updated += r.Updated
			res.Skipped += r.Skipped
			mu.Unlock()
			if err != nil {
				errs <- fmt.Errorf("%s: %w", m, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	var all []error
	for err := range errs {
		all = append(all, err)
	}
	return res, errors.Join(all...)
}

func (d dropSink) sendTo(ctx context.Context, member string, rows []outbox.Row, idx []int) (outbox.MergeResult, error) {
	addr := d.v.Addrs[member]
	if addr == "" {
		return outbox.MergeResult{}, errors.New("no API address")
	}
	kvs := make([]KeyVersion, len(idx))
	for j, i := range idx {
		kvs[j] = keyVersionOf(&rows[i])
	}
	cctx, cancel := context.WithTimeout(ctx, d.r.cfg.CallTimeout)
	defer cancel()
	rep, err := d.r.cfg.Peers.Missing(cctx, addr, kvs)
	if err != nil {
		return outbox.MergeResult{}, fmt.Errorf("ask which rows it lacks: %w", err)
	}
	if !d.drain {
		for _, i := range idx {
			if !rep.Synced[rows[i].Shard] {
				return outbox.MergeResult{}, fmt.Errorf("not a synced replica of shard %d (yet)", rows[i].Shard)
			}
		}
	}
	res := outbox.MergeResult{Skipped: len(idx) - len(rep.Need)}
	if len(rep.Need) == 0 {
		return res, nil
	}
	send := make([]outbox.Row, 0, len(rep.Need))
	for _, j := range rep.Need {
		if j < 0 || j >= len(idx) {
			return res, fmt.Errorf("answered index %d of %d", j, len(idx))
		}
		send = append(send, rows[idx[j]])
	}
	mr, err := d.r.cfg.Peers.Merge(cctx, addr, send)
	if err != nil {
		return res, fmt.Errorf("send %d rows it lacks: %w", len(send), err)
	}
	res.Created, res.Updated, res.Skipped = mr.Created, mr.Updated, res.Skipped+mr.Skipped
	return res, nil
}
