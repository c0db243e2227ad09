package backpressure

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/quota"
)

// ClaimStore is the part of outbox.Store the planner uses: one route
// listing, one bucketed claimed-count read and scoped atomic claims per
// sweep.
type ClaimStore interface {
	PendingRoutes(ctx context.Context, now time.Time) ([]outbox.ClaimScope, error)
	CountClaimedByNamespace(ctx context.Context, namespaces []string) (map[string]int, error)
	Claim(ctx context.Context, p outbox.ClaimParams) ([]outbox.Row, error)
}

// BatchClaimer is an optional upgrade of ClaimStore: a store that can run
// every claim of a sweep in one transaction (boltstore: one group commit,
// one fsync, instead of one per route). ClaimBatch calls run with a claim
// function bound to that transaction; the claims take effect together when
// ClaimBatch returns nil, and none of them when it returns an error. run may
// be called more than once (a store may retry the transaction), so it must
// start from scratch each time.
type BatchClaimer interface {
	ClaimBatch(ctx context.Context, run func(claim func(outbox.ClaimParams) ([]outbox.Row, error)) error) error
}

// PlannerConfig wires a Planner. Only Ceilings is required.
type PlannerConfig struct {
	// Ceilings gives this node's ceiling for each namespace, read once per
	// active namespace per sweep: quota.Proportional (the seed's
	// ceil(quota × owned/total)), quota.Leased (the unexpired capacity
	// lease) or quota.ByMode (per namespace). Every source answers 0 for a
	// paused namespace.
	Ceilings quota.Source
	// Eligible filters routes before planning: a route for which it returns
	// false is left out of the sweep entirely (its rows stay pending). The
	// node uses it for paused namespaces and routes with no delivery target.
	// nil admits every route.
	Eligible func(outbox.ClaimScope) bool
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
	// Logger receives a debug line when every route was held at its
	// ceiling; nil discards.
	Logger *slog.Logger
}

// Planner claims one fair, headroom-capped batch per sweep (seed
// claim_round_robin). Safe for concurrent use; see the package doc on
// concurrent sweeps.
type Planner struct {
	ceilings quota.Source
	eligible func(outbox.ClaimScope) bool
	now      func() time.Time
	log      *slog.Logger
	// cursor is the last namespace the previous sweep's first pass reached
	// with budget left; the next sweep starts after it (see Sweep).
	cursorMu sync.Mutex
	cursor   string
}

// NewPlanner builds a Planner. It panics only if cfg.Ceilings is nil, a
// programming error caught at start-up.
func NewPlanner(cfg PlannerConfig) *Planner {
	if cfg.Ceilings == nil {
		panic("backpressure: PlannerConfig.Ceilings is required")
	}
	p := &Planner{ceilings: cfg.Ceilings, eligible: cfg.Eligible, now: cfg.Now, log: cfg.Logger}
	if p.now == nil {
		p.now = time.Now
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	return p
}

// NamespaceSweep is what one sweep decided for one namespace.
type NamespaceSweep struct {
	Namespace string
	// Quota is the namespace's cluster-wide quota (rows).
	Quota uint32
	// Ceiling is this node's per-node ceiling (rows) from
	// PlannerConfig.Ceilings: ceil(Quota × owned/total) in proportional
	// mode, the unexpired lease in exact mode, 0 when paused.
	Ceiling uint32
	// Mode is the quota mode the ceiling was computed in.
	Mode quota.Mode
	// ClaimedBefore is this node's claimed rows of the namespace when the
	// sweep started (CLAIMED only, never pending).
	ClaimedBefore int
	// Claimed is how many rows this sweep claimed for the namespace.
	Claimed int
	// Routes is how many of its routes had visible pending rows.
	Routes int
}

// Headroom is the namespace's remaining headroom after the sweep (rows,
// ≥ 0): Ceiling − ClaimedBefore − Claimed.
func (n NamespaceSweep) Headroom() int {
	return max(int(n.Ceiling)-n.ClaimedBefore-n.Claimed, 0)
}

// AtCeiling reports whether the namespace ended the sweep with no headroom,
// i.e. pending rows were held back by its ceiling.
func (n NamespaceSweep) AtCeiling() bool { return n.Headroom() == 0 }

// Sweep is one sweep's outcome.
type Sweep struct {
	// Rows are the claimed rows, in claim order.
	Rows []outbox.Row
	// Namespaces has one entry per active namespace, sorted by name.
	Namespaces []NamespaceSweep
}

// ClaimRoundRobin claims up to batchSize rows across every namespace with
// visible pending work and returns them in claim order. It is Sweep without
// the per-namespace report. Rows it does not claim stay pending.
func (p *Planner) ClaimRoundRobin(ctx context.Context, store ClaimStore, batchSize int, held map[string]struct{}) ([]outbox.Row, error) {
	s, err := p.Sweep(ctx, store, batchSize, held)
	return s.Rows, err
}

// Sweep runs the seed's two-pass plan (DESIGN.md "The sweep"):
//
//   - list pending routes (filtered by Eligible) and group them by
//     namespace, sorted;
//   - read every namespace's claimed count in ONE bucketed read;
//   - headroom = this node's ceiling (PlannerConfig.Ceilings) − claimed,
//     clamped at 0 (quota.Ceiling.Headroom);
//   - slice = ceil(batchSize / active namespaces), at least 1;
//   - pass 1 (fairness): each namespace claims min(slice, headroom, budget),
//     spread round-robin over its routes, each route taking the running
//     share ceil(remaining / routes left);
//   - pass 2 (utilisation): leftover budget goes, in namespace order, to
//     namespaces that still have headroom.
//
// One deliberate deviation from the seed: the passes walk the sorted
// namespaces starting just after the last namespace the previous sweep's
// first pass reached with budget left, wrapping around, instead of always at
// the alphabetically first. When the budget covers every namespace the start
// does not move; when more namespaces are active than the batch has slots
// (slice 1, budget spent before the tail), the next sweep continues where
// this one ran out, so no fixed tail of namespaces starves.
//
// Rows of held workflows are skipped at claim time (they stay pending and
// do not use up the limit). A store error is returned as is, wrapped with
// the step and route; rows claimed before it are returned too, so the
// caller can deliver what it already owns.
func (p *Planner) Sweep(ctx context.Context, store ClaimStore, batchSize int, held map[string]struct{}) (Sweep, error) {
	now := p.now()
	var out Sweep
	if batchSize <= 0 {
		return out, nil
	}
	routes, err := store.PendingRoutes(ctx, now)
	if err != nil {
		return out, fmt.Errorf("backpressure: list pending routes: %w", err)
	}
	// Group by namespace; PendingRoutes is sorted by (namespace, task_queue)
	// but a store may not be, so do not rely on adjacency.
	type plan struct {
		routes   []outbox.ClaimScope
		headroom int
	}
	byNS := map[string]*plan{}
	var names []string
	for _, r := range routes {
		if p.eligible != nil && !p.eligible(r) {
			continue
		}
		pl, ok := byNS[r.Namespace]
		if !ok {
			pl = &plan{}
			byNS[r.Namespace] = pl
			names = append(names, r.Namespace)
		}
		pl.routes = append(pl.routes, r)
	}
	if len(names) == 0 {
		return out, nil
	}
	slices.Sort(names)
	claimed, err := store.CountClaimedByNamespace(ctx, names)
	if err != nil {
		return out, fmt.Errorf("backpressure: count claimed rows of %d namespaces: %w", len(names), err)
	}
	out.Namespaces = make([]NamespaceSweep, len(names))
	for i, ns := range names {
		ceiling := p.ceilings.Ceiling(ctx, ns)
		c := claimed[ns]
		byNS[ns].headroom = ceiling.Headroom(c)
		out.Namespaces[i] = NamespaceSweep{Namespace: ns, Quota: ceiling.Quota, Ceiling: ceiling.Rows, Mode: ceiling.Mode,
			ClaimedBefore: c, Routes: len(byNS[ns].routes)}
	}

	slice := max((batchSize+len(names)-1)/len(names), 1)
	claimParams := outbox.ClaimParams{Now: now, ExcludeWorkflows: held}
	p.cursorMu.Lock()
	start, _ := slices.BinarySearch(names, p.cursor)
	if start < len(names) && names[start] == p.cursor {
		start++
	}
	start %= len(names)
	p.cursorMu.Unlock()
	headroom := make([]int, len(names))
	reached := ""
	// execute runs both passes through claim; it starts from scratch on every
	// call (a BatchClaimer may run it more than once).
	execute := func(claim func(outbox.ClaimParams) ([]outbox.Row, error)) error {
		out.Rows = out.Rows[:0]
		for i, ns := range names {
			headroom[i] = byNS[ns].headroom
			out.Namespaces[i].Claimed = 0
		}
		budget := batchSize
		for pass := range 2 {
			for j := range names {
				if budget == 0 {
					break
				}
				i := (start + j) % len(names)
				ns := names[i]
				if pass == 0 {
					reached = ns
				}
				allocation := min(headroom[i], budget)
				if pass == 0 {
					allocation = min(allocation, slice)
				}
				got, err := claimSlice(claim, byNS[ns].routes, allocation, claimParams, &out.Rows)
				headroom[i] -= got
				budget -= got
				out.Namespaces[i].Claimed += got
				if err != nil {
					return err
				}
			}
		}
		return nil
	}
	if bc, ok := store.(BatchClaimer); ok {
		if err := bc.ClaimBatch(ctx, execute); err != nil {
			out.Rows = nil // the transaction rolled back: nothing was claimed
			for i := range out.Namespaces {
				out.Namespaces[i].Claimed = 0
			}
			return out, fmt.Errorf("backpressure: claim batch over %d namespaces: %w", len(names), err)
		}
	} else if err := execute(func(cp outbox.ClaimParams) ([]outbox.Row, error) { return store.Claim(ctx, cp) }); err != nil {
		return out, err
	}
	p.cursorMu.Lock()
	p.cursor = reached
	p.cursorMu.Unlock()
	if len(out.Rows) == 0 {
		p.log.Debug("backpressure held every pending route this sweep", "namespaces", len(names))
	}
	return out, nil
}

// claimSlice claims up to allocation rows of one namespace, round-robin over
// its routes: each route is offered ceil(remaining / routes left), so a
// route with few rows yields the rest to the routes after it. Where the seed
// stops after one pass over the routes, this keeps going round the routes
// that filled their share until the allocation is met or every route has
// run dry, so a short route early in the list cannot leave budget unused.
func claimSlice(claim func(outbox.ClaimParams) ([]outbox.Row, error), routes []outbox.ClaimScope, allocation int, p outbox.ClaimParams, into *[]outbox.Row) (int, error) {
	remaining, total := allocation, 0
	live := routes
	for remaining > 0 && len(live) > 0 {
		var stillLive []outbox.ClaimScope
		for i := range live {
			if remaining <= 0 {
				break
			}
			left := len(live) - i
			share := min(max((remaining+left-1)/left, 1), remaining)
			scope := live[i]
			p.Scope, p.Limit = &scope, share
			rows, err := claim(p)
			*into = append(*into, rows...)
			remaining -= len(rows)
			total += len(rows)
			if err != nil {
				return total, fmt.Errorf("backpressure: claim %d rows of route %s: %w", share, scope, err)
			}
			if len(rows) == share { // filled its share: it may have more
				stillLive = append(stillLive, scope)
			}
		}
		live = stillLive
	}
	return total, nil
}
