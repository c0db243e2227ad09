package backpressure

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/quota"
)

// ClaimStore is the part of the store the planner uses: one route listing
// and scoped atomic claims per sweep. What counts against headroom comes
// from PlannerConfig.Claimed.
type ClaimStore interface {
	PendingRoutes(ctx context.Context, now time.Time) ([]outbox.ClaimScope, error)
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

// PlannerConfig wires a Planner. Ceilings and Claimed are required.
type PlannerConfig struct {
	// Claimed counts, in one read per sweep, what holds each active
	// namespace's capacity on this node (quota.Claims: the claim rule).
	Claimed quota.Counter
	// Ceilings gives this node's ceiling for each namespace, read once per
	// active namespace per sweep: quota.Proportional (the seed's
	// ceil(quota × owned/total)), quota.Leased (the unexpired capacity
	// lease) or quota.ByMode (per namespace). Every source answers 0 for a
	// paused namespace.
	Ceilings quota.Source
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
	// Logger receives a debug line when every route was held at its
	// ceiling; nil discards.
	Logger *slog.Logger
	// Hosts, when set, is the per-target-host ceiling applied beside each
	// namespace's (see HostSlots and Sweep). nil: routes have no host
	// ceiling. The node gives it the dispatcher's dispatch.HostLimits.
	Hosts HostSlots
}

// Planner claims one fair, headroom-capped batch per sweep (seed
// claim_round_robin). Safe for concurrent use; see the package doc on
// concurrent sweeps.
type Planner struct {
	ceilings quota.Source
	claimed  quota.Counter
	hosts    HostSlots
	now      func() time.Time
	log      *slog.Logger
	// cursor is the last namespace the previous sweep's first pass reached
	// with budget left; the next sweep starts after it (see Sweep).
	// routeCursor is, per active namespace, the task_queue of the route
	// that last got rows; the namespace's next claim starts after it.
	cursorMu    sync.Mutex
	cursor      string
	routeCursor map[string]string
}

// NewPlanner builds a Planner. It panics only if cfg.Ceilings or
// cfg.Claimed is nil, a programming error caught at start-up.
func NewPlanner(cfg PlannerConfig) *Planner {
	if cfg.Ceilings == nil || cfg.Claimed == nil {
		panic("backpressure: PlannerConfig.Ceilings and Claimed are required")
	}
	p := &Planner{ceilings: cfg.Ceilings, claimed: cfg.Claimed, hosts: cfg.Hosts, now: cfg.Now, log: cfg.Logger,
		routeCursor: map[string]string{}}
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
	// HostLimited reports that the namespace ended the sweep with
	// headroom left while the target host of at least one of its routes
	// had no slot left for it (PlannerConfig.Hosts): such rows wait for a
	// delivery to that host to finish.
	HostLimited bool
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
	// Hosts has one entry per target host that an eligible route of a
	// namespace with headroom maps to, sorted by host; empty without
	// PlannerConfig.Hosts.
	Hosts []HostSweep
	// Ineligible are the routes with visible pending rows that
	// SweepRequest.Eligible left out, in the store's order.
	Ineligible []outbox.ClaimScope
	// Listed reports that the sweep read the pending routes (false when
	// that read failed: Ineligible says nothing then).
	Listed bool
}

// SweepRequest is what one sweep may claim.
type SweepRequest struct {
	// Batch is the most rows to claim (≤ 0 claims nothing).
	Batch int
	// Held are the workflow ids whose rows stay pending (pause holds).
	Held map[string]struct{}
	// Eligible filters routes before planning: a route for which it
	// returns false is left out of the sweep entirely (its rows stay
	// pending; Sweep.Ineligible lists it). The dispatcher leaves out
	// paused namespaces and routes with no delivery target. nil admits
	// every route.
	Eligible func(outbox.ClaimScope) bool
}

// Sweep runs the seed's two-pass plan (DESIGN.md "The sweep"):
//
//   - list pending routes (filtered by req.Eligible) and group them by
//     namespace, sorted;
//   - read every namespace's claimed count in ONE bucketed read
//     (PlannerConfig.Claimed, the claim rule);
//   - headroom = this node's ceiling (PlannerConfig.Ceilings) − claimed,
//     clamped at 0 (quota.Ceiling.Headroom);
//   - slice = ceil(batchSize / active namespaces), at least 1;
//   - pass 1 (fairness): each namespace claims min(slice, headroom, budget),
//     spread round-robin over its routes, each route taking the running
//     share ceil(remaining / routes left);
//   - pass 2 (utilisation): leftover budget goes, in namespace order, to
//     namespaces that still have headroom.
//
// With PlannerConfig.Hosts, each route's target host is a second ceiling
// beside the namespace's: every claim is also capped by what the host
// allows the namespace. Per host, share = ceil(limit / n), n the namespaces
// wanting the host or holding rows in flight to it; in pass 1 a namespace
// may claim up to its share minus what it holds there (even when the host
// is full, never past 2 × limit in flight), in pass 2 also the host's free
// slots (limit − in flight). So a claimed row always has a slot to go out
// on, and a quiet namespace's row takes the next sweep, not the next free
// connection after a noisy namespace's backlog
// (docs/adr/0015-host-slots-bound-claims.md).
//
// Two deliberate deviations from the seed: the passes walk the sorted
// namespaces starting just after the last namespace the previous sweep's
// first pass reached with budget left, wrapping around, instead of always
// at the alphabetically first; and a namespace's routes are walked
// starting after the route that last got rows. When the budget covers
// every namespace and route the start does not matter; when it does not
// (slice 1, or a host with one free slot per sweep), the next sweep
// continues where this one ran out, so no fixed tail of namespaces or
// task queues starves.
//
// Rows of held workflows are skipped at claim time (they stay pending and
// do not use up the limit). A store error is returned as is, wrapped with
// the step and route; rows claimed before it are returned too, so the
// caller can deliver what it already owns.
func (p *Planner) Sweep(ctx context.Context, store ClaimStore, req SweepRequest) (Sweep, error) {
	now := p.now()
	var out Sweep
	if req.Batch <= 0 {
		return out, nil
	}
	routes, err := store.PendingRoutes(ctx, now)
	if err != nil {
		return out, fmt.Errorf("backpressure: list pending routes: %w", err)
	}
	out.Listed = true
	sp := &sweepPlan{batch: req.Batch, params: outbox.ClaimParams{Now: now, ExcludeWorkflows: req.Held}}
	out.Ineligible = sp.group(routes, req.Eligible)
	if len(sp.names) == 0 {
		return out, nil
	}
	if out.Namespaces, err = p.readHeadroom(ctx, sp); err != nil {
		return out, err
	}
	if p.hosts != nil {
		sp.planHosts(p.hosts)
	}
	sp.slice = max((sp.batch+len(sp.names)-1)/len(sp.names), 1)
	p.loadCursors(sp)
	if err := sp.claim(ctx, store, &out); err != nil {
		return out, err
	}
	sp.markHostLimited(&out)
	out.Hosts = hostReport(sp.hosts)
	p.saveCursors(sp)
	if len(out.Rows) == 0 {
		p.log.Debug("backpressure held every pending route this sweep", "namespaces", len(sp.names))
	}
	return out, nil
}

// sweepPlan is the state of one sweep, from grouping the pending routes to
// the cursors the next sweep starts from. Per-namespace slices are indexed
// like names.
type sweepPlan struct {
	batch  int                // the most rows to claim
	params outbox.ClaimParams // Now and the held workflows; Scope and Limit set per claim
	names  []string           // active namespaces, sorted
	byNS   map[string]*namespacePlan
	hosts  map[string]*hostPlan // nil without PlannerConfig.Hosts
	slice  int                  // pass 1's cap per namespace: ceil(batch / active), ≥ 1

	start      int   // index of the namespace the passes begin at
	routeStart []int // per namespace: the route its next claim starts at
	headroom   []int // per namespace: headroom left during and after the passes
	nextStart  []int // per namespace: the route after the last one that got rows
	reached    string
}

// namespacePlan is one active namespace's eligible routes, sorted by
// task_queue once headroom is read, and its headroom when the sweep
// started.
type namespacePlan struct {
	routes   []routeRef
	headroom int
}

// group collects the routes eligible admits (nil admits all) by namespace,
// in sp.names and sp.byNS, and returns the others in the store's order.
// Routes come sorted by (namespace, task_queue) from PendingRoutes, but a
// store may not sort them, so grouping does not rely on adjacency.
func (sp *sweepPlan) group(routes []outbox.ClaimScope, eligible func(outbox.ClaimScope) bool) (ineligible []outbox.ClaimScope) {
	sp.byNS = map[string]*namespacePlan{}
	for _, r := range routes {
		if eligible != nil && !eligible(r) {
			ineligible = append(ineligible, r)
			continue
		}
		pl, ok := sp.byNS[r.Namespace]
		if !ok {
			pl = &namespacePlan{}
			sp.byNS[r.Namespace] = pl
			sp.names = append(sp.names, r.Namespace)
		}
		pl.routes = append(pl.routes, routeRef{scope: r})
	}
	slices.Sort(sp.names)
	return ineligible
}

// readHeadroom reads every active namespace's claimed count in ONE read
// (PlannerConfig.Claimed) and its ceiling (PlannerConfig.Ceilings), and
// sets its headroom: ceiling − claimed, clamped at 0. It returns the
// namespaces' sweep entries with nothing claimed yet.
func (p *Planner) readHeadroom(ctx context.Context, sp *sweepPlan) ([]NamespaceSweep, error) {
	claimed, err := p.claimed.Claimed(ctx, sp.names)
	if err != nil {
		return nil, fmt.Errorf("backpressure: count claimed rows of %d namespaces: %w", len(sp.names), err)
	}
	entries := make([]NamespaceSweep, len(sp.names))
	for i, ns := range sp.names {
		ceiling := p.ceilings.Ceiling(ctx, ns)
		c := claimed[ns]
		pl := sp.byNS[ns]
		pl.headroom = ceiling.Headroom(c)
		slices.SortFunc(pl.routes, func(a, b routeRef) int { return strings.Compare(a.scope.TaskQueue, b.scope.TaskQueue) })
		entries[i] = NamespaceSweep{Namespace: ns, Quota: ceiling.Quota, Ceiling: ceiling.Rows, Mode: ceiling.Mode,
			ClaimedBefore: c, Routes: len(pl.routes)}
	}
	return entries, nil
}

// planHosts gives each route of a namespace with headroom the plan of its
// target host. Only namespaces that can claim want a host; the others
// must not dilute its share.
func (sp *sweepPlan) planHosts(slots HostSlots) {
	var wanting []*routeRef
	var scopes []outbox.ClaimScope
	for _, ns := range sp.names {
		if pl := sp.byNS[ns]; pl.headroom > 0 {
			for i := range pl.routes {
				wanting = append(wanting, &pl.routes[i])
				scopes = append(scopes, pl.routes[i].scope)
			}
		}
	}
	var routeHost []string
	sp.hosts, routeHost = planHosts(slots, scopes)
	for i, r := range wanting {
		r.host = sp.hosts[routeHost[i]] // nil when the route has no host
	}
}

// loadCursors sets where the passes start: at the namespace after the one
// the previous sweep's first pass last reached (wrapping around), and in
// each namespace at the route after the one that last got rows.
func (p *Planner) loadCursors(sp *sweepPlan) {
	names := sp.names
	p.cursorMu.Lock()
	defer p.cursorMu.Unlock()
	start, _ := slices.BinarySearch(names, p.cursor)
	if start < len(names) && names[start] == p.cursor {
		start++
	}
	sp.start = start % len(names)
	sp.routeStart = make([]int, len(names))
	for i, ns := range names {
		sp.routeStart[i] = nextRoute(sp.byNS[ns].routes, p.routeCursor[ns])
	}
}

// claim runs both passes against store: in one transaction when the store
// is a BatchClaimer (on error nothing was claimed, and out says so), else
// claim by claim (on error out keeps the rows claimed before it). On error
// out.Hosts reports the hosts as they stand.
func (sp *sweepPlan) claim(ctx context.Context, store ClaimStore, out *Sweep) error {
	sp.headroom = make([]int, len(sp.names))
	sp.nextStart = make([]int, len(sp.names))
	if bc, ok := store.(BatchClaimer); ok {
		err := bc.ClaimBatch(ctx, func(claim func(outbox.ClaimParams) ([]outbox.Row, error)) error {
			return sp.passes(claim, out)
		})
		if err != nil {
			out.Rows = nil // the transaction rolled back: nothing was claimed
			for i := range out.Namespaces {
				out.Namespaces[i].Claimed = 0
			}
			for _, h := range sp.hosts {
				h.reset()
			}
			out.Hosts = hostReport(sp.hosts)
			return fmt.Errorf("backpressure: claim batch over %d namespaces: %w", len(sp.names), err)
		}
		return nil
	}
	if err := sp.passes(func(cp outbox.ClaimParams) ([]outbox.Row, error) { return store.Claim(ctx, cp) }, out); err != nil {
		out.Hosts = hostReport(sp.hosts)
		return err
	}
	return nil
}

// passes runs the two passes through claim, walking the namespaces from
// sp.start: pass 1 (fairness) gives each min(slice, headroom, budget),
// pass 2 (utilisation) offers the leftover budget to those with headroom
// left. It starts from scratch on every call (a BatchClaimer may run it
// more than once) and records the claimed rows and counts in out.
func (sp *sweepPlan) passes(claim func(outbox.ClaimParams) ([]outbox.Row, error), out *Sweep) error {
	names := sp.names
	out.Rows = out.Rows[:0]
	for i, ns := range names {
		sp.headroom[i] = sp.byNS[ns].headroom
		out.Namespaces[i].Claimed = 0
	}
	copy(sp.nextStart, sp.routeStart)
	for _, h := range sp.hosts {
		h.reset()
	}
	budget := sp.batch
	for pass := range 2 {
		for j := range names {
			if budget == 0 {
				break
			}
			i := (sp.start + j) % len(names)
			ns := names[i]
			if pass == 0 {
				sp.reached = ns
			}
			allocation := min(sp.headroom[i], budget)
			if pass == 0 {
				allocation = min(allocation, sp.slice)
			}
			got, next, err := claimSlice(claim, ns, sp.byNS[ns].routes, sp.nextStart[i], allocation, pass == 1, sp.params, &out.Rows)
			sp.nextStart[i] = next
			sp.headroom[i] -= got
			budget -= got
			out.Namespaces[i].Claimed += got
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// markHostLimited flags each namespace that ended the sweep with headroom
// left while a route's target host had no slot left for it.
func (sp *sweepPlan) markHostLimited(out *Sweep) {
	for i, ns := range sp.names {
		if sp.headroom[i] == 0 {
			continue
		}
		for _, r := range sp.byNS[ns].routes {
			if r.host != nil && r.host.allowance(ns, true) == 0 {
				out.Namespaces[i].HostLimited = true
				break
			}
		}
	}
}

// saveCursors records where the next sweep starts: after the namespace
// this sweep's first pass last reached, and in each active namespace
// after the route that last got rows. Cursors of namespaces no longer
// active are dropped.
func (p *Planner) saveCursors(sp *sweepPlan) {
	p.cursorMu.Lock()
	defer p.cursorMu.Unlock()
	p.cursor = sp.reached
	clear(p.routeCursor) // keep the active namespaces' only
	for i, ns := range sp.names {
		if rs := sp.byNS[ns].routes; len(rs) > 0 {
			p.routeCursor[ns] = rs[(sp.nextStart[i]+len(rs)-1)%len(rs)].scope.TaskQueue
		}
	}
}

// routeRef is one eligible route of a sweep and the plan of its target
// host (nil: the route has no host ceiling).
type routeRef struct {
	scope outbox.ClaimScope
	host  *hostPlan
}

// nextRoute returns the index of the first route after the task_queue
// that last got rows (routes are sorted by task_queue), 0 if none.
func nextRoute(routes []routeRef, last string) int {
	if last == "" || len(routes) == 0 {
		return 0
	}
	i, found := slices.BinarySearchFunc(routes, last, func(r routeRef, tq string) int { return strings.Compare(r.scope.TaskQueue, tq) })
	if found {
		i++
	}
	return i % len(routes)
}

// hostReport lists the hosts' plans, sorted by host.
func hostReport(hosts map[string]*hostPlan) []HostSweep {
	if len(hosts) == 0 {
		return nil
	}
	out := make([]HostSweep, 0, len(hosts))
	for _, h := range hosts {
		out = append(out, h.report())
	}
	slices.SortFunc(out, func(a, b HostSweep) int { return strings.Compare(a.Host, b.Host) })
	return out
}

// claimSlice claims up to allocation rows of namespace ns, round-robin over
// its routes starting at routes[start]: each route is offered
// ceil(remaining / routes left), so a route with few rows yields the rest
// to the routes after it. Where the seed stops after one pass over the
// routes, this keeps going round the routes that filled their share until
// the allocation is met or every route has run dry, so a short route early
// in the list cannot leave budget unused.
//
// A route whose target host has a plan is also capped by what the host
// allows ns (hostPlan.allowance; utilisation selects pass 2's rule), and
// the running share is taken of what the live routes' hosts still allow,
// so a host with few slots spreads them over the namespace's task queues.
// It returns how many rows it claimed and the route index the
// namespace's next claim should start at (after the last route that got
// rows; start when none did).
func claimSlice(claim func(outbox.ClaimParams) ([]outbox.Row, error), ns string, routes []routeRef, start, allocation int, utilisation bool, p outbox.ClaimParams, into *[]outbox.Row) (int, int, error) {
	remaining, total, next := allocation, 0, start
	if remaining <= 0 || len(routes) == 0 {
		return 0, next, nil
	}
	live := make([]int, 0, len(routes)) // route indexes, in rotation order
	for k := range routes {
		i := (start + k) % len(routes)
		if h := routes[i].host; h == nil || h.allowance(ns, utilisation) > 0 {
			live = append(live, i)
		}
	}
	for remaining > 0 && len(live) > 0 {
		round := min(remaining, capacity(routes, live, ns, utilisation))
		var stillLive []int
		for k, i := range live {
			if round <= 0 {
				break
			}
			left := len(live) - k
			share := min(max((round+left-1)/left, 1), round)
			h := routes[i].host
			if h != nil {
				share = min(share, h.allowance(ns, utilisation))
				if share == 0 { // an earlier route used up this host
					continue
				}
			}
			scope := routes[i].scope
			p.Scope, p.Limit = &scope, share
			rows, err := claim(p)
			got := len(rows)
			*into = append(*into, rows...)
			remaining -= got
			round -= got
			total += got
			if h != nil {
				h.take(ns, got)
			}
			if got > 0 {
				next = (i + 1) % len(routes)
			}
			if err != nil {
				return total, next, fmt.Errorf("backpressure: claim %d rows of route %s: %w", share, scope, err)
			}
			if got == share && (h == nil || h.allowance(ns, utilisation) > 0) { // filled its share: it may have more
				stillLive = append(stillLive, i)
			}
		}
		live = stillLive
		if round > 0 && len(live) > 0 && capacity(routes, live, ns, utilisation) == 0 {
			break
		}
	}
	return total, next, nil
}

// capacity is how many rows the live routes may claim for ns as far as
// their hosts are concerned: the sum of each distinct host's allowance,
// or unbounded when a live route has no host ceiling.
func capacity(routes []routeRef, live []int, ns string, utilisation bool) int {
	sum := 0
	var seen map[*hostPlan]bool
	for _, i := range live {
		h := routes[i].host
		if h == nil {
			return math.MaxInt
		}
		if seen == nil {
			seen = map[*hostPlan]bool{}
		}
		if !seen[h] {
			seen[h] = true
			sum += h.allowance(ns, utilisation)
		}
	}
	return sum
}
