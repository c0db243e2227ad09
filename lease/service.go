package lease

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/quota"
	"github.com/fairshard/fairshard/shards"
)

// DemandStore is what the lease service reads of the node's store to
// measure demand: the maintained per-namespace counters and the routes
// with visible pending rows of owned shards.
type DemandStore interface {
	NamespaceStats(ctx context.Context) (map[string]outbox.NamespaceStats, error)
	PendingRoutes(ctx context.Context, now time.Time) ([]outbox.ClaimScope, error)
}

// ServiceConfig wires the node's lease service.
type ServiceConfig struct {
	Self       string
	ShardCount uint32
	// Timings are the lease length and refresh interval (zero: the
	// defaults; NewService validates them).
	Timings
	// Drain is the delivery timeout: how long a silent node's last
	// holding still counts after its grant expired (CoordinatorConfig).
	Drain     time.Duration
	Policies  *quota.Policies
	Ownership func() *cluster.OwnershipSnapshot
	// Terms gives when this node became primary of a shard under its
	// applied view (zero: it is not).
	Terms func(shard uint32) time.Time
	// LatestTerm returns the latest term start among the shards this
	// node owns (zero: none); its terms learn until that + the learning
	// period.
	LatestTerm func() time.Time
	Store      DemandStore
	Eligible   func(outbox.ClaimScope) bool
	// Call makes one lease call to the coordinator at apiAddr (an
	// authenticated POST of PathLeases on another node).
	Call func(ctx context.Context, apiAddr string, req Request) (Response, error)
	// Handoff ships a coordinator's records to the successor at apiAddr
	// (handoff.go); nil: nothing is shipped.
	Handoff func(ctx context.Context, apiAddr string, h Handoff) error
	// Wake asks the dispatcher for a sweep (a grant grew).
	Wake func()
	// Claims is the claim rule (quota.Claims): what this node reports it
	// has of each namespace.
	Claims quota.Claims
	// Label maps a namespace to its metrics label (--metrics-namespaces:
	// past the bound, "_other"); nil: the namespace itself.
	Label      func(ns string) string
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// Service is a node's part in exact quotas (docs/architecture.md
// "Exact quotas", docs/adr/0019-capacity-leases.md): the coordinator of
// every namespace whose coordinator shard (xxhash64(namespace) mod S) this
// node is primary of in its applied ownership view, served on POST
// /internal/v1/leases; and the client side, which once per refresh
// interval (or sooner when appends arrive) measures this node's demand for
// every exact-mode namespace and sends one batched call per coordinator
// node (sooner when a namespace is new here: afterSweep). Its grants are
// the planner's ceilings (quota.Leased over Client).
type Service struct {
	cfg    ServiceConfig
	coord  *Coordinator
	client *Client
	m      *serviceMetrics
	log    *slog.Logger
	wake   chan struct{}

	// shipping tracks the hand-off calls in flight (Run waits for them);
	// shipBusy names the successors with one in flight; failover is the
	// table of owners without this node for the view failoverOf.
	shipping   sync.WaitGroup
	shipMu     sync.Mutex
	shipBusy   map[string]bool
	failover   *shards.Table
	failoverOf *cluster.OwnershipSnapshot

	// wants is this node's last measured demand per namespace (rows), for
	// the namespace view.
	wantsMu sync.Mutex
	wants   map[string]uint32
	// changes is the client's coordinator-change count already exported.
	changes atomic.Uint64
}

func NewService(cfg ServiceConfig) (*Service, error) {
	if err := cfg.Timings.Validate(); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	l := &Service{cfg: cfg, log: cfg.Logger, wake: make(chan struct{}, 1), wants: map[string]uint32{}, shipBusy: map[string]bool{}}
	if l.log == nil {
		l.log = slog.New(slog.DiscardHandler)
	}
	var err error
	l.coord, err = NewCoordinator(CoordinatorConfig{
		LeaseLength:     cfg.LeaseLength,
		RefreshInterval: cfg.Refresh,
		Drain:           cfg.Drain,
		Coordinates:     l.coordinates,
		Quota: func(ns string) uint32 {
			return cfg.Policies.Policy(context.Background(), ns).Limit()
		},
		// Epoch stays 0 (the check off): the applied view's epochs are
		// per node, not comparable across nodes
		// (docs/adr/0020-coordinator-placement-and-learning.md).
		Reporters: func() []string {
			var names []string
			for _, m := range cfg.Ownership().Members {
				if m.State == cluster.MemberActive || m.State == cluster.MemberLeaving {
					names = append(names, m.Name)
				}
			}
			return names
		},
		Members: func() int {
			n := 0
			for _, m := range cfg.Ownership().Members {
				if m.State == cluster.MemberActive {
					n++
				}
			}
			return n
		},
	})
	if err != nil {
		return nil, err
	}
	l.client, err = NewClient(ClientConfig{Node: cfg.Self, RefreshInterval: cfg.Refresh})
	if err != nil {
		return nil, err
	}
	if l.m, err = newServiceMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	return l, nil
}

// coordinates implements CoordinatorConfig.Coordinates from the
// applied view: this node owns the namespace's coordinator shard, since
// it applied the view that gave it the shard.
func (l *Service) coordinates(ns string) (time.Time, bool) {
	shard := CoordinatorShard(ns, l.cfg.ShardCount)
	if !l.cfg.Ownership().Owns(shard) {
		return time.Time{}, false
	}
	since := l.cfg.Terms(shard)
	return since, !since.IsZero()
}

// coordinatorOf names namespace ns's coordinator under the applied view:
// the primary of its coordinator shard.
func (l *Service) coordinatorOf(ns string) (string, bool) {
	view := l.cfg.Ownership()
	return CoordinatorOf(ns, l.cfg.ShardCount, func(shard uint32) (string, bool) {
		p := view.ReplicaSet(shard).Primary()
		return p, p != ""
	})
}

// Grants is the client as quota.Leased reads it.
func (l *Service) Grants() quota.Grants { return l.client }

// Claiming marks a sweep in progress until done is called: see
// Client.Claiming (dispatch.Config.Claiming).
func (l *Service) Claiming() (done func()) { return l.client.Claiming() }

// Poke asks for a refresh soon (a namespace new on this node wants
// capacity: AfterSweep). It never blocks.
func (l *Service) Poke() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// asked reports whether ns was in this node's last lease demand.
func (l *Service) asked(ns string) bool {
	l.wantsMu.Lock()
	defer l.wantsMu.Unlock()
	_, ok := l.wants[ns]
	return ok
}

// AfterSweep runs after each of the dispatcher's sweeps: an exact-mode
// namespace that has visible pending rows here, no grant, and was not in
// this node's last lease demand (rows of it just arrived) asks for an
// early refresh, so a namespace new on this node gets capacity within a
// call instead of a refresh interval. Namespaces already asked for wait
// for the regular refresh, so lease traffic stays one call per
// coordinator per interval.
func (l *Service) AfterSweep(sw backpressure.Sweep) {
	for _, ns := range sw.Namespaces {
		if ns.Mode == quota.ModeExact && ns.Ceiling == 0 && ns.Routes > 0 && !l.asked(ns.Namespace) {
			l.Poke()
			return
		}
	}
}

// minPokeGap bounds how often appends can trigger an early refresh.
const minPokeGap = 20 * time.Millisecond

// run refreshes every NextRefresh (or on Poke, after minPokeGap)
// and expires the coordinator's stale state about once a lease, until ctx
// ends.
func (l *Service) Run(ctx context.Context) error {
	lastExpire, lastShip, lastFull := time.Now(), time.Time{}, time.Time{}
	defer l.shipping.Wait()
	for {
		l.refresh(ctx)
		if now := time.Now(); now.Sub(lastExpire) >= l.cfg.LeaseLength {
			l.coord.Expire(now)
			lastExpire = now
		}
		if now := time.Now(); now.Sub(lastShip) >= l.cfg.Refresh {
			// The calls run in the background: a successor that does not
			// answer (stopped, cut off) must not hold up this node's own
			// refreshes.
			lastShip = now
			full := now.Sub(lastFull) >= l.cfg.LeaseLength/4
			if full {
				lastFull = now
			}
			l.shipHandoffs(ctx, full)
		}
		l.m.coordinated.Set(float64(l.coord.Namespaces()))
		timer := time.NewTimer(l.client.NextRefresh())
		select {
		case <-ctx.Done():
			timer.Stop()
			return nil
		case <-timer.C:
		case <-l.wake:
			timer.Stop()
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(minPokeGap):
			}
		}
	}
}

// demand measures this node's demand for every exact-mode namespace with
// claimed rows or visible pending rows on an eligible route: wants =
// claimed + pending (the namespace's pending count, all of it, once it has
// a visible row on an eligible route: rows in retry backoff are counted
// too), at most the namespace's limit; claimed is every claimed row held
// here, or the deliveries running if more (as the planner counts them).
func (l *Service) demand(ctx context.Context) ([]Demand, error) {
	stats, err := l.cfg.Store.NamespaceStats(ctx)
	if err != nil {
		return nil, fmt.Errorf("lease demand: namespace stats: %w", err)
	}
	routes, err := l.cfg.Store.PendingRoutes(ctx, time.Now())
	if err != nil {
		return nil, fmt.Errorf("lease demand: pending routes: %w", err)
	}
	visible := map[string]bool{}
	for _, r := range routes {
		if !visible[r.Namespace] && (l.cfg.Eligible == nil || l.cfg.Eligible(r)) {
			visible[r.Namespace] = true
		}
	}
	held := make(map[string]int, len(stats))
	for ns, st := range stats {
		held[ns] = st.Claimed
	}
	// A namespace every row of which a merge replaced while its deliveries
	// run has no stats left, and still holds capacity (Claims.Of adds it).
	claimed := l.cfg.Claims.Of(held)
	out := make([]Demand, 0, len(visible))
	for ns, c := range claimed {
		st := stats[ns]
		st.Claimed = c
		if st.Claimed == 0 && !visible[ns] {
			continue
		}
		pol := l.cfg.Policies.Policy(ctx, ns)
		if pol.Mode != quota.ModeExact {
			continue
		}
		want := uint64(st.Claimed)
		if visible[ns] {
			want += uint64(st.Pending)
		}
		out = append(out, Demand{Namespace: ns, Wants: uint32(min(want, uint64(pol.Limit()))), Claimed: uint32(st.Claimed)})
	}
	return out, nil
}

// refresh runs one refresh: demand, one batched call per coordinator, and
// a sweep if a grant now leaves room for more claims.
func (l *Service) refresh(ctx context.Context) {
	var demand []Demand
	var measureErr error
	measure := func() ([]Demand, error) {
		demand, measureErr = l.demand(ctx)
		return demand, measureErr
	}
	results, derr := l.client.RefreshMeasured(ctx, 0, measure, l.coordinatorOf, l.transport)
	if measureErr != nil {
		if ctx.Err() == nil {
			l.log.Warn("lease refresh skipped: cannot measure demand", "error", measureErr)
		}
		return
	}
	wants := make(map[string]uint32, len(demand))
	for _, d := range demand {
		wants[d.Namespace] = d.Wants
	}
	l.wantsMu.Lock()
	l.wants = wants
	l.wantsMu.Unlock()
	if derr != nil {
		l.log.Warn("lease refresh: demand left out", "error", derr)
	}
	for _, r := range results {
		l.m.calls.Inc()
		l.m.latency.Observe(r.Latency.Seconds())
		if r.Err != nil {
			l.m.errors.Inc()
			if ctx.Err() == nil {
				l.log.Debug("lease call failed; grants kept until they expire", "coordinator", r.To, "namespaces", r.Namespaces, "error", r.Err)
			}
		}
	}
	if c := l.client.CoordinatorChanges(); c > l.changes.Load() {
		l.m.coordinatorChanges.Add(float64(c - l.changes.Load()))
		l.changes.Store(c)
	}
	now := time.Now()
	grow := false
	for _, d := range demand {
		if g, _, ok := l.client.Grant(d.Namespace, now); ok && g > d.Claimed && d.Wants > d.Claimed {
			grow = true
			break
		}
	}
	l.m.update(l.client.Status(now), wants, l.cfg.Label)
	if grow && l.cfg.Wake != nil {
		l.cfg.Wake()
	}
}

// release gives this node's grants back on a graceful stop, once the
// dispatcher has finished its deliveries (services.go): the other nodes
// get the capacity on their next refresh instead of after the grants
// expire. A hard stop (ctx done) releases nothing: the coordinator counts
// the grants until they expire.
func (l *Service) Release(ctx context.Context) error {
	if ctx.Err() != nil {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, l.leaseCallTimeout())
	defer cancel()
	for _, r := range l.client.Release(cctx, 0, l.coordinatorOf, l.transport) {
		l.m.calls.Inc()
		if r.Err != nil {
			l.m.errors.Inc()
			l.log.Info("lease release failed; the coordinator counts the grants until they expire", "coordinator", r.To, "namespaces", r.Namespaces, "error", r.Err)
		}
	}
	return nil
}

// leaseCallTimeout bounds one lease call: half a lease (at least 1 s). A
// slow answer is still worth having while the grant it renews has not
// expired; a refresh waits for all its calls, so a stuck coordinator
// delays the others' renewals by at most half a lease, and their grants
// (counted from the send) still have the other half.
func (l *Service) leaseCallTimeout() time.Duration {
	return max(time.Second, l.cfg.LeaseLength/2)
}

// transport makes one lease call: this node's own coordinator directly,
// another node's over POST /internal/v1/leases.
func (l *Service) transport(ctx context.Context, to string, req Request) (Response, error) {
	if to == l.cfg.Self {
		return l.coord.Handle(time.Now(), req)
	}
	addr := ""
	for _, m := range l.cfg.Ownership().Members {
		if m.Name == to {
			addr = m.APIAddr
			break
		}
	}
	if addr == "" {
		return Response{}, fmt.Errorf("coordinator %s has no API address in the applied view", to)
	}
	cctx, cancel := context.WithTimeout(ctx, l.leaseCallTimeout())
	defer cancel()
	return l.cfg.Call(cctx, addr, req)
}

// shipHandoffs ships the coordinator's records of every namespace it
// coordinates (all), or of those where a node holds more than the last
// shipment said, to the namespace's successors (handoff.go): the second
// member of its coordinator shard's replica set, and the member that
// would own the shard without this node if that is another one (the
// replica order follows the failover owner only where the load cap allows
// it). With no other active member nothing is shipped. One call per
// successor and batch, each successor on its own (one that does not
// answer delays nobody else's), bounded like a lease call; a failure is
// logged at debug and the next round ships again.
func (l *Service) shipHandoffs(ctx context.Context, all bool) {
	if l.cfg.Handoff == nil {
		return
	}
	view := l.cfg.Ownership()
	if view == nil || len(view.Owned) == 0 {
		return
	}
	var others []string
	for _, m := range view.Members {
		if m.State == cluster.MemberActive && m.Name != l.cfg.Self {
			others = append(others, m.Name)
		}
	}
	if len(others) == 0 {
		return
	}
	l.shipMu.Lock()
	if l.failover == nil || l.failoverOf != view {
		l.failover, l.failoverOf = shards.Assign(others, l.cfg.ShardCount), view
	}
	failover := l.failover
	l.shipMu.Unlock()
	successors := func(ns string) []string {
		shard := CoordinatorShard(ns, l.cfg.ShardCount)
		if !view.Owns(shard) {
			return nil
		}
		var out []string
		if rs := view.ReplicaSet(shard).Replicas; len(rs) >= 2 {
			out = append(out, rs[1])
		}
		if o := failover.Owner(shard); o != "" && (len(out) == 0 || out[0] != o) {
			out = append(out, o)
		}
		return out
	}
	for to, hs := range l.coord.Handoff(time.Now(), l.cfg.Self, successors, all) {
		m, ok := view.Member(to)
		if !ok || m.APIAddr == "" {
			continue
		}
		l.shipMu.Lock()
		if l.shipBusy[to] {
			l.shipMu.Unlock()
			continue // its last shipment is still in flight
		}
		l.shipBusy[to] = true
		l.shipMu.Unlock()
		l.shipping.Go(func() {
			defer func() {
				l.shipMu.Lock()
				delete(l.shipBusy, to)
				l.shipMu.Unlock()
			}()
			for _, h := range hs {
				cctx, cancel := context.WithTimeout(ctx, l.leaseCallTimeout())
				err := l.cfg.Handoff(cctx, m.APIAddr, h)
				cancel()
				if err != nil {
					if ctx.Err() == nil {
						l.log.Debug("coordinator hand-off to the successor failed; the next round ships again",
							"successor", to, "namespaces", len(h.Namespaces), "err", err)
					}
					return
				}
			}
		})
	}
}

// HandleHandoff serves the node's API: a coordinator's records shipped
// to this node as the successor of their namespaces (handoff.go). It
// returns how many namespaces it kept.
func (l *Service) HandleHandoff(h Handoff) int {
	return l.coord.Inherit(time.Now(), h)
}

// HandleLease serves the node's API: the coordinator's answer to
// another node's batched call.
func (l *Service) HandleLease(req Request) (Response, error) {
	return l.coord.Handle(time.Now(), req)
}

// CoordinatorStatus serves the node's API: this node's coordinator
// state of ns; when it coordinates ns but no node has asked lately, the
// term alone (since, learning) with no nodes. ok is false when it does not
// coordinate ns.
func (l *Service) CoordinatorStatus(ns string) (NamespaceStatus, bool) {
	now := time.Now()
	if st, ok := l.coord.Status(now, ns); ok {
		return st, true
	}
	since, ok := l.coordinates(ns)
	if !ok {
		return NamespaceStatus{}, false
	}
	until := since.Add(l.coord.Config().LearningPeriod)
	return NamespaceStatus{Namespace: ns, Since: since, Learning: now.Before(until), LearningUntil: until,
		Nodes: []NodeStatus{}}, true
}

// Learning serves the node's API: whether a coordinator term of this
// node (a shard it became primary of) is still in its learning period.
func (l *Service) Learning() bool {
	if l.cfg.LatestTerm == nil {
		return false
	}
	return time.Now().Before(l.cfg.LatestTerm().Add(l.coord.Config().LearningPeriod))
}

// NodeLease serves the node's API: this node's side of ns's
func (l *Service) NodeLease(ns string) NodeLease {
	out := NodeLease{}
	out.Coordinator, _ = l.coordinatorOf(ns)
	l.wantsMu.Lock()
	out.Wants = l.wants[ns]
	l.wantsMu.Unlock()
	now := time.Now()
	if g, exp, ok := l.client.Grant(ns, now); ok {
		out.Grant, out.Expires = g, exp
		for _, st := range l.client.Status(now) {
			if st.Namespace == ns {
				out.GrantedBy, out.Learning = st.Coordinator, st.Learning
				break
			}
		}
	}
	return out
}

// serviceMetrics are the lease service's metrics: grants, wants, refresh
// latency, coordinator changes.
type serviceMetrics struct {
	grant              *prometheus.GaugeVec
	wants              *prometheus.GaugeVec
	calls              prometheus.Counter
	errors             prometheus.Counter
	latency            prometheus.Histogram
	coordinatorChanges prometheus.Counter
	coordinated        prometheus.Gauge
	seen               map[string]bool
}

func newServiceMetrics(reg prometheus.Registerer) (*serviceMetrics, error) {
	m := &serviceMetrics{
		grant: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fairshard_lease_grant_rows", Help: "This node's unexpired capacity lease (its ceiling) per exact-mode namespace, rows.",
		}, []string{"namespace"}),
		wants: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fairshard_lease_wants_rows", Help: "This node's last reported demand (claimed + pending, at most the quota) per exact-mode namespace, rows.",
		}, []string{"namespace"}),
		calls: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_lease_calls_total", Help: "Batched lease calls made (one per coordinator node per refresh, whatever the number of namespaces).",
		}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_lease_call_errors_total", Help: "Lease calls that failed (grants are kept until they expire).",
		}),
		// Buckets from 0.5 ms (a local call) to 2.5 s (past the call
		// timeout's floor of 1 s: a stuck coordinator).
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "fairshard_lease_refresh_duration_seconds", Help: "Time from sending a batched lease call to applying its answer.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5},
		}),
		coordinatorChanges: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "fairshard_lease_coordinator_changes_total", Help: "Times a namespace's grant came from another coordinator than before (failover or ownership move).",
		}),
		coordinated: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "fairshard_lease_coordinated_namespaces", Help: "Namespaces this node coordinates and holds lease state for.",
		}),
		seen: map[string]bool{},
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.grant, m.wants, m.calls, m.errors, m.latency, m.coordinatorChanges, m.coordinated} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// update sets the per-namespace gauges from the client's grants and the
// measured wants, summed per metrics label (label maps a namespace to it;
// nil: the namespace), dropping labels that have neither. Called by the
// refresh loop only.
func (m *serviceMetrics) update(grants []GrantStatus, wants map[string]uint32, label func(string) string) {
	if label == nil {
		label = func(ns string) string { return ns }
	}
	cur := make(map[string]bool, len(grants)+len(wants))
	granted := make(map[string]float64, len(grants))
	wanted := make(map[string]float64, len(wants))
	for _, g := range grants {
		l := label(g.Namespace)
		cur[l] = true
		granted[l] += float64(g.Grant)
	}
	for ns, w := range wants {
		l := label(ns)
		cur[l] = true
		wanted[l] += float64(w)
	}
	for l := range m.seen {
		if !cur[l] {
			m.grant.DeleteLabelValues(l)
			m.wants.DeleteLabelValues(l)
		}
	}
	for l := range cur {
		m.grant.WithLabelValues(l).Set(granted[l])
		m.wants.WithLabelValues(l).Set(wanted[l])
	}
	m.seen = cur
}

// NodeLease is this node's side of a namespace's capacity lease, as GET
// /v1/namespaces/{ns} shows it.
type NodeLease struct {
	// Coordinator is the node that coordinates the namespace under this
	// node's applied view (the primary of shard xxhash64(ns) mod S).
	Coordinator string `json:"coordinator"`
	// Wants is this node's last reported demand (claimed + pending, at
	// most the quota; rows).
	Wants uint32 `json:"wants"`
	// Grant is this node's unexpired grant (rows), its ceiling; 0 without
	// one.
	Grant uint32 `json:"grant"`
	// Expires is when the grant lapses without a refresh (absent without
	// a grant).
	Expires time.Time `json:"expires,omitzero"`
	// GrantedBy is the coordinator that granted it.
	GrantedBy string `json:"granted_by,omitempty"`
	// Learning says the granting coordinator was learning after a
	// failover (it only confirms what nodes hold).
	Learning bool `json:"learning"`
}
