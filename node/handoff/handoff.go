// Package handoff is the sending side of handoff: it moves the rows this
// node holds for shards it does not own to their owners, through a
// transfer.Mover (batches bounded in rows and bytes, marks always released
// or retried) and one transfer.Sink per owner. Its loop runs a pass on
// every Wake (an ownership change) and every interval; Drain is the final
// pass of a graceful stop. The receiving side is the node's internal
// handoff route (package httpapi), which merges batches into the store.
//
// Which node owns a shard comes from the node's applied ownership view;
// replication (#14) will move whole replica sets through the same Mover
// (transfer.Copy for a new backup).
package handoff

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/transfer"
)

// Store is what handoff needs of the node's store: a transfer source and
// the list of non-owned shards that still hold rows here.
type Store interface {
	transfer.Source
	// ForeignShards returns, ascending, the shards this node does not own
	// that hold rows a handoff still has to move (marked in transfer or
	// not).
	ForeignShards(ctx context.Context) ([]uint32, error)
}

// Config wires a Handoff. Store, Ownership and Sink are required.
type Config struct {
	// Self is this node's name.
	Self string
	// Store is this node's store. When it also implements
	// transfer.ShardsReader a batch across shards costs one commit.
	Store Store
	// Ownership returns the node's applied ownership view.
	Ownership func() *cluster.OwnershipSnapshot
	// Sink returns the sink of the member serving its API at apiAddr
	// (*peer.Client's Sink).
	Sink func(apiAddr string) transfer.Sink
	// Reachable reports whether a member's API answers its health
	// checks; a pass skips a member that does not (no batch marked, no
	// call made) until it does again (issue #13 item 7). nil: every
	// member is tried.
	Reachable func(member string) bool
	// Limits bound one batch (rows, bytes); zero fields take transfer's
	// defaults.
	Limits transfer.Limits
	// Interval is how often the loop runs a pass besides on Wake.
	// Defaults to 5 s.
	Interval time.Duration
	// Logger and Registerer receive the handoff's logs and metrics (nil:
	// none); the Mover's metrics go to the same Registerer.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Handoff moves rows of non-owned shards to their owners. Safe for
// concurrent use: passes are serialised.
type Handoff struct {
	cfg   Config
	log   *slog.Logger
	mover *transfer.Mover
	m     metrics
	wake  chan struct{}

	// sem serialises passes (the loop's and Drain's); a pass holds its one
	// slot.
	sem chan struct{}
	// stopLoop ends the loop's passes when Drain takes over.
	mu       sync.Mutex
	stopLoop context.CancelFunc
	stopped  bool
}

type metrics struct {
	sent, errors  prometheus.Counter
	shardsPending prometheus.Gauge
}

// New builds a Handoff and its Mover, registering their metrics.
func New(cfg Config) (*Handoff, error) {
	if cfg.Store == nil || cfg.Ownership == nil || cfg.Sink == nil {
		return nil, errors.New("handoff: Store, Ownership and Sink are required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 5 * time.Second
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	mover, err := transfer.NewMover(cfg.Store, transfer.MoverConfig{Limits: cfg.Limits, Logger: log, Registerer: cfg.Registerer})
	if err != nil {
		return nil, fmt.Errorf("create handoff mover: %w", err)
	}
	h := &Handoff{cfg: cfg, log: log, mover: mover, wake: make(chan struct{}, 1), sem: make(chan struct{}, 1)}
	h.m = metrics{
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_handoff_rows_sent_total", Help: "Rows handed off to their shard owner and deleted here.",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_handoff_errors_total", Help: "Handoff batches that failed and were unmarked for a later retry.",
		}),
		shardsPending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fairshard_handoff_shards_pending", Help: "Non-owned shards that still hold pending or finished rows on this node (in transfer or not).",
		}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{h.m.sent, h.m.errors, h.m.shardsPending} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("handoff: register metrics: %w", err)
			}
		}
	}
	return h, nil
}

// Wake asks the loop for a pass now (after an ownership change). It never
// blocks.
func (h *Handoff) Wake() {
	select {
	case h.wake <- struct{}{}:
	default:
	}
}

// Run is the handoff loop: a pass on every Wake and every Interval, until
// ctx ends or Drain takes over. Failed passes are logged and retried by
// the next one. It returns nil.
func (h *Handoff) Run(ctx context.Context) error {
	h.mu.Lock()
	if h.stopped {
		h.mu.Unlock()
		return nil
	}
	ctx, h.stopLoop = context.WithCancel(ctx)
	h.mu.Unlock()
	t := time.NewTicker(h.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-h.wake:
		}
		if _, err := h.Once(ctx); err != nil && ctx.Err() == nil {
			h.log.Warn("handoff pass incomplete; retrying", "err", err)
		}
	}
}

// StopLoop ends the loop's passes (a pass in flight is cancelled; its
// marks are released) and keeps the loop from starting again. Drain calls
// it; a hard stop calls it alone. Idempotent.
func (h *Handoff) StopLoop() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.stopped = true
	if h.stopLoop != nil {
		h.stopLoop()
	}
}

// Once runs one pass: it groups the non-owned shards holding rows here by
// their owner and hands each owner its rows. It returns the rows moved and
// the first error; other owners still get their turn.
func (h *Handoff) Once(ctx context.Context) (int, error) {
	// One pass at a time: Drain waits for a pass of the loop to finish its
	// batch instead of interleaving with it.
	select {
	case h.sem <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-h.sem }()
	// Marks whose release failed earlier are released first, whether or not
	// any row moves in this pass: their shard may be owned here again (its
	// rows must become claimable) or have no live owner.
	if err := h.mover.RetryStranded(ctx); err != nil {
		return 0, fmt.Errorf("release rows left in transfer: %w", err)
	}
	foreign, err := h.cfg.Store.ForeignShards(ctx)
	if err != nil {
		return 0, fmt.Errorf("list foreign shards: %w", err)
	}
	h.m.shardsPending.Set(float64(len(foreign)))
	snap := h.cfg.Ownership()
	type dest struct {
		addr   string
		shards []uint32
	}
	byOwner := map[string]*dest{}
	var owners []string
	for _, shard := range foreign {
		owner, ok := h.owner(snap, shard)
		if !ok {
			continue // no live owner (or it is us again): keep the rows
		}
		d := byOwner[owner.Name]
		if d == nil {
			d = &dest{addr: owner.APIAddr}
			byOwner[owner.Name] = d
			owners = append(owners, owner.Name)
		}
		d.shards = append(d.shards, shard)
	}
	moved := 0
	var firstErr error
	for _, name := range owners {
		if h.cfg.Reachable != nil && !h.cfg.Reachable(name) {
			if firstErr == nil {
				firstErr = fmt.Errorf("to %s: skipped, its API does not answer health checks", name)
			}
			continue
		}
		m, err := h.moveTo(ctx, name, byOwner[name].addr, byOwner[name].shards)
		moved += m
		if firstErr == nil {
			firstErr = err
		}
	}
	return moved, firstErr
}

// owner returns the live member other than this node that handoff sends
// shard's rows to: its primary.
func (h *Handoff) owner(snap *cluster.OwnershipSnapshot, shard uint32) (cluster.Member, bool) {
	owner, ok := snap.Owner(shard)
	if !ok || owner.Name == h.cfg.Self || owner.APIAddr == "" {
		return cluster.Member{}, false
	}
	return owner, true
}

// moveTo moves the transferable rows of shards (all owned by owner) to it
// through the Mover: batches gathered across shards (so a node holding a
// few rows in each of hundreds of shards makes a few calls, not hundreds),
// each marked in transfer, sent in one call, and deleted after the owner's
// durable ack, or unmarked when the call failed (which ends this owner's
// turn). It returns the rows moved and the first error.
func (h *Handoff) moveTo(ctx context.Context, owner, addr string, shards []uint32) (int, error) {
	st, err := h.mover.Move(ctx, h.cfg.Sink(addr), shards)
	h.m.sent.Add(float64(st.Rows))
	if st.Rows > 0 {
		h.log.Debug("handed off rows", "to", owner, "rows", st.Rows, "batches", st.Batches, "bytes", st.Bytes)
	}
	if err != nil {
		h.m.errors.Inc()
		return st.Rows, fmt.Errorf("to %s: %w", owner, err)
	}
	return st.Rows, nil
}

// Drain is the final handoff of a graceful stop: it stops the loop's
// passes, then repeats passes until no transferable row of a non-owned
// shard is left here or ctx ends, and returns how many shards still hold
// rows. When no other member owns any of those shards (this is the last
// active node) nobody can take them: it returns at once with a nil error
// and the rows stay on disk for the next start.
func (h *Handoff) Drain(ctx context.Context) (int, error) {
	h.StopLoop()
	for {
		if _, err := h.Once(ctx); err != nil {
			h.log.Warn("handoff pass during shutdown failed; retrying", "err", err)
		}
		foreign, err := h.cfg.Store.ForeignShards(ctx)
		if err != nil {
			return -1, err
		}
		if len(foreign) == 0 {
			return 0, nil
		}
		if !h.anyOwner(foreign) {
			h.log.Warn("no other member owns the shards this node holds rows of; they stay on disk and move once a node owns them",
				"shards", len(foreign))
			return len(foreign), nil
		}
		select {
		case <-ctx.Done():
			return len(foreign), errors.Join(ctx.Err(), fmt.Errorf("%d shards still hold rows", len(foreign)))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// anyOwner reports whether some shard of shards has a live owner other
// than this node that handoff could send to.
func (h *Handoff) anyOwner(shards []uint32) bool {
	snap := h.cfg.Ownership()
	for _, shard := range shards {
		if _, ok := h.owner(snap, shard); ok {
			return true
		}
	}
	return false
}
