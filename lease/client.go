package lease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// ClientConfig configures a Client. Node is required.
type ClientConfig struct {
	// Node is this node's name (ValidNodeName), sent in every Request.
	Node string
	// Now is the clock grants expire by (default time.Now). quota.Leased
	// must read grants with the same clock.
	Now func() time.Time
	// RefreshInterval is the refresh interval until a coordinator names
	// one (default DefaultRefreshInterval).
	RefreshInterval time.Duration
}

// Client is a node's side of the lease protocol: per namespace, the grant
// it acts on, with its expiry and refresh interval. Safe for concurrent
// use.
//
// Rules (DESIGN.md "Exact cluster-wide quota"):
//
//   - The ceiling for a namespace is its unexpired grant; no grant, or an
//     expired one, is 0. A grant is kept until it expires however many
//     refreshes fail or are answered NotCoordinator, then the node claims
//     nothing new of that namespace.
//   - A grant's expiry is counted from when the request was sent, so it
//     ends no later than the coordinator's record of it.
//   - Shrinking a grant never pre-empts claimed rows: the ceiling only
//     stops new claims until claimed falls below it (quota.Ceiling.Headroom).
//   - Has reports max(claimed, unexpired grant): until the node has
//     applied a lower grant, the coordinator keeps counting the higher one.
//   - Only the answer to the latest request that asked about a namespace
//     is applied; a late answer to an older one is ignored.
//   - An ask that wanted or held rows and got no answer (the call failed)
//     may still have been recorded: the coordinator may count a grant the
//     node never heard of, against the other nodes. Until an answer to a
//     later ask is applied, the namespace is asked about at every refresh
//     (with wants and has 0 when the node has no demand and no grant, so
//     the coordinator can drop the record), for up to MaxLeaseMS after
//     the unanswered ask, the longest any grant lasts. Release gives such
//     grants back too.
//   - Answers are applied between sweeps (Claiming), so no claim made
//     under a grant lands after a lower one was reported.
type Client struct {
	node    string
	now     func() time.Time
	refresh time.Duration

	// claimMu orders claims against refreshes: a sweep holds it shared
	// from reading its ceilings until its claims are committed
	// (Claiming); RefreshMeasured's demand reading, Apply and Release take
	// it exclusively. Taken before mu.
	claimMu sync.RWMutex

	mu      sync.Mutex
	ns      map[string]*grantState
	changes uint64 // coordinator changes seen
	seq     uint64 // the last Request.Seq built
	// released: Release was called; the client asks for nothing more.
	released bool
}

type grantState struct {
	rows        uint32
	expires     time.Time // zero: no grant yet
	refresh     time.Duration
	coordinator string // who granted it
	learning    bool
	lastSent    time.Time // send time of the latest request asking about it
	// unanswered is the send time of the latest ask with wants or has
	// above 0 whose answer has not been applied (zero: none). The
	// coordinator may hold a grant for it until unanswered + MaxLeaseMS.
	unanswered time.Time
}

// maxLease is the longest a coordinator's grant can last (MaxLeaseMS).
const maxLease = MaxLeaseMS * time.Millisecond

// mayBeGranted reports whether the coordinator may, as of now, count a
// grant this node has not heard of (an unanswered ask).
func (st *grantState) mayBeGranted(now time.Time) bool {
	return !st.unanswered.IsZero() && now.Before(st.unanswered.Add(maxLease))
}

// NewClient builds a Client; it fails on an invalid node name.
func NewClient(cfg ClientConfig) (*Client, error) {
	if !ValidNodeName(cfg.Node) {
		return nil, fmt.Errorf("lease: client node name %q: want 1 to %d bytes of UTF-8 without control characters", cfg.Node, MaxNodeNameBytes)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.RefreshInterval <= 0 {
		cfg.RefreshInterval = DefaultRefreshInterval
	}
	return &Client{node: cfg.Node, now: cfg.Now, refresh: cfg.RefreshInterval, ns: map[string]*grantState{},
		seq: uint64(max(cfg.Now().UnixNano(), 0))}, nil
}

// Demand is one namespace's demand on this node, as the node measures it
// before a refresh.
type Demand struct {
	// Namespace (ValidNamespace); one entry per namespace.
	Namespace string
	// Wants is claimed + visible pending rows, at most the namespace's
	// quota (rows).
	Wants uint32
	// Claimed is this node's claimed rows of the namespace (rows).
	Claimed uint32
}

// Call is one batched lease call to make: Request to coordinator To. SentAt
// is the time expiries are counted from; send it right away.
type Call struct {
	To      string    // the coordinator's node name
	Request Request   // the batched request to send it
	SentAt  time.Time // when it was built (client clock)
}

// Calls builds this refresh's calls: one per coordinator (more only past
// MaxEntries namespaces), asking about every namespace of demand with
// wants or claimed rows, every namespace this node holds an unexpired
// grant of (with wants 0 if it has no demand, so the coordinator can take
// the grant back), and every namespace whose last ask with wants or has
// got no answer, for up to MaxLeaseMS after it (with wants and has 0 if
// the node has neither demand nor grant: the coordinator may have
// recorded a grant for that ask). coordinatorOf names a namespace's
// coordinator under the node's ownership view (CoordinatorOf); a
// namespace without one is left out and keeps its grant until it expires.
// A call To this node is for the node's own Coordinator. epoch is the
// node's ownership epoch.
//
// Calls also forgets expired grants of namespaces with no demand. Demand
// entries with an invalid namespace are left out and reported in the
// error; the calls for the rest are returned all the same.
func (c *Client) Calls(epoch uint64, demand []Demand, coordinatorOf func(namespace string) (node string, ok bool)) ([]Call, error) {
	now := c.now()
	var errs []error
	asks := make(map[string]Ask, len(demand))
	for _, d := range demand {
		if !ValidNamespace(d.Namespace) {
			errs = append(errs, fmt.Errorf("lease: demand for namespace %q: invalid name", d.Namespace))
			continue
		}
		if d.Wants == 0 && d.Claimed == 0 {
			continue
		}
		a := asks[d.Namespace] // a namespace listed twice: its largest figures
		asks[d.Namespace] = Ask{Namespace: d.Namespace, Wants: max(a.Wants, d.Wants), Has: max(a.Has, d.Claimed)}
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.released {
		return nil, errors.Join(errs...)
	}
	for ns, st := range c.ns {
		live := now.Before(st.expires)
		a, wanted := asks[ns]
		switch {
		case live:
			a.Namespace, a.Has = ns, max(a.Has, st.rows)
			asks[ns] = a
		case !wanted && st.mayBeGranted(now):
			asks[ns] = Ask{Namespace: ns} // give back a grant it never heard of
		case !wanted:
			delete(c.ns, ns) // expired, or never granted, and no demand
		}
	}
	c.seq++
	seq := c.seq
	byCoordinator := map[string][]Ask{}
	for ns, a := range asks {
		to, ok := coordinatorOf(ns)
		if !ok || !ValidNodeName(to) {
			continue
		}
		byCoordinator[to] = append(byCoordinator[to], a)
		st := c.ns[ns]
		if st == nil {
			st = &grantState{}
			c.ns[ns] = st
		}
		st.lastSent = now
		if a.Wants > 0 || a.Has > 0 {
			st.unanswered = now // until an answer is applied (Apply)
		}
	}
	calls := make([]Call, 0, len(byCoordinator))
	for to, list := range byCoordinator {
		slices.SortFunc(list, func(a, b Ask) int { return strings.Compare(a.Namespace, b.Namespace) })
		for chunk := range slices.Chunk(list, MaxEntries) {
			calls = append(calls, Call{To: to, SentAt: now, Request: Request{Node: c.node, Epoch: epoch, Asks: chunk, Seq: seq}})
		}
	}
	slices.SortFunc(calls, func(a, b Call) int { return strings.Compare(a.To, b.To) })
	return calls, errors.Join(errs...)
}

// Claiming marks a sweep in progress, from before it reads its ceilings
// (Grant) until its claims are committed to the store: call done then.
// Answers are applied, and RefreshMeasured reads the demand, between
// sweeps. Without it a sweep that read a grant of 3 could commit its
// claims after a refresh applied a grant of 2 and the next one reported
// the store's count from before the commit: the coordinator would count 2
// rows where 3 run, and grant the third to another node (DESIGN.md "Exact
// cluster-wide quota": Has is never below what the node may hold). Sweeps
// do not exclude each other here; done must be called exactly once.
func (c *Client) Claiming() (done func()) {
	c.claimMu.RLock()
	return c.claimMu.RUnlock
}

// Apply applies a coordinator's response to call. The response is
// validated against the request first; an invalid one changes nothing and
// its *FieldError is returned. Namespaces answered NotCoordinator keep
// their grants until they expire. A lease is ignored if a later call has
// asked about its namespace since call was built.
func (c *Client) Apply(call Call, resp Response) error {
	if err := resp.Validate(call.Request); err != nil {
		return fmt.Errorf("lease: response of %s: %w", call.To, err)
	}
	c.claimMu.Lock()
	defer c.claimMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, l := range resp.Leases {
		st := c.ns[l.Namespace]
		if st == nil {
			st = &grantState{lastSent: call.SentAt}
			c.ns[l.Namespace] = st
		}
		if call.SentAt.Before(st.lastSent) {
			continue // a later request is on its way; its answer decides
		}
		if st.coordinator != "" && st.coordinator != call.To {
			c.changes++
		}
		st.rows, st.expires = l.Grant, call.SentAt.Add(l.Expiry())
		st.refresh, st.coordinator, st.learning = l.Refresh(), call.To, l.Learning
		// This answer is to the latest ask (lastSent ≥ unanswered): it
		// supersedes whatever the coordinator recorded for earlier ones.
		st.unanswered = time.Time{}
	}
	return nil
}

// Grant returns this node's grant for namespace (rows) and its expiry, as
// of now; ok is false when there is none or it has expired (then the
// ceiling is 0). It implements quota.Grants.
func (c *Client) Grant(namespace string, now time.Time) (rows uint32, expires time.Time, ok bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.ns[namespace]
	if st == nil || !now.Before(st.expires) {
		return 0, time.Time{}, false
	}
	return st.rows, st.expires, true
}

// NextRefresh returns how long to wait before the next refresh: the
// smallest refresh interval among unexpired grants, or the configured one
// when there are none.
func (c *Client) NextRefresh() time.Duration {
	now := c.now()
	c.mu.Lock()
	defer c.mu.Unlock()
	next := time.Duration(0)
	for _, st := range c.ns {
		if now.Before(st.expires) && st.refresh > 0 && (next == 0 || st.refresh < next) {
			next = st.refresh
		}
	}
	if next == 0 {
		return c.refresh
	}
	return next
}

// CoordinatorChanges returns how many times a namespace's grant came from
// a different coordinator than its previous one (a failover or an
// ownership move), since the client was built.
func (c *Client) CoordinatorChanges() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changes
}

// GrantStatus is one namespace's grant on this node, for the API.
type GrantStatus struct {
	Namespace   string    `json:"namespace"`
	Grant       uint32    `json:"grant"`       // this node's ceiling (rows)
	Expires     time.Time `json:"expires"`     // when it falls to 0 without a refresh
	Coordinator string    `json:"coordinator"` // the node that granted it
	Learning    bool      `json:"learning"`    // granted by a learning coordinator
}

// Status returns the unexpired grants as of now, sorted by namespace.
func (c *Client) Status(now time.Time) []GrantStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]GrantStatus, 0, len(c.ns))
	for ns, st := range c.ns {
		if now.Before(st.expires) {
			out = append(out, GrantStatus{Namespace: ns, Grant: st.rows, Expires: st.expires, Coordinator: st.coordinator, Learning: st.learning})
		}
	}
	slices.SortFunc(out, func(a, b GrantStatus) int { return strings.Compare(a.Namespace, b.Namespace) })
	return out
}

// Transport makes one lease call to coordinator to: an authenticated HTTP
// call for another node, or this node's own Coordinator.Handle for itself.
type Transport func(ctx context.Context, to string, req Request) (Response, error)

// CallResult is the outcome of one call of a Refresh.
type CallResult struct {
	To         string // the coordinator called
	Namespaces int    // how many namespaces the call asked about
	// Latency is from send to applied answer, on the client's clock.
	Latency time.Duration
	// Err is the call's or the response's error (nil: applied).
	Err error
}

// Release gives every unexpired grant back, and every grant a coordinator
// may hold for an unanswered ask (see Client): the node stops claiming for
// good (a graceful stop, once its deliveries have finished), so it drops
// its grants at once and tells each coordinator it wants and holds
// nothing, which frees the capacity for the other nodes now rather than
// at the grants' expiry. The calls are made like Refresh's; a failed one
// changes nothing more (its coordinator counts the grant until it
// expires). After Release the client asks for nothing: Calls and Refresh
// build no call.
func (c *Client) Release(ctx context.Context, epoch uint64, coordinatorOf func(string) (string, bool), transport Transport) []CallResult {
	now := c.now()
	c.claimMu.Lock()
	c.mu.Lock()
	c.released = true
	c.seq++
	seq := c.seq
	byCoordinator := map[string][]Ask{}
	for ns, st := range c.ns {
		if !now.Before(st.expires) && !st.mayBeGranted(now) {
			continue
		}
		st.rows, st.expires, st.unanswered = 0, now, time.Time{}
		if to, ok := coordinatorOf(ns); ok && ValidNodeName(to) {
			byCoordinator[to] = append(byCoordinator[to], Ask{Namespace: ns})
		}
	}
	c.mu.Unlock()
	c.claimMu.Unlock()
	var calls []Call
	for to, list := range byCoordinator {
		slices.SortFunc(list, func(a, b Ask) int { return strings.Compare(a.Namespace, b.Namespace) })
		for chunk := range slices.Chunk(list, MaxEntries) {
			calls = append(calls, Call{To: to, SentAt: now, Request: Request{Node: c.node, Epoch: epoch, Asks: chunk, Seq: seq}})
		}
	}
	results := make([]CallResult, len(calls))
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Go(func() {
			res := CallResult{To: call.To, Namespaces: len(call.Request.Asks)}
			if _, err := transport(ctx, call.To, call.Request); err != nil {
				res.Err = fmt.Errorf("lease: release %d namespaces at %s: %w", len(call.Request.Asks), call.To, err)
			}
			res.Latency = c.now().Sub(call.SentAt)
			results[i] = res
		})
	}
	wg.Wait()
	return results
}

// Refresh runs one refresh: it builds the Calls, makes them concurrently
// through transport (one goroutine per call, all finished when it
// returns), applies each answer as it arrives and reports every call. A
// failed call changes nothing: grants stay until they expire. Demand
// errors (invalid namespaces) are returned beside the results.
func (c *Client) Refresh(ctx context.Context, epoch uint64, demand []Demand, coordinatorOf func(string) (string, bool), transport Transport) ([]CallResult, error) {
	return c.RefreshMeasured(ctx, epoch, func() ([]Demand, error) { return demand, nil }, coordinatorOf, transport)
}

// RefreshMeasured is Refresh with the demand read by measure while no
// sweep is in progress (it waits for those under way, see Claiming), so
// the Claimed counts it reports include every claim made under any grant
// this node acted on, and Has is never below what the node may hold. An
// error of measure is returned as is and nothing is sent.
func (c *Client) RefreshMeasured(ctx context.Context, epoch uint64, measure func() ([]Demand, error), coordinatorOf func(string) (string, bool), transport Transport) ([]CallResult, error) {
	c.claimMu.Lock()
	demand, err := measure()
	if err != nil {
		c.claimMu.Unlock()
		return nil, err
	}
	calls, derr := c.Calls(epoch, demand, coordinatorOf)
	c.claimMu.Unlock()
	results := make([]CallResult, len(calls))
	var wg sync.WaitGroup
	for i, call := range calls {
		wg.Go(func() {
			res := CallResult{To: call.To, Namespaces: len(call.Request.Asks)}
			resp, err := transport(ctx, call.To, call.Request)
			if err != nil {
				res.Err = fmt.Errorf("lease: refresh %d namespaces at %s: %w", len(call.Request.Asks), call.To, err)
			} else {
				res.Err = c.Apply(call, resp)
			}
			res.Latency = c.now().Sub(call.SentAt)
			results[i] = res
		})
	}
	wg.Wait()
	return results, derr
}
