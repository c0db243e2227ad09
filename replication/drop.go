package replication

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/transfer"
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
		// While this node is leaving (its view says so), every pass is a
		// drain pass: the sets need not be synced, only to hold the rows.
		// So a leave hands off from the moment it is announced, while the
		// dispatcher finishes its deliveries, not only once Drain is called.
		v := r.view.Load()
		leaving := v != nil && v.Leaving
		left, err := r.dropRound(ctx, leaving)
		if leaving {
			r.leave.record(left, r.mover.Stranded(), err)
		}
		if err != nil && ctx.Err() == nil {
			r.log.Info("dropping copies of shards no longer replicated here: incomplete; retrying", "err", err, "leaving", leaving)
		}
		interval := r.cfg.LeftoverInterval
		if leaving && left > 0 {
			interval = min(interval, 100*time.Millisecond)
		}
		if !sleep(ctx, interval, r.dropWake) {
			return nil
		}
	}
}

// Leftovers lists the shards holding rows here (pending or terminal) that
// this node is not a replica of: what the drop loop, or a drain, still has
// to hand to their replica sets.
func (r *Replicator) Leftovers(ctx context.Context) ([]uint32, error) {
	v := r.view.Load()
	foreign, err := r.cfg.Local.ForeignShards(ctx)
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
// them; it returns how many leftover shards remain (as last counted when
// a step fails, never a negative count). A shard is handed off only once
// every member of its set answers as a synced replica (the set holds its
// R copies); then, when every member's digest equals ours, the set holds
// exactly our rows and the copy is deleted without sending any (the
// common case: a replica that leaves a set, or a leaving node, whose
// copies the others hold already); otherwise each member is sent the rows
// it lacks first (dropSink). While this node is leaving (drain), every
// shard it holds is a leftover.
func (r *Replicator) dropRound(ctx context.Context, drain bool) (int, error) {
	v := r.view.Load()
	if v == nil {
		return 0, nil
	}
	left, err := r.Leftovers(ctx)
	if err != nil {
		return r.leave.lastLeft(), err
	}
	if drain {
		r.leave.setLeft(len(left))
	}
	// Marks whose release failed earlier are released first.
	if err := r.mover.RetryStranded(ctx); err != nil {
		return len(left), err
	}
	if err := r.confirmed.RetryStranded(ctx); err != nil {
		return len(left), err
	}
	if len(left) == 0 {
		return 0, nil
	}
	answers := r.setStates(ctx, v, left)
	mine, err := r.localDigests(ctx)
	if err != nil {
		return len(left), err
	}
	var same, differ []uint32
	waiting := 0
	for _, s := range left {
		set := v.set(s)
		synced, equal := len(set) > 0, true
		for _, m := range set {
			rep, answered := answers[m]
			st, _ := stateOf(rep, s)
			if !answered || !rep.Joined || !st.Replica || !st.Synced {
				synced = false
				break
			}
			if st.Rows != mine[s].Rows || st.Sum != mine[s].Sum {
				equal = false
			}
		}
		switch {
		case !synced:
			waiting++
		case equal:
			same = append(same, s)
		default:
			differ = append(differ, s)
		}
	}
	var errs []error
	if waiting > 0 {
		errs = append(errs, fmt.Errorf("%d shards wait for every member of their replica sets to answer as a synced copy", waiting))
	}
	deleted, sent := 0, 0
	if len(same) > 0 {
		st, err := r.confirmed.Move(ctx, r.leave.counting(drain, transfer.SinkFunc(heldAlready)), same)
		deleted += st.Deleted
		errs = append(errs, err)
	}
	if len(differ) > 0 {
		st, err := r.mover.Move(ctx, r.leave.counting(drain, dropSink{r: r, v: v}), differ)
		deleted, sent = deleted+st.Deleted, st.Rows
		errs = append(errs, err)
	}
	if deleted > 0 {
		r.m.dropped.Add(float64(deleted))
		r.log.Info("copies handed to their replica sets and dropped", "rows", deleted, "sent", sent,
			"shards_equal", len(same), "shards_sent", len(differ), "drain", drain)
	}
	err = errors.Join(errs...)
	rest, lerr := r.Leftovers(ctx)
	if lerr != nil {
		return len(left), errors.Join(err, lerr)
	}
	return len(rest), err
}

// heldAlready is the sink of a shard whose set holds exactly our copy
// (every member's digest equals ours): nothing needs sending, and the
// marked rows are deleted once it returns.
func heldAlready(_ context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
	return outbox.MergeResult{Skipped: len(rows)}, nil
}

// setStates asks every member of the sets of shards for its state of
// them (one States call per member, concurrently). A member that did not
// answer is absent.
func (r *Replicator) setStates(ctx context.Context, v *View, shards []uint32) map[string]StatesReply {
	byMember := map[string][]uint32{}
	for _, s := range shards {
		for _, m := range v.set(s) {
			byMember[m] = append(byMember[m], s)
		}
	}
	return r.askStates(ctx, v, byMember)
}

// Drain hands every row this node holds to the replica sets of their
// shards (this node is leaving: it is in no set) and deletes them once
// the sets' members confirmed holding them; the drop loop does the work
// from the moment the view says this node is leaving, and Drain waits for
// it. It returns nil when nothing is left, or when no other member can
// take the rows (this is the last node: they stay on disk; if a member
// failed less than Config.FailedPeerWait ago, View.PeerFailedAt, only once
// that wait has passed without it returning: LeaveStatus.Waiting says so
// meanwhile), or, when ctx ends first, an error naming how many shards
// still hold rows here.
// A leave never gives up on its own: a member it cannot reach (a
// partition) is retried until it answers or ctx ends; LeaveStatus says
// what is left and why meanwhile.
func (r *Replicator) Drain(ctx context.Context) error {
	r.leave.begin()
	wake(r.dropWake)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	waitLogged := false
	for {
		v := r.view.Load()
		left, err := r.Leftovers(ctx)
		if err == nil && v != nil && v.Leaving {
			// Counted here too, not only when a drop round ends: a round
			// handing off tens of thousands of rows runs for many seconds.
			r.leave.countLeft(len(left))
		}
		if err == nil && len(left) == 0 {
			if r.mover.Stranded() == 0 {
				r.leave.record(0, 0, nil)
				return nil
			}
		}
		if err == nil && v != nil && len(left) > 0 && !r.anyReplica(v) {
			// The last node, unless a member failed recently: one declared
			// dead by mistake (a stalled process, lost probes on a loaded
			// host) refutes it within memberlist's gossip-to-the-dead time
			// and takes the hand-off.
			until := v.PeerFailedAt.Add(r.cfg.FailedPeerWait)
			if v.PeerFailedAt.IsZero() || !r.cfg.Now().Before(until) {
				r.log.Warn("no other member replicates the shards this node holds rows of; they stay on disk", "shards", len(left))
				return nil
			}
			if !waitLogged {
				waitLogged = true
				r.log.Warn("no other member replicates the shards this node holds rows of, but a member failed recently: waiting for it to return before stopping as the last node",
					"shards", len(left), "peer_failed_at", v.PeerFailedAt, "until", until)
			}
			r.leave.waiting(fmt.Sprintf("no other member to hand off to: a member failed at %s; waiting until %s for it to return",
				v.PeerFailedAt.UTC().Format(time.RFC3339Nano), until.UTC().Format(time.RFC3339Nano)))
		} else {
			r.leave.waiting("")
		}
		select {
		case <-ctx.Done():
			n := r.leave.lastLeft()
			if err == nil {
				n = len(left)
			}
			return fmt.Errorf("drain: %d shards still hold rows here: %w", n, ctx.Err())
		case <-t.C:
		}
	}
}

// leaveProgress is what a leave has left to hand off, for LeaveStatus.
type leaveProgress struct {
	mu      sync.Mutex
	since   time.Time // when Drain was called (zero: not yet)
	left    int       // leftover shards at the last pass
	lastErr string    // the last pass's error ("" when it succeeded)
	at      time.Time // when the last pass ended
	strand  int       // rows left marked in transfer (transfer.Mover.Stranded)
	handed  int64     // rows confirmed held by their sets so far
	wait    string    // why Drain waits for a failed member ("" when it does not)
}

// counting wraps the sink of a drain pass so that every batch the sets
// acknowledged counts as progress at once (LeaveStatus.RowsHandedOff);
// other passes' sinks are returned as they are.
func (p *leaveProgress) counting(drain bool, sink transfer.Sink) transfer.Sink {
	if !drain {
		return sink
	}
	return transfer.SinkFunc(func(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
		res, err := sink.Merge(ctx, rows)
		if err == nil {
			p.mu.Lock()
			p.handed += int64(len(rows))
			p.at = time.Now()
			p.mu.Unlock()
		}
		return res, err
	})
}

func (p *leaveProgress) begin() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.since.IsZero() {
		p.since = time.Now()
	}
}

func (p *leaveProgress) record(left, stranded int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.left, p.strand, p.at, p.lastErr = left, stranded, time.Now(), ""
	if err != nil {
		p.lastErr = err.Error()
	}
}

// waiting records why Drain waits before it stops as the last node (""
// when it does not).
func (p *leaveProgress) waiting(why string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.wait = why
}

func (p *leaveProgress) setLeft(left int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.left, p.at = left, time.Now()
}

// countLeft records a count of leftover shards made between passes
// (At stays the last pass's end).
func (p *leaveProgress) countLeft(left int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.left = left
}

func (p *leaveProgress) lastLeft() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.left
}

// leaveStatus returns the leave's progress (nil when not leaving).
func (r *Replicator) leaveStatus(v *View) *api.LeaveStatus {
	if v == nil || !v.Leaving {
		return nil
	}
	p := &r.leave
	p.mu.Lock()
	defer p.mu.Unlock()
	return &api.LeaveStatus{Since: p.since, ShardsLeft: p.left, At: p.at, LastError: p.lastErr, StrandedRows: p.strand, RowsHandedOff: p.handed, Waiting: p.wait}
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

// dropSink is the transfer.Sink of a hand-off: it makes every member of
// each row's replica set hold the row (asking what it lacks, sending only
// that), and fails unless all of them did and all report themselves
// synced replicas of the shard.
type dropSink struct {
	r *Replicator
	v *View
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
	for _, i := range idx {
		if !rep.Synced[rows[i].Shard] {
			return outbox.MergeResult{}, fmt.Errorf("not a synced replica of shard %d (yet)", rows[i].Shard)
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
