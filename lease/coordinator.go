package lease

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fairshard/fairshard/backpressure"
)

// Defaults for CoordinatorConfig.
const (
	// DefaultLeaseLength is how long a grant lasts without a refresh. It
	// is longer than memberlist's usual failure detection (a few seconds
	// with the LAN defaults), so nodes still hold their grants when a
	// crashed coordinator's successor is known, and the successor's
	// learning confirms them instead of starting from zero.
	DefaultLeaseLength = 10 * time.Second
	// DefaultRefreshInterval is how often a node refreshes its leases: 40
	// refreshes per lease, so a few lost calls never let a lease lapse.
	DefaultRefreshInterval = 250 * time.Millisecond
	// DefaultTurnRefreshes is CoordinatorConfig.Turn in refresh intervals
	// (2 s with the default interval): long beside the one or two refreshes
	// a row takes to change hands, short beside how long a user waits.
	DefaultTurnRefreshes = 8
)

// CoordinatorConfig configures a Coordinator. Coordinates and Quota are
// required.
type CoordinatorConfig struct {
	// LeaseLength is how long a grant is valid after the coordinator
	// answers (default DefaultLeaseLength). At most MaxLeaseMS.
	LeaseLength time.Duration
	// RefreshInterval is how often nodes are told to refresh (default
	// DefaultRefreshInterval); at most LeaseLength.
	RefreshInterval time.Duration
	// Drain is how long after a silent node's grant has expired its last
	// holding still counts against the quota: a node that lost its lease
	// claims nothing new, but the rows it had claimed may still be in
	// flight for up to the delivery timeout. 0 assumes they end with the
	// lease. The node sets its delivery timeout here.
	Drain time.Duration
	// LearningPeriod is how long a new coordinator of a namespace only
	// confirms what nodes report they hold (default LeaseLength: by then
	// every grant of the previous coordinator has expired). Nodes that
	// reach the new coordinator report their claimed rows, so that is
	// exact for a crash or a move; a node that still runs rows but cannot
	// reach the new coordinator is covered only with LeaseLength + Drain,
	// not the default because it stalls growth after every failover
	// (docs/adr/0020-coordinator-placement-and-learning.md). Negative: no
	// learning. Learning ends sooner once every member has reported
	// (Reporters).
	LearningPeriod time.Duration
	// Reporters returns the names of the members of the coordinator's view
	// that may hold grants (active and leaving). When set, a namespace's
	// learning ends as soon as each of them has reported to this term:
	// a node's report counts its unexpired grant in its has (Ask.Has), so
	// once every member has reported, every grant a previous coordinator
	// may have handed a member is counted, and new capacity can be handed
	// out without waiting for those grants to expire. A member with no
	// demand and no grant never reports, so the namespace then learns for
	// the whole period. nil: learning always lasts LearningPeriod.
	Reporters func() []string
	// Coordinates reports whether this node coordinates namespace under
	// its applied ownership view (it is the primary of
	// CoordinatorShard(namespace)), and since when: the time it applied the
	// view that made it so. A different since later starts a new term:
	// the namespace's state is dropped and learning starts again. A since
	// older than LearningPeriod skips learning (a node that founded the
	// cluster alone knows nobody coordinated before it).
	Coordinates func(namespace string) (since time.Time, ok bool)
	// Quota returns the namespace's cluster-wide limit (rows): its quota,
	// or 0 when paused (quota.Policy.Limit).
	Quota func(namespace string) uint32
	// Epoch returns this node's applied ownership epoch, comparable across
	// nodes (0 or nil: unknown; requests are then never refused for it).
	Epoch func() uint64
	// Members returns how many nodes may have demand (the active members
	// of the coordinator's view); nil or 0: unknown. When set, for one
	// refresh interval after the coordinator starts holding state for a
	// namespace (the first ask since it was idle, or a new term) no node
	// is granted more than max(its has, ceil(limit / members)): the other
	// nodes with rows have not asked yet, and a first asker handed the
	// whole quota would have to give it back through two of its own
	// refreshes before they get any.
	Members func() int
	// Turn is how long a node keeps a contended row before a node that has
	// waited longer gets it (default DefaultTurnRefreshes ×
	// RefreshInterval). A row is contended when the quota does not divide
	// evenly between the nodes that want it (FairShare's rows left over,
	// e.g. quota 2 and three nodes with backlogs): those rows go round the
	// waiting nodes, one Turn each, instead of staying with whoever holds
	// them while it keeps a backlog, which would leave the others' rows
	// waiting for as long as the holders have any.
	Turn time.Duration
}

func (c *CoordinatorConfig) withDefaults() (CoordinatorConfig, error) {
	out := *c
	out.LeaseLength = cmp.Or(out.LeaseLength, DefaultLeaseLength)
	out.RefreshInterval = cmp.Or(out.RefreshInterval, min(DefaultRefreshInterval, out.LeaseLength))
	out.LearningPeriod = cmp.Or(out.LearningPeriod, out.LeaseLength)
	out.Turn = cmp.Or(out.Turn, DefaultTurnRefreshes*out.RefreshInterval)
	if out.Epoch == nil {
		out.Epoch = func() uint64 { return 0 }
	}
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if out.LeaseLength < time.Millisecond || out.LeaseLength > MaxLeaseMS*time.Millisecond {
		bad("LeaseLength %v is outside [1ms, %v]", out.LeaseLength, MaxLeaseMS*time.Millisecond)
	}
	if out.RefreshInterval < time.Millisecond || out.RefreshInterval > out.LeaseLength {
		bad("RefreshInterval %v is outside [1ms, LeaseLength %v]", out.RefreshInterval, out.LeaseLength)
	}
	if out.Drain < 0 {
		bad("Drain %v is negative", out.Drain)
	}
	if out.Turn < 0 {
		bad("Turn %v is negative", out.Turn)
	}
	if out.Coordinates == nil {
		bad("Coordinates is required")
	}
	if out.Quota == nil {
		bad("Quota is required")
	}
	if err := errors.Join(errs...); err != nil {
		return out, fmt.Errorf("lease: coordinator config: %w", err)
	}
	return out, nil
}

// Coordinator holds, for every namespace this node coordinates, each
// node's last report and outstanding grant, and answers lease requests.
// Safe for concurrent use; a batched request takes its lock once.
//
// Per request and namespace (Handle):
//
//   - Reports apply in the order the node sent them (Request.Seq): one
//     older than the last applied is answered with no grant and changes
//     nothing.
//   - A node's holding is max(grant, has): its grant while unexpired, and
//     what it last reported holding until Drain after that. Records are
//     forgotten then.
//   - A new term starts from the records the previous coordinator shipped
//     here as its successor (Inherit, handoff.go): a node that does not
//     report in the new term (the old coordinator itself, stopped or
//     dead) keeps counting until its record is forgotten.
//   - Learning (for LearningPeriod after since, or until every member
//     named by Reporters has reported in the term): the node is granted
//     what it reports it has, minus whatever would put the holdings over
//     the quota. Nothing new is handed out: grants of a previous
//     coordinator may still be live on nodes that have not reported yet.
//   - Otherwise: backpressure.FairShare over every recorded node, with the
//     other nodes' holdings as their Has and the asking node's own report
//     as its Has; the asking node gets its share. Other nodes' grants move
//     at their own next refresh (at most one refresh interval later).
//   - Turns: the rows FairShare has left over when the quota does not
//     divide evenly go to the nodes that want more than the water level by
//     rank: a node in the first Turn of holding one keeps it; then the
//     nodes waiting for one, longest first; then nodes whose turn is over.
//     So a node with demand is never refused forever while others keep a
//     backlog: it waits at most about one Turn per node ahead of it.
//
// So the sum of holdings never exceeds the quota (while the reports do
// not; a quota lowered below what is held only stops new grants), and
// grants follow demand within one refresh.
type Coordinator struct {
	cfg       CoordinatorConfig
	leaseMS   uint32
	refreshMS uint32

	mu sync.Mutex
	ns map[string]*nsState
	// inherited holds, per namespace, the latest records a coordinator
	// shipped here as its successor (handoff.go): a new term starts from
	// them.
	inherited map[string]map[string]inherited // namespace → sender ("": this node's own past terms)
	// grown names the namespaces where a node holds more than the last
	// shipment to the successor said (handoff.go).
	grown map[string]bool
	// terms is the since of the last term each namespace's state was
	// started for: a state dropped while idle and started again in the
	// same term is not seeded again.
	terms   map[string]time.Time
	demands []backpressure.NodeDemand // scratch, under mu
	grants  []uint32                  // scratch, under mu
}

// nsState is one namespace's state for one coordination term.
type nsState struct {
	since   time.Time
	created time.Time // when this state was created (coordinator clock)
	nodes   []record  // sorted by node name
	// heard names the nodes that reported in this term, while it learns
	// (a record seeded from a predecessor's shipment is not heard; a node
	// that reported nothing held is, though its record is dropped).
	heard map[string]struct{}
	// learned is set when learning ended early: every reporter had
	// reported in this term (CoordinatorConfig.Reporters).
	learned bool
}

// learningAt reports whether the namespace's term is learning at now.
func (c *Coordinator) learningAt(st *nsState, now time.Time) bool {
	return c.cfg.LearningPeriod > 0 && !st.learned && now.Before(st.since.Add(c.cfg.LearningPeriod))
}

// allReported reports whether every one of reporters was heard in st's
// term. Called with mu held.
func allReported(st *nsState, reporters []string) bool {
	for _, name := range reporters {
		if _, ok := st.heard[name]; !ok {
			return false
		}
	}
	return true
}

// record is the coordinator's view of one node for one namespace.
type record struct {
	node    string
	wants   uint32    // last reported, capped at the quota
	has     uint32    // last reported
	grant   uint32    // last granted
	expires time.Time // grant expiry (coordinator clock)
	forget  time.Time // expires + Drain: the record is dropped then
	seq     uint64    // the latest Request.Seq applied (0: unordered)
	// shipped is the holding the last hand-off shipment carried.
	shipped uint32
	// turnSince is when the node began holding a contended row (its grant
	// above the water level); waitSince when it began wanting one without
	// holding it. Zero when not so; see Coordinator's turns.
	turnSince, waitSince time.Time
}

// rank is the node's priority for contended rows at now (larger first,
// backpressure.NodeDemand.Rank): within its turn it keeps its row; a
// waiting node ranks by how long it has waited; anyone else ranks 0.
func (r *record) rank(now time.Time, turn time.Duration) uint64 {
	switch {
	case !r.turnSince.IsZero() && now.Before(r.turnSince.Add(turn)):
		return math.MaxUint64
	case !r.waitSince.IsZero():
		return 1 + uint64(max(0, now.Sub(r.waitSince)))
	}
	return 0
}

// updateTurn records whether the node holds a contended row after being
// granted grant, with its capped wants and the water level (level ≥
// quota: nothing is contended).
func (r *record) updateTurn(now time.Time, wants, grant, level, quota uint32) {
	switch {
	case level >= quota || wants <= level:
		r.turnSince, r.waitSince = time.Time{}, time.Time{}
	case grant > level:
		if r.turnSince.IsZero() {
			r.turnSince = now
		}
		r.waitSince = time.Time{}
	default:
		r.turnSince = time.Time{}
		if r.waitSince.IsZero() {
			r.waitSince = now
		}
	}
}

// holding is what the node may be running or may start: the larger of its
// grant and what it reported holding. After the grant expires the node
// claims nothing new, but the rows it claimed under the grant (up to the
// grant, even if it reported fewer) may run for Drain more; the record is
// forgotten then.
func (r *record) holding() uint32 { return max(r.grant, r.has) }

// NewCoordinator builds a Coordinator; it fails on an invalid config.
func NewCoordinator(cfg CoordinatorConfig) (*Coordinator, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Coordinator{
		cfg:       c,
		leaseMS:   uint32(c.LeaseLength / time.Millisecond),
		refreshMS: uint32(c.RefreshInterval / time.Millisecond),
		ns:        map[string]*nsState{},
	}, nil
}

// Config returns the coordinator's config with defaults filled in.
func (c *Coordinator) Config() CoordinatorConfig { return c.cfg }

// Handle answers one batched Request at time now (the coordinator's
// clock). It validates the request first and returns its *FieldError
// without changing anything. If the request's epoch is newer than this
// node's, every namespace is answered NotCoordinator: this node's view is
// behind and it may no longer coordinate them. Otherwise each namespace
// this node coordinates gets a Lease and the rest are NotCoordinator.
func (c *Coordinator) Handle(now time.Time, req Request) (Response, error) {
	if err := req.Validate(); err != nil {
		return Response{}, err
	}
	epoch := c.cfg.Epoch()
	resp := Response{Epoch: epoch}
	if req.Epoch != 0 && epoch != 0 && req.Epoch > epoch {
		resp.NotCoordinator = make([]string, len(req.Asks))
		for i, a := range req.Asks {
			resp.NotCoordinator[i] = a.Namespace
		}
		return resp, nil
	}
	// Ownership and quotas are read before the lock: they are the caller's
	// functions and may take locks of their own.
	type input struct {
		since time.Time
		quota uint32
		ok    bool
	}
	in := make([]input, len(req.Asks))
	for i, a := range req.Asks {
		if since, ok := c.cfg.Coordinates(a.Namespace); ok {
			in[i] = input{since: since, quota: c.cfg.Quota(a.Namespace), ok: true}
		}
	}
	// The members are read only when an asked namespace's term may still
	// be learning (its since is recent): most calls need no list.
	var reporters []string
	if c.cfg.Reporters != nil && c.cfg.LearningPeriod > 0 {
		for i := range in {
			if in[i].ok && now.Before(in[i].since.Add(c.cfg.LearningPeriod)) {
				reporters = c.cfg.Reporters()
				break
			}
		}
	}
	resp.Leases = make([]Lease, 0, len(req.Asks))
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, a := range req.Asks {
		if !in[i].ok {
			resp.NotCoordinator = append(resp.NotCoordinator, a.Namespace)
			continue
		}
		grant, learning, soon := c.decide(now, req.Node, req.Seq, a, in[i].since, in[i].quota, reporters)
		refresh := c.refreshMS
		if soon {
			refresh = max(c.refreshMS/handoffRefreshDivisor, 1)
		}
		resp.Leases = append(resp.Leases, Lease{
			Namespace: a.Namespace, Grant: grant,
			ExpiryMS: c.leaseMS, RefreshMS: refresh, Learning: learning,
		})
	}
	return resp, nil
}

// handoffRefreshDivisor shortens the refresh interval of a node a
// contended row is about to change hands with (decide's soon): a fifth of
// the interval.
const handoffRefreshDivisor = 5

// decide records node's report for one namespace and returns its grant.
// soon asks the node to refresh sooner than the interval (a fifth of it):
// it waits for a contended row, or its grant is below what it holds (its
// rows finishing free capacity another node waits for), so a row that
// changes hands between turns idles about a fifth of a refresh, not one
// or two. reporters is CoordinatorConfig.Reporters' answer (nil: not
// set): once each of them has reported in the term, learning ends. Called
// with mu held.
func (c *Coordinator) decide(now time.Time, node string, seq uint64, a Ask, since time.Time, quota uint32, reporters []string) (grant uint32, learning, soon bool) {
	st := c.ns[a.Namespace]
	if st == nil || !st.since.Equal(since) {
		if st != nil {
			c.stashLocked(now, a.Namespace, st)
		}
		newTerm := st != nil || !c.terms[a.Namespace].Equal(since)
		st = &nsState{since: since, created: now}
		if newTerm {
			c.seedLocked(now, a.Namespace, st)
			if c.terms == nil {
				c.terms = map[string]time.Time{}
			}
			c.terms[a.Namespace] = since
		}
		c.ns[a.Namespace] = st
	}
	st.prune(now)
	i, found := slices.BinarySearchFunc(st.nodes, node, func(r record, n string) int { return strings.Compare(r.node, n) })
	if !found {
		st.nodes = slices.Insert(st.nodes, i, record{node: node})
	}
	rec := &st.nodes[i]
	learning = c.learningAt(st, now)
	if found && seq != 0 && seq < rec.seq {
		// An older request than the one the record holds: the node has
		// asked again since and acts on that answer (this one it ignores);
		// this report would undercount what it holds. Answered with no
		// grant, changing nothing: a restarted node whose clock stepped
		// back gets nothing until its old record is forgotten.
		return 0, learning, false
	}
	rec.seq = max(rec.seq, seq)
	rec.wants, rec.has = min(a.Wants, quota), a.Has
	if learning && len(reporters) > 0 {
		if st.heard == nil {
			st.heard = map[string]struct{}{}
		}
		st.heard[node] = struct{}{}
		if allReported(st, reporters) {
			// Every member's holding is on record, its grants included:
			// nothing unseen can still be granted (CoordinatorConfig.Reporters).
			st.learned, learning, st.heard = true, false, nil
		}
	}

	if learning {
		var others uint64
		for j := range st.nodes {
			if j != i {
				others += uint64(st.nodes[j].holding())
			}
		}
		if others < uint64(quota) {
			grant = uint32(min(uint64(a.Has), uint64(quota)-others))
		}
	} else {
		c.demands = c.demands[:0]
		for j := range st.nodes {
			r := &st.nodes[j]
			d := backpressure.NodeDemand{Wants: r.wants, Has: r.holding(), Rank: r.rank(now, c.cfg.Turn)}
			if j == i {
				d.Has = a.Has // its new report supersedes its old grant (see Ask.Has)
			}
			c.demands = append(c.demands, d)
		}
		c.grants = backpressure.FairShare(quota, c.demands, c.grants)
		grant = c.grants[i]
		if c.cfg.Members != nil && now.Before(st.created.Add(c.cfg.RefreshInterval)) {
			if m := uint64(c.cfg.Members()); m > 0 {
				share := uint32((uint64(quota) + m - 1) / m)
				grant = min(grant, max(a.Has, share))
			}
		}
		rec.updateTurn(now, rec.wants, grant, backpressure.Level(quota, c.demands), quota)
	}

	if grant == 0 && a.Has == 0 && a.Wants == 0 {
		// Nothing wanted, held or granted: forget the node now.
		st.nodes = slices.Delete(st.nodes, i, i+1)
		if len(st.nodes) == 0 {
			delete(c.ns, a.Namespace)
		}
		return 0, learning, false
	}
	if max(grant, rec.has) > rec.shipped {
		// More held than the successor was last told: shipped at the next
		// round, not only with the periodic full shipment (handoff.go).
		if c.grown == nil {
			c.grown = map[string]bool{}
		}
		c.grown[a.Namespace] = true
	}
	rec.grant = grant
	rec.expires = now.Add(c.cfg.LeaseLength)
	rec.forget = rec.expires.Add(c.cfg.Drain)
	soon = !learning && (!rec.waitSince.IsZero() || grant < a.Has)
	return grant, learning, soon
}

// sortRecords sorts records by node name, as nsState keeps them.
func sortRecords(rs []record) {
	slices.SortFunc(rs, func(a, b record) int { return strings.Compare(a.node, b.node) })
}

// prune drops records past their forget time.
func (st *nsState) prune(now time.Time) {
	st.nodes = slices.DeleteFunc(st.nodes, func(r record) bool { return !now.Before(r.forget) })
}

// Expire drops what the coordinator no longer needs, as of now: records
// past their forget time, namespaces left without records, and namespaces
// this node no longer coordinates (or coordinates in a new term). It
// returns how many namespaces it dropped. Handle prunes the namespaces it
// touches; the node calls Expire periodically (say once per lease length)
// for the rest. O(namespaces × nodes).
func (c *Coordinator) Expire(now time.Time) int {
	c.mu.Lock()
	terms := make(map[string]time.Time, len(c.ns))
	for ns, st := range c.ns {
		terms[ns] = st.since
	}
	c.mu.Unlock()
	// Ownership is read without the lock (the caller's function).
	ended := map[string]bool{}
	for ns, since := range terms {
		if cur, ok := c.cfg.Coordinates(ns); !ok || !cur.Equal(since) {
			ended[ns] = true
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pruneInheritedLocked(now)
	for ns, since := range c.terms {
		if _, live := c.ns[ns]; !live && !now.Before(since.Add(time.Hour)) {
			delete(c.terms, ns) // bounded: a term idle an hour seeds nothing (its records are long forgotten)
		}
	}
	dropped := 0
	for ns, st := range c.ns {
		// A state Handle started in a new term meanwhile has another since.
		if ended[ns] && st.since.Equal(terms[ns]) {
			c.stashLocked(now, ns, st)
			delete(c.ns, ns)
			delete(c.terms, ns)
			dropped++
			continue
		}
		st.prune(now)
		if len(st.nodes) == 0 {
			delete(c.ns, ns)
			dropped++
		}
	}
	return dropped
}

// NodeStatus is one node's record at the coordinator.
type NodeStatus struct {
	Node  string `json:"node"`  // the node's name
	Wants uint32 `json:"wants"` // last reported, capped at the quota (rows)
	Has   uint32 `json:"has"`   // last reported (rows)
	Grant uint32 `json:"grant"` // last granted (rows), valid until Expires
	// Expires is the grant's expiry on the coordinator's clock.
	Expires time.Time `json:"expires"`
	// WaitingSince is when the node began waiting for a contended row
	// (its turn; see Coordinator), absent when it is not waiting.
	WaitingSince time.Time `json:"waiting_since,omitzero"`
}

// NamespaceStatus is the coordinator's state of one namespace, for the
// namespace view of the API: each node's grant and wants.
type NamespaceStatus struct {
	Namespace string `json:"namespace"`
	// Since is when this node became the namespace's coordinator.
	Since time.Time `json:"since"`
	// Learning is true until LearningUntil: Since + LearningPeriod, or
	// sooner once every member has reported (CoordinatorConfig.Reporters;
	// LearningUntil is then the status's own time).
	Learning      bool      `json:"learning"`
	LearningUntil time.Time `json:"learning_until"`
	// Outstanding is Σ holdings: what the nodes may run at once (rows).
	Outstanding uint64 `json:"outstanding"`
	// Nodes are the nodes on record, sorted by name.
	Nodes []NodeStatus `json:"nodes"`
}

// Status returns the coordinator's state of namespace as of now, and false
// when it holds none.
func (c *Coordinator) Status(now time.Time, namespace string) (NamespaceStatus, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, ok := c.ns[namespace]
	if !ok {
		return NamespaceStatus{}, false
	}
	until := st.since.Add(c.cfg.LearningPeriod)
	if st.learned {
		until = now // every member has reported; see CoordinatorConfig.Reporters
	}
	out := NamespaceStatus{
		Namespace: namespace, Since: st.since,
		Learning: c.learningAt(st, now), LearningUntil: until,
		Nodes: make([]NodeStatus, 0, len(st.nodes)),
	}
	for i := range st.nodes {
		r := &st.nodes[i]
		if !now.Before(r.forget) {
			continue
		}
		out.Outstanding += uint64(r.holding())
		out.Nodes = append(out.Nodes, NodeStatus{Node: r.node, Wants: r.wants, Has: r.has, Grant: r.grant, Expires: r.expires, WaitingSince: r.waitSince})
	}
	return out, true
}

// Namespaces returns how many namespaces the coordinator holds state for.
func (c *Coordinator) Namespaces() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ns)
}
