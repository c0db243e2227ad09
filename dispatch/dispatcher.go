package dispatch

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/quota"
)

// Dispatcher claims rows fairly through the planner, delivers each claimed
// row to its route's target over HTTP and settles it on the store. It is
// safe for concurrent use. A Dispatcher runs once: build it with New, run
// it with Run, stop it gracefully with Drain and hard by cancelling Run's
// context.
type Dispatcher struct {
	cfg          Config
	client       *http.Client
	ownTransport *http.Transport // built by New, closed when Run returns; nil if injected
	hosts        *HostLimits     // per-target-host limits and rows in flight
	m            *metrics
	// startedAt is the clock reading at New: claims older than it were
	// made by an earlier run of this node (RearmAllOnStart).
	startedAt time.Time

	wake   chan struct{} // 1-buffered: Wake's coalescing signal
	refill chan struct{} // 1-buffered: a slot or headroom a short sweep wanted is free (wakeRefill)

	// sweepMu serialises sweeps (two concurrent sweeps could together
	// exceed a ceiling; backpressure package doc). It also guards knownNS.
	sweepMu sync.Mutex
	knownNS map[string]uint32 // namespace → last reported per-node ceiling

	// deliveryCtx parents every delivery attempt; cancelled only by a hard
	// stop (Run's ctx ending) or when Run returns.
	deliveryCtx      context.Context
	cancelDeliveries context.CancelFunc
	deliveries       sync.WaitGroup // delivery goroutines

	// limited is set when the last sweep left work behind for want of
	// headroom or budget: settles then wake the loop. hostLimited is set
	// when it left rows behind for want of a target host's slots: answers
	// then wake it (after RefillDebounce).
	limited        atomic.Bool
	hostLimited    atomic.Bool
	startRearmDone atomic.Bool
	warnedPolicy   sync.Map // namespace → struct{}: invalid override logged once
	warnedUngated  atomic.Bool

	mu            sync.Mutex
	claimsStopped bool               // Drain or Run's end: SweepOnce claims nothing more
	runStarted    bool               // Run was called
	loopsStarted  bool               // Run started its loops (it was not drained first)
	stopClaims    context.CancelFunc // ends Run's loops; set with loopsStarted
	loopsDone     chan struct{}      // closed when Run's loops exited and no sweep is launching
	inflight      map[string]int     // dispatch_key → deliveries running (normally 1)
	inflightNS    map[string]int     // namespace → deliveries running
	settlingNS    map[string]int     // namespace → of those, answered and settling (Deliveries)
	nInflight     int
	idle          chan struct{} // closed (and cleared) when nInflight drops to 0
	waiting       []outbox.ClaimScope
}

// New validates cfg (after filling defaults) and builds a Dispatcher. It
// registers the metrics on cfg.Registerer. Errors wrap ErrInvalidConfig
// and name the bad fields, or report a metrics registration conflict.
// Nothing runs until Run (or SweepOnce) is called.
func New(cfg Config) (*Dispatcher, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	d := &Dispatcher{
		cfg:        cfg,
		m:          m,
		startedAt:  cfg.Now(),
		wake:       make(chan struct{}, 1),
		refill:     make(chan struct{}, 1),
		knownNS:    map[string]uint32{},
		loopsDone:  make(chan struct{}),
		inflight:   map[string]int{},
		inflightNS: map[string]int{},
		settlingNS: map[string]int{},
	}
	d.hosts = cfg.Hosts
	if d.hosts == nil {
		if d.hosts, err = NewHostLimits(HostLimitsConfig{
			Targets: cfg.Targets, MaxConnsPerHost: cfg.MaxConnsPerHost,
			InitialConnsPerHost: cfg.InitialConnsPerHost, Registerer: cfg.Registerer,
		}); err != nil {
			m.unregister(cfg.Registerer)
			return nil, err
		}
	}
	rt := cfg.Transport
	if rt == nil {
		d.ownTransport = newTransport(cfg)
		rt = d.ownTransport
	}
	d.client = &http.Client{
		Transport: rt,
		// Redirects are not followed: a 3xx is an answer (a permanent
		// failure), never a reason to POST the payload elsewhere.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	d.deliveryCtx, d.cancelDeliveries = context.WithCancel(context.Background())
	return d, nil
}

// Run re-arms the claims this node held before it stopped
// (RearmAllOnStart), then sweeps until ctx ends or Drain is called: a sweep
// runs on every jittered PollInterval tick and, debounced by WakeDebounce,
// after Wake. Claimed rows are delivered concurrently, without waiting
// for them. A reaper re-arms stale claims every RearmInterval.
//
// Stopping:
//   - graceful: Drain stops claiming and waits for the in-flight rows;
//     Run returns once they are settled (or abandoned by a hard stop);
//   - hard: cancelling ctx stops claiming and cancels in-flight deliveries
//     at once; their rows stay claimed and are re-armed by the visibility
//     timeout (or by RearmAllOnStart on the next start). Deliveries that
//     already have an answer are still settled (SettleTimeout).
//
// Run returns nil after every goroutine it started has exited; nil at once
// if Drain was called before it (so a stop racing the start is benign);
// ErrStopped at once if Run was called before. Store errors never end Run:
// they are logged, counted and retried next tick.
func (d *Dispatcher) Run(ctx context.Context) error {
	d.mu.Lock()
	if d.runStarted {
		d.mu.Unlock()
		return ErrStopped
	}
	if d.claimsStopped { // drained before it ran: nothing to do
		d.runStarted = true
		d.mu.Unlock()
		return nil
	}
	claimCtx, stopClaims := context.WithCancel(ctx)
	d.runStarted, d.loopsStarted, d.stopClaims = true, true, stopClaims
	d.mu.Unlock()
	stopHard := context.AfterFunc(ctx, d.cancelDeliveries)
	defer stopHard()
	defer stopClaims()

	if _, err := d.RearmAllOnStart(claimCtx); err != nil && claimCtx.Err() == nil {
		// The reaper retries the start pass on its next tick.
		d.m.sweepErrors.Inc()
		d.cfg.Logger.Warn("dispatch: re-arm of claims left from before start failed; retrying on the next re-arm tick", "error", err)
	}
	var loops sync.WaitGroup
	loops.Go(func() { d.sweepLoop(claimCtx) })
	loops.Go(func() { d.reapLoop(claimCtx) })
	loops.Wait()

	// Claims have stopped; wait for a SweepOnce called from outside to
	// finish launching, then let nothing launch again.
	d.sweepMu.Lock()
	d.mu.Lock()
	d.claimsStopped = true
	close(d.loopsDone)
	d.mu.Unlock()
	d.sweepMu.Unlock()

	d.deliveries.Wait()
	d.cancelDeliveries()
	if d.ownTransport != nil {
		d.ownTransport.CloseIdleConnections()
	}
	return nil
}

// Drain is the graceful stop: it stops claiming (Run's loops end; later
// SweepOnce calls claim nothing), then waits until no delivery is in flight
// or ctx ends. It returns nil when every claimed row has been settled (or
// abandoned by a hard stop), or an error wrapping ctx.Err() naming how many
// deliveries are still running; those keep running until they finish or
// Run's context is cancelled. Drain is safe to call more than once and
// before Run (Run then returns nil at once). Without Run, Drain also waits
// for the delivery goroutines of SweepOnce calls and closes idle
// connections.
func (d *Dispatcher) Drain(ctx context.Context) error {
	d.mu.Lock()
	d.claimsStopped = true
	running, stop := d.loopsStarted, d.stopClaims
	d.mu.Unlock()
	if running {
		stop()
		select {
		case <-d.loopsDone:
		case <-ctx.Done():
			return fmt.Errorf("dispatch: drain: sweep loop still running: %w", ctx.Err())
		}
	} else {
		// A SweepOnce in progress may still be launching its rows.
		d.sweepMu.Lock()
		d.sweepMu.Unlock() //nolint:staticcheck // empty critical section: a barrier
	}
	select {
	case <-d.idleCh():
	case <-ctx.Done():
		return fmt.Errorf("dispatch: drain: %d deliveries still in flight: %w", d.InFlight(), ctx.Err())
	}
	if !running {
		d.deliveries.Wait()
		d.cancelDeliveries()
		if d.ownTransport != nil {
			d.ownTransport.CloseIdleConnections()
		}
	}
	return nil
}

// wakeRefill asks for a sweep after RefillDebounce: a delivery's answer
// freed a host slot that the last sweep was short of. Waiting a little lets one sweep refill the slots of many
// answers instead of one sweep per answer; a Wake meanwhile (an append)
// still sweeps after WakeDebounce.
func (d *Dispatcher) wakeRefill() {
	select {
	case d.refill <- struct{}{}:
	default:
	}
}

// Hosts returns the per-target-host limits the dispatcher counts its
// deliveries against (Config.Hosts, or the one New built).
func (d *Dispatcher) Hosts() *HostLimits { return d.hosts }

// Wake asks for a sweep soon (after WakeDebounce) instead of at the next
// poll tick. It never blocks; wakes that arrive while one is pending merge
// into it. The node calls it after an append lands; the dispatcher calls it
// itself when a settle frees headroom that a sweep was short of.
func (d *Dispatcher) Wake() {
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// Eligible reports whether a route may be claimed now: its namespace is not
// paused and it has a usable delivery target (an absolute http or https
// URL). The dispatcher applies it to every
// sweep itself (it filters the store's pending-route listing), so the
// node's PlannerConfig.Eligible may stay nil; the node may also use it to
// say why a namespace's rows wait.
func (d *Dispatcher) Eligible(route outbox.ClaimScope) bool {
	if d.cfg.Paused != nil && d.cfg.Paused(route.Namespace) {
		return false
	}
	return d.hasTarget(route)
}

// hasTarget reports whether the route has a usable target: configured, its
// URL, once the route's placeholders are substituted, an absolute http or
// https URL (a placeholder may stand in the host). A route whose target
// URL is malformed waits like one without target (a configuration error
// must not burn the rows' attempts).
func (d *Dispatcher) hasTarget(route outbox.ClaimScope) bool {
	_, ok := d.hosts.HostOf(route)
	return ok
}

// RoutesWithoutTarget returns the routes that had visible pending rows but
// no usable delivery target (none configured, or a URL that is not an
// absolute http(s) URL) at the last sweep, sorted by (namespace,
// task_queue). Their rows wait pending. Paused namespaces are not listed.
// The slice is the caller's.
func (d *Dispatcher) RoutesWithoutTarget() []outbox.ClaimScope {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.waiting)
}

// InFlight returns how many rows this process is delivering right now.
func (d *Dispatcher) InFlight() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.nInflight
}

// SweepOnce runs one sweep: it asks the planner for up to
// min(BatchSize, MaxInFlight − in flight) rows, excluding held workflows
// and ineligible routes (paused namespaces, routes without target), hands
// every claimed row to its own delivery goroutine without waiting, and
// updates the sweep metrics. It returns the planner's report; on a store
// error it returns the error too (wrapped by the planner with the step and
// route), after delivering the rows already claimed. After Drain (or once
// Run has returned) it claims nothing and returns a zero Sweep.
//
// Run calls it on every tick; tests and tools may call it directly (wait
// for its deliveries with Drain). Sweeps are serialised.
func (d *Dispatcher) SweepOnce(ctx context.Context) (backpressure.Sweep, error) {
	d.sweepMu.Lock()
	defer d.sweepMu.Unlock()
	d.mu.Lock()
	stopped := d.claimsStopped
	budget := min(d.cfg.BatchSize, d.cfg.MaxInFlight-d.nInflight)
	d.mu.Unlock()
	if stopped {
		return backpressure.Sweep{}, nil
	}
	if budget <= 0 {
		d.limited.Store(true) // the next settle wakes us
		return backpressure.Sweep{}, nil
	}
	if d.cfg.Writable != nil && d.cfg.Writable() != nil {
		return backpressure.Sweep{}, nil
	}
	gen := d.fenceGen()
	if !d.allowed(gen) {
		return backpressure.Sweep{}, nil // a pause is being handled: claim nothing yet
	}
	var held map[string]struct{}
	if d.cfg.Held != nil {
		held = d.cfg.Held()
	}
	start := time.Now()
	done := func() {}
	if d.cfg.Claiming != nil {
		done = d.cfg.Claiming()
	}
	sw, err := d.cfg.Planner.Sweep(ctx, d.cfg.Store, backpressure.SweepRequest{Batch: budget, Held: held, Eligible: d.Eligible})
	done()
	d.m.sweepDur.Observe(time.Since(start).Seconds())
	d.report(sw, budget) // first: a delivery may end before launch returns, and its answer wakes a short sweep
	if d.cfg.AfterSweep != nil {
		d.cfg.AfterSweep(sw)
	}
	d.launch(sw.Rows, gen)
	if err != nil {
		if ctx.Err() == nil {
			d.m.sweepErrors.Inc()
			d.cfg.Logger.Warn("dispatch: sweep failed; retrying on the next tick",
				"error", err, "num_rows_claimed", len(sw.Rows))
		}
		return sw, err
	}
	return sw, nil
}

// fenceGen is the fence's generation now (0 without a fence).
func (d *Dispatcher) fenceGen() uint64 {
	if d.cfg.Fence == nil {
		return 0
	}
	return d.cfg.Fence.Gen()
}

// allowed reports whether an action of fence generation gen may reach the
// world now (always, without a fence).
func (d *Dispatcher) allowed(gen uint64) bool {
	return d.cfg.Fence == nil || d.cfg.Fence.Allow(gen)
}

// Deliveries snapshots, under one lock, the deliveries running per
// namespace (rows, from a claim's launch until its settle returned,
// whatever a merge did to its stored state meanwhile) and those of them
// settling: the target answered, or the row was never sent, and the
// settle is being written. It is what quota.Claims.Deliveries reads.
func (d *Dispatcher) Deliveries() quota.Deliveries {
	d.mu.Lock()
	defer d.mu.Unlock()
	return quota.Deliveries{Running: maps.Clone(d.inflightNS), Settling: maps.Clone(d.settlingNS)}
}

// report turns a sweep into metrics and the wake-on-settle decision.
// Called with sweepMu held.
func (d *Dispatcher) report(sw backpressure.Sweep, budget int) {
	limited, hostLimited := len(sw.Rows) >= budget, false
	seen := make(map[string]bool, len(sw.Namespaces))
	// Gauges are summed per label value: namespaces past the label bound
	// share one ("_other"), so each is set once with the sum.
	type gauges struct{ claimed, ceiling, headroom float64 }
	byLabel := map[string]*gauges{}
	add := func(ns string, claimed, ceiling, headroom float64) {
		l := d.cfg.NamespaceLabel(ns)
		g := byLabel[l]
		if g == nil {
			g = &gauges{}
			byLabel[l] = g
		}
		g.claimed += claimed
		g.ceiling += ceiling
		g.headroom += headroom
	}
	for _, ns := range sw.Namespaces {
		seen[ns.Namespace] = true
		d.knownNS[ns.Namespace] = ns.Ceiling
		label := d.cfg.NamespaceLabel(ns.Namespace)
		if ns.Claimed > 0 {
			d.m.claimed.WithLabelValues(label).Add(float64(ns.Claimed))
		}
		add(ns.Namespace, float64(ns.ClaimedBefore+ns.Claimed), float64(ns.Ceiling), float64(ns.Headroom()))
		if ns.AtCeiling() {
			d.m.atCeiling.WithLabelValues(label).Inc()
			limited = true
		}
		if ns.HostLimited {
			hostLimited = true // an answer from that host frees a slot
		}
	}
	if len(sw.Rows) > 0 && len(sw.Hosts) == 0 && !d.warnedUngated.Load() {
		if _, gated := d.hosts.HostOf(sw.Rows[0].Route()); gated && !d.warnedUngated.Swap(true) {
			d.cfg.Logger.Warn("dispatch: the planner claims without the target hosts' limits (give it the dispatcher's HostLimits: PlannerConfig.Hosts); " +
				"rows may wait for a connection inside their delivery timeout")
		}
	}
	d.mu.Lock()
	// A namespace with no visible pending rows is not in the report: its
	// claimed rows are this process's own deliveries.
	for ns, ceiling := range d.knownNS {
		if seen[ns] {
			continue
		}
		n := d.inflightNS[ns]
		add(ns, float64(n), float64(ceiling), float64(max(int(ceiling)-n, 0)))
	}
	for l, g := range byLabel {
		d.m.claimedNow.WithLabelValues(l).Set(g.claimed)
		d.m.ceiling.WithLabelValues(l).Set(g.ceiling)
		d.m.headroom.WithLabelValues(l).Set(g.headroom)
	}
	if sw.Listed {
		// The routes left out that are not paused wait for a target.
		d.waiting = d.waiting[:0]
		for _, r := range sw.Ineligible {
			if d.cfg.Paused == nil || !d.cfg.Paused(r.Namespace) {
				d.waiting = append(d.waiting, r)
			}
		}
		d.m.routesNoTarget.Set(float64(len(d.waiting)))
	}
	d.mu.Unlock()
	d.limited.Store(limited)
	d.hostLimited.Store(hostLimited)
	if len(sw.Rows) > 0 && len(sw.Rows) >= budget && budget == d.cfg.BatchSize {
		// A full batch: more may be claimable right away.
		d.Wake()
	}
}

// launch registers rows as in flight and starts one delivery goroutine per
// row; gen is the fence generation their sweep started in. Called with sweepMu held and claims not stopped.
func (d *Dispatcher) launch(rows []outbox.Row, gen uint64) {
	if len(rows) == 0 {
		return
	}
	d.mu.Lock()
	for i := range rows {
		d.inflight[rows[i].DispatchKey]++
		d.inflightNS[rows[i].Namespace]++
	}
	d.nInflight += len(rows)
	d.m.inFlight.Add(float64(len(rows)))
	d.mu.Unlock()
	d.deliveries.Add(len(rows))
	now := time.Now()
	type routeHost struct {
		host  string
		gated bool
	}
	hostOf := map[outbox.ClaimScope]routeHost{} // rows of a sweep share few routes
	for _, row := range rows {
		// Count the row against its target host before the next sweep
		// reads the host's usage (sweeps are serialised under sweepMu).
		rh, seen := hostOf[row.Route()]
		if !seen {
			rh.host, rh.gated = d.hosts.HostOf(row.Route())
			hostOf[row.Route()] = rh
		}
		host, gated := rh.host, rh.gated
		hostInflight := 0
		if gated {
			hostInflight = d.hosts.acquire(host, row.Namespace, now)
		}
		go func() {
			defer d.deliveries.Done()
			answered := d.deliverAndSettle(row, host, hostInflight, gen)
			d.finish(&row, answered)
		}()
	}
}

// answered counts a delivery whose target has answered (or that was
// never sent) as settling, and wakes the loop if the last sweep was short
// of headroom: its slot is free for the next row while the settle commits
// (quota.Claims).
func (d *Dispatcher) answered(row *outbox.Row) {
	d.mu.Lock()
	d.settlingNS[row.Namespace]++
	d.mu.Unlock()
	if d.limited.Load() {
		d.Wake()
	}
}

// finish removes a row from the in-flight set (and from the settling
// counts when answered marked it) and wakes the loop if the last sweep was
// short of headroom.
func (d *Dispatcher) finish(row *outbox.Row, settling bool) {
	d.mu.Lock()
	if settling {
		if d.settlingNS[row.Namespace]--; d.settlingNS[row.Namespace] <= 0 {
			delete(d.settlingNS, row.Namespace)
		}
	}
	if d.inflight[row.DispatchKey]--; d.inflight[row.DispatchKey] <= 0 {
		delete(d.inflight, row.DispatchKey)
	}
	if d.inflightNS[row.Namespace]--; d.inflightNS[row.Namespace] <= 0 {
		delete(d.inflightNS, row.Namespace)
	}
	d.nInflight--
	d.m.inFlight.Dec() // before idle is signalled, so waiters see 0
	if d.nInflight == 0 && d.idle != nil {
		close(d.idle)
		d.idle = nil
	}
	d.mu.Unlock()
	if d.limited.Load() {
		d.Wake() // headroom a sweep was short of is free: sweep now, not at the next tick
	}
}

// idleCh returns a channel closed once no delivery is in flight.
func (d *Dispatcher) idleCh() <-chan struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.nInflight == 0 {
		c := make(chan struct{})
		close(c)
		return c
	}
	if d.idle == nil {
		d.idle = make(chan struct{})
	}
	return d.idle
}

// inflightKeys snapshots the dispatch_keys being delivered (the reaper's
// exclusions).
func (d *Dispatcher) inflightKeys() map[string]struct{} {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make(map[string]struct{}, len(d.inflight))
	for k := range d.inflight {
		out[k] = struct{}{}
	}
	return out
}

// sweepLoop sweeps once at start, then on every jittered poll tick, after
// WakeDebounce on Wake and after max(RefillDebounce, the last sweep's
// duration) on wakeRefill, until ctx ends. The gaps count from the end of
// the last sweep.
func (d *Dispatcher) sweepLoop(ctx context.Context) {
	timer := time.NewTimer(d.pollJitter())
	defer timer.Stop()
	debounce := time.NewTimer(time.Hour)
	debounce.Stop() // armed only after a wake (Go ≥ 1.23: no stale tick)
	for {
		start := time.Now()
		_, _ = d.SweepOnce(ctx) // errors are logged and counted inside
		lastEnd := time.Now()
		timer.Reset(d.pollJitter())
		wait := time.Duration(0)
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		case <-d.wake:
			wait = d.cfg.WakeDebounce
		case <-d.refill:
			// Refills wait at least as long as the last sweep took: the
			// loop spends at most about half its time refilling, and
			// deliveries keep the CPU for the rest.
			wait = max(d.cfg.RefillDebounce, lastEnd.Sub(start))
		}
		for wait > 0 {
			gap := wait - time.Since(lastEnd)
			if gap <= 0 {
				break
			}
			debounce.Reset(gap)
			select {
			case <-ctx.Done():
				return
			case <-debounce.C:
				wait = 0
			case <-d.wake: // an append does not wait for a refill's gap
				debounce.Stop()
				wait = d.cfg.WakeDebounce
			}
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// pollJitter returns PollInterval spread by ±10 %, so nodes do not sweep
// in lock step.
func (d *Dispatcher) pollJitter() time.Duration {
	return time.Duration(float64(d.cfg.PollInterval) * (0.9 + 0.2*rand.Float64()))
}
