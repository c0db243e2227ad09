package replication

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairshard/fairshard/lifecycle"
	"github.com/fairshard/fairshard/shards"
	"github.com/fairshard/fairshard/transfer"
)

// Replicator keeps this node's share of every replica set: it coordinates
// appends (Write, Route), ships state changes to the backups (Changed),
// syncs the shards it joins, repairs by digest, drops copies it no longer
// replicates and drains on a graceful leave. Build with New, feed views
// with Apply, run the loops with Run. Safe for concurrent use.
type Replicator struct {
	cfg   Config
	log   *slog.Logger
	m     *metrics
	mover *transfer.Mover
	// confirmed hands off shards whose sets hold our copy already (no row
	// is sent: drop.go), in larger local batches than mover's.
	confirmed *transfer.Mover

	view atomic.Pointer[View]

	// mu guards the three states below and scope and peak.
	mu sync.Mutex
	// syncs is what shard sync knows of the copies (sync.go).
	syncs syncState
	// repairs is what the digest polls learned (repair.go).
	repairs repairState
	// handovers are the shards waiting before this node claims them
	// (handover.go).
	handovers handoverState
	// scope is the claim scope last handed to Config.Scope.
	scope []uint32
	// peak is the most live members seen in one view (write-copies auto).
	peak int

	ship *shipper
	// appends merges the backup appends of concurrent Writes (coalesce.go).
	appends *appendBatcher

	syncWake, pollWake, dropWake, handoverWake chan struct{}
	// leave is a leaving node's hand-off progress (drop.go).
	leave leaveProgress
}

type syncKey struct {
	shard uint32
	peer  string
}

type peerState struct {
	at     time.Time
	states map[uint32]ShardState
	joined bool
}

// confirmedBatchFactor scales Limits.MaxRows for hand-offs that send
// nothing (replicator.confirmed).
const confirmedBatchFactor = 10

// New returns a Replicator; it does nothing until Apply and Run. It fails
// on a config missing a required field or metrics the Registerer refuses.
func New(cfg Config) (*Replicator, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("replication: register metrics: %w", err)
	}
	r := &Replicator{
		cfg: cfg, log: cfg.Logger.With(slog.String("component", "replication")), m: m,
		syncs: syncState{synced: make([]bool, cfg.ShardCount), peerStates: map[string]peerState{},
			tokens: map[syncKey][]byte{}},
		repairs: repairState{mismatch: map[syncKey]mismatchState{}, fullRepair: map[string]bool{},
			urgentRetry: map[syncKey]urgentRetry{}},
		handovers: handoverState{since: map[uint32]time.Time{}, failoverUntil: map[uint32]time.Time{},
			pullRetry: map[uint32]pullBackoff{}},
		syncWake:     make(chan struct{}, 1),
		pollWake:     make(chan struct{}, 1),
		dropWake:     make(chan struct{}, 1),
		handoverWake: make(chan struct{}, 1),
	}
	r.ship = newShipper(r)
	r.appends = newAppendBatcher(r.cfg.Peers.Append, r.cfg.WriteTimeout)
	r.mover, err = transfer.NewMover(cfg.Local, transfer.MoverConfig{Limits: cfg.Limits, Logger: cfg.Logger, Registerer: cfg.Registerer})
	if err != nil {
		return nil, fmt.Errorf("replication: %w", err)
	}
	// Its batches are only marked and deleted here, never sent: ten times
	// the rows of a sent batch, under the same byte budget.
	local := cfg.Limits
	local.MaxRows *= confirmedBatchFactor
	if r.confirmed, err = transfer.NewMover(cfg.Local, transfer.MoverConfig{Limits: local, Logger: cfg.Logger}); err != nil {
		return nil, fmt.Errorf("replication: %w", err)
	}
	return r, nil
}

// Run runs the loops (state shipping, shard sync, digest polls and
// repair, dropping copies no longer replicated) until ctx ends; they stop
// in reverse order. It returns nil when ctx ends.
func (r *Replicator) Run(ctx context.Context) error {
	g := lifecycle.NewGroup(r.log)
	for _, l := range []lifecycle.Loop{
		{Name: "ship", Run: r.ship.run}, // stops last: flushes what it can
		{Name: "sync", Run: r.syncLoop},
		{Name: "poll", Run: r.pollLoop},
		{Name: "drop", Run: r.dropLoop},
		{Name: "handover", Run: r.handoverLoop},
	} {
		if err := g.Go(nil, l); err != nil {
			return err
		}
	}
	<-ctx.Done()
	err := g.Stop(context.Background())
	r.appends.close() // cancels the merged backup appends in flight
	return err
}

// Apply makes v the current view. Shards this node joins the replica set
// of start syncing (they count as copies, and a primary claims from them,
// only once synced); shards it stays in keep their state; shards it left
// are dropped once their new set holds synced copies. With no other live
// member every shard it replicates is synced at once (there is nothing
// to sync from). Views older than the current one are ignored.
func (r *Replicator) Apply(v *View) {
	r.mu.Lock()
	prev := r.view.Load()
	if prev != nil && v.Version < prev.Version {
		r.mu.Unlock()
		return
	}
	alone := len(v.peers()) == 0
	// A node alone after it had peers (cut off by a partition, or the
	// survivor of failures) holds every shard as synced, yet the others
	// may have changed rows meanwhile. When it sees peers again it counts
	// as a copy, serves as a sync source and claims only after syncing
	// again (pulling what the others hold), so a new primary never copies
	// such a node's stale copy and delivers a row a second time.
	rejoined := !alone && prev != nil && r.aloneAfterPeersLocked(prev)
	for s := range r.cfg.ShardCount {
		in := v.inSet(v.Self, s) && !v.Leaving
		switch {
		case !in:
			r.syncs.synced[s] = false
		case alone:
			r.syncs.synced[s] = true
		case rejoined:
			r.syncs.synced[s] = false
		case prev == nil || !prev.inSet(v.Self, s) || prev.Leaving:
			r.syncs.synced[s] = false
		}
	}
	r.peak = max(r.peak, len(v.Addrs))
	r.startHandoverLocked(prev, v, alone)
	r.view.Store(v)
	r.updateScopeLocked()
	r.updateGaugesLocked(v)
	r.mu.Unlock()
	r.ship.retarget(prev, v)
	wake(r.syncWake)
	wake(r.pollWake)
	wake(r.dropWake)
	wake(r.handoverWake)
}

// aloneAfterPeersLocked reports whether v shows this node alone although
// it has had peers (r.peak > 1): cut off, or the survivor of failures, its
// copies may lack what others changed meanwhile (Apply's rejoined,
// States' Synced). r.mu held.
func (r *Replicator) aloneAfterPeersLocked(v *View) bool {
	return len(v.peers()) == 0 && r.peak > 1
}

// View returns the current view (nil before the first Apply).
func (r *Replicator) View() *View { return r.view.Load() }

// Joined reports whether a view was applied.
func (r *Replicator) Joined() bool { return r.view.Load() != nil }

// updateScopeLocked hands Config.Scope the shards this node is primary of
// and synced for, and not waiting for a handover, when that set changed.
func (r *Replicator) updateScopeLocked() {
	v := r.view.Load()
	var scope []uint32
	if v != nil && !v.Leaving {
		for s := range r.cfg.ShardCount {
			if _, waiting := r.handovers.since[s]; r.syncs.synced[s] && v.primary(s) == v.Self && !waiting {
				scope = append(scope, s)
			}
		}
	}
	if scope == nil {
		scope = []uint32{}
	}
	if r.scope != nil && slices.Equal(scope, r.scope) {
		return
	}
	r.scope = scope
	r.cfg.Scope(scope)
}

func (r *Replicator) updateGaugesLocked(v *View) {
	r.m.factor.Set(float64(v.Factor))
	r.m.copies.Set(float64(v.copies()))
	r.m.writeCopies.Set(float64(r.writeCopiesLocked(v)))
	n := 0
	for s := range r.cfg.ShardCount {
		if v.inSet(v.Self, s) && !r.syncs.synced[s] {
			n++
		}
	}
	r.m.syncingShards.Set(float64(n))
}

// writeCopiesLocked is the write-copies minimum in view v (Config.WriteCopies).
func (r *Replicator) writeCopiesLocked(v *View) int {
	f := max(v.Factor, 1)
	if r.cfg.WriteCopies > 0 {
		return min(r.cfg.WriteCopies, f)
	}
	if f >= 2 && (r.cfg.Seeded || r.peak >= 2) {
		return 2
	}
	return 1
}

// WriteCopies returns the write-copies minimum applied now.
func (r *Replicator) WriteCopies() int {
	v := r.view.Load()
	if v == nil {
		return max(r.cfg.WriteCopies, 1)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.writeCopiesLocked(v)
}

// Synced reports whether this node is a synced replica of shard.
func (r *Replicator) Synced(shard uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int(shard) < len(r.syncs.synced) && r.syncs.synced[shard]
}

// markSynced records that this node finished syncing shard, if it is still
// a replica of it in the view the sync was planned from (a view change
// meanwhile restarts the sync).
func (r *Replicator) markSynced(v *View, shard uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur := r.view.Load()
	if cur != v && (cur == nil || !cur.inSet(cur.Self, shard) || !slices.Equal(cur.set(shard), v.set(shard)) || cur.Leaving) {
		return false
	}
	if !r.syncs.synced[shard] {
		r.syncs.synced[shard] = true
		r.m.syncedShards.Inc()
	}
	r.updateScopeLocked()
	r.updateGaugesLocked(cur)
	return true
}

// shardOf is the shard of a key.
func (r *Replicator) shardOf(key string) uint32 { return shards.ShardOf(key, r.cfg.ShardCount) }

func wake(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// sleep waits d or until ctx ends or ch fires; false when ctx ended.
func sleep(ctx context.Context, d time.Duration, ch <-chan struct{}) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
	case <-ch:
	}
	return true
}
