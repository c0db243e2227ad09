package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshard/fairshard/lease"
)

func mustClient(t testing.TB, node string, clk *clock) *lease.Client {
	t.Helper()
	c, err := lease.NewClient(lease.ClientConfig{Node: node, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// byName maps namespaces to coordinators by a fixed table.
func byName(table map[string]string) func(string) (string, bool) {
	return func(ns string) (string, bool) {
		to, ok := table[ns]
		return to, ok
	}
}

// answer builds a coordinator's response granting each asked namespace
// grants[ns] with the given lease length.
func answer(call lease.Call, expiry time.Duration, grants map[string]uint32) lease.Response {
	var resp lease.Response
	for _, a := range call.Request.Asks {
		g, ok := grants[a.Namespace]
		if !ok {
			resp.NotCoordinator = append(resp.NotCoordinator, a.Namespace)
			continue
		}
		resp.Leases = append(resp.Leases, lease.Lease{Namespace: a.Namespace, Grant: g,
			ExpiryMS: uint32(expiry / time.Millisecond), RefreshMS: 100})
	}
	return resp
}

func grantOf(c *lease.Client, ns string, now time.Time) uint32 {
	g, _, _ := c.Grant(ns, now)
	return g
}

func TestNewClientRefusesABadNodeName(t *testing.T) {
	if _, err := lease.NewClient(lease.ClientConfig{Node: "bad\nname"}); err == nil {
		t.Fatal("accepted a node name with a newline")
	}
}

// Calls batches by coordinator: one call per coordinator, namespaces
// sorted, has = max(claimed, unexpired grant), grant-only namespaces asked
// with wants 0, namespaces without a coordinator left out.
func TestClientCallsBatchPerCoordinator(t *testing.T) {
	clk := newClock()
	c := mustClient(t, "me", clk)
	coord := byName(map[string]string{"a": "n1", "b": "n2", "c": "n1", "d": "n1", "held": "n2"})

	// Give "held" a grant of 5 and "a" a grant of 1.
	calls, err := c.Calls(1, []lease.Demand{{Namespace: "held", Wants: 5}, {Namespace: "a", Wants: 1}}, coord)
	if err != nil {
		t.Fatal(err)
	}
	for _, call := range calls {
		if err := c.Apply(call, answer(call, time.Minute, map[string]uint32{"held": 5, "a": 1})); err != nil {
			t.Fatal(err)
		}
	}
	firstSeq := calls[0].Request.Seq
	if firstSeq == 0 {
		t.Fatal("the first request carries no sequence")
	}

	demand := []lease.Demand{
		{Namespace: "d", Wants: 2, Claimed: 1},
		{Namespace: "a", Wants: 3, Claimed: 0}, // has = its grant 1
		{Namespace: "b", Wants: 1, Claimed: 4}, // claimed above wants: has 4
		{Namespace: "c", Wants: 0, Claimed: 0}, // nothing to say
		{Namespace: "orphan", Wants: 9},        // no coordinator now
		{Namespace: "bad name", Wants: 1},
	}
	calls, err = c.Calls(7, demand, coord)
	if err == nil {
		t.Fatal("an invalid namespace in the demand was not reported")
	}
	want := []lease.Call{
		{To: "n1", SentAt: clk.Now(), Request: lease.Request{Node: "me", Epoch: 7, Asks: []lease.Ask{{Namespace: "a", Wants: 3, Has: 1}, {Namespace: "d", Wants: 2, Has: 1}}, Seq: firstSeq + 1}},
		{To: "n2", SentAt: clk.Now(), Request: lease.Request{Node: "me", Epoch: 7, Asks: []lease.Ask{{Namespace: "b", Wants: 1, Has: 4}, {Namespace: "held", Wants: 0, Has: 5}}, Seq: firstSeq + 1}},
	}
	if fmt.Sprint(calls) != fmt.Sprint(want) {
		t.Fatalf("calls\n%+v\nwant\n%+v", calls, want)
	}
}

// Past MaxEntries namespaces for one coordinator, Calls sends several
// requests, each within the limit.
func TestClientCallsChunkLargeBatches(t *testing.T) {
	clk := newClock()
	c := mustClient(t, "me", clk)
	demand := make([]lease.Demand, lease.MaxEntries+5)
	for i := range demand {
		demand[i] = lease.Demand{Namespace: nsName(i), Wants: 1}
	}
	calls, err := c.Calls(0, demand, func(string) (string, bool) { return "n1", true })
	if err != nil || len(calls) != 2 || len(calls[0].Request.Asks) != lease.MaxEntries || len(calls[1].Request.Asks) != 5 {
		t.Fatalf("%d calls (%v)", len(calls), err)
	}
	for _, call := range calls {
		if err := call.Request.Validate(); err != nil {
			t.Fatal(err)
		}
	}
}

// The ceiling is the unexpired grant: kept however many refreshes fail,
// 0 from the instant it expires, counted from when the request was sent.
func TestClientKeepsTheGrantUntilExpiryThenZero(t *testing.T) {
	clk := newClock()
	c := mustClient(t, "me", clk)
	coord := byName(map[string]string{"ns": "n1"})
	demand := []lease.Demand{{Namespace: "ns", Wants: 4}}
	sent := clk.Now()
	calls, _ := c.Calls(0, demand, coord)
	clk.Advance(300 * time.Millisecond) // the answer takes a while
	if err := c.Apply(calls[0], answer(calls[0], 2*time.Second, map[string]uint32{"ns": 4})); err != nil {
		t.Fatal(err)
	}
	rows, expires, ok := c.Grant("ns", clk.Now())
	if !ok || rows != 4 || !expires.Equal(sent.Add(2*time.Second)) {
		t.Fatalf("grant %d until %v (%v), want 4 until send time + 2 s", rows, expires, ok)
	}
	unreachable := func(context.Context, string, lease.Request) (lease.Response, error) {
		return lease.Response{}, errors.New("connection refused")
	}
	for clk.Now().Before(expires) {
		res, _ := c.Refresh(context.Background(), 0, demand, coord, unreachable)
		if len(res) != 1 || res[0].Err == nil {
			t.Fatalf("refresh results %+v, want one failed call", res)
		}
		if g := grantOf(c, "ns", clk.Now()); g != 4 {
			t.Fatalf("at %v before expiry: grant %d, want 4 kept", clk.Now().Sub(sent), g)
		}
		clk.Advance(100 * time.Millisecond)
	}
	if _, _, ok := c.Grant("ns", clk.Now()); ok {
		t.Fatal("grant still held at its expiry")
	}
	// NotCoordinator answers keep the grant the same way.
	calls, _ = c.Calls(0, demand, coord)
	_ = c.Apply(calls[0], answer(calls[0], time.Second, map[string]uint32{"ns": 2}))
	calls, _ = c.Calls(0, demand, coord)
	if err := c.Apply(calls[0], answer(calls[0], time.Second, nil)); err != nil {
		t.Fatal(err)
	}
	if g := grantOf(c, "ns", clk.Now()); g != 2 {
		t.Fatalf("after a not-coordinator answer: %d, want 2 kept", g)
	}
}

// A lower grant stops new claims only: the ceiling drops, the claimed rows
// stay, and has keeps reporting them (and the higher grant until the node
// has applied the lower one).
func TestClientShrinkingNeverPreempts(t *testing.T) {
	clk := newClock()
	c := mustClient(t, "me", clk)
	coord := byName(map[string]string{"ns": "n1"})
	calls, _ := c.Calls(0, []lease.Demand{{Namespace: "ns", Wants: 8}}, coord)
	_ = c.Apply(calls[0], answer(calls[0], time.Minute, map[string]uint32{"ns": 8}))
	// 8 claimed; the next call reports has 8 and is answered with 2.
	calls, _ = c.Calls(0, []lease.Demand{{Namespace: "ns", Wants: 8, Claimed: 8}}, coord)
	if a := calls[0].Request.Asks[0]; a.Has != 8 {
		t.Fatalf("has %d, want 8", a.Has)
	}
	_ = c.Apply(calls[0], answer(calls[0], time.Minute, map[string]uint32{"ns": 2}))
	if g := grantOf(c, "ns", clk.Now()); g != 2 {
		t.Fatalf("grant %d, want 2", g)
	}
	// Still 8 claimed: has is 8 (not the grant 2) until they finish.
	calls, _ = c.Calls(0, []lease.Demand{{Namespace: "ns", Wants: 8, Claimed: 8}}, coord)
	if a := calls[0].Request.Asks[0]; a.Has != 8 {
		t.Fatalf("has %d with 8 claimed under a grant of 2, want 8", a.Has)
	}
	// Before the node applied the lower grant it reported the higher one.
	calls, _ = c.Calls(0, []lease.Demand{{Namespace: "ns", Wants: 8, Claimed: 1}}, coord)
	if a := calls[0].Request.Asks[0]; a.Has != 2 {
		t.Fatalf("has %d with 1 claimed under a grant of 2, want 2", a.Has)
	}
}

// Only the answer to the latest request about a namespace counts; an
// invalid answer changes nothing; a new coordinator is counted.
func TestClientApply(t *testing.T) {
	clk := newClock()
	c := mustClient(t, "me", clk)
	table := map[string]string{"ns": "n1"}
	demand := []lease.Demand{{Namespace: "ns", Wants: 8}}
	old, _ := c.Calls(0, demand, byName(table))
	clk.Advance(time.Millisecond)
	newer, _ := c.Calls(0, demand, byName(table))
	if err := c.Apply(newer[0], answer(newer[0], time.Minute, map[string]uint32{"ns": 3})); err != nil {
		t.Fatal(err)
	}
	if err := c.Apply(old[0], answer(old[0], time.Minute, map[string]uint32{"ns": 8})); err != nil {
		t.Fatal(err)
	}
	if g := grantOf(c, "ns", clk.Now()); g != 3 {
		t.Fatalf("a late answer to an older request overrode the newer: grant %d, want 3", g)
	}
	calls, _ := c.Calls(0, demand, byName(table))
	bad := answer(calls[0], time.Minute, map[string]uint32{"ns": 9})
	bad.Leases[0].RefreshMS = 0
	var fe *lease.FieldError
	if err := c.Apply(calls[0], bad); !errors.As(err, &fe) || fe.Field != "leases[0].refresh_ms" {
		t.Fatalf("invalid answer: %v", err)
	}
	if g := grantOf(c, "ns", clk.Now()); g != 3 {
		t.Fatalf("an invalid answer changed the grant to %d", g)
	}
	if c.CoordinatorChanges() != 0 {
		t.Fatalf("%d coordinator changes, want 0", c.CoordinatorChanges())
	}
	table["ns"] = "n2"
	calls, _ = c.Calls(0, demand, byName(table))
	_ = c.Apply(calls[0], answer(calls[0], time.Minute, map[string]uint32{"ns": 1}))
	st := c.Status(clk.Now())
	if c.CoordinatorChanges() != 1 || len(st) != 1 || st[0].Coordinator != "n2" || st[0].Grant != 1 {
		t.Fatalf("after a move to n2: %d changes, status %+v", c.CoordinatorChanges(), st)
	}
	if d := c.NextRefresh(); d != 100*time.Millisecond {
		t.Fatalf("NextRefresh %v, want the lease's 100 ms", d)
	}
}

// A namespace whose grant has expired and whose demand has ended is
// forgotten; NextRefresh falls back to the configured interval.
func TestClientForgetsExpiredIdleNamespaces(t *testing.T) {
	clk := newClock()
	c := mustClient(t, "me", clk)
	coord := byName(map[string]string{"ns": "n1"})
	calls, _ := c.Calls(0, []lease.Demand{{Namespace: "ns", Wants: 1}}, coord)
	_ = c.Apply(calls[0], answer(calls[0], time.Second, map[string]uint32{"ns": 1}))
	// Demand ended, grant live: still asked about, with wants 0.
	calls, _ = c.Calls(0, nil, coord)
	if len(calls) != 1 || calls[0].Request.Asks[0] != (lease.Ask{Namespace: "ns", Wants: 0, Has: 1}) {
		t.Fatalf("calls %+v, want ns with wants 0, has 1", calls)
	}
	// Answered (an unanswered ask would be asked about again).
	_ = c.Apply(calls[0], answer(calls[0], time.Second, map[string]uint32{"ns": 0}))
	clk.Advance(time.Second)
	if calls, _ = c.Calls(0, nil, coord); len(calls) != 0 {
		t.Fatalf("calls %+v after expiry with no demand, want none", calls)
	}
	if len(c.Status(clk.Now())) != 0 || c.NextRefresh() != lease.DefaultRefreshInterval {
		t.Fatalf("status %+v, next refresh %v", c.Status(clk.Now()), c.NextRefresh())
	}
}

// End to end without a network: clients refresh through a transport that
// calls the coordinator directly.
func TestClientRefreshAgainstACoordinator(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 6)
	coord := mustCoordinator(t, w.config())
	direct := func(_ context.Context, _ string, req lease.Request) (lease.Response, error) {
		return coord.Handle(clk.Now(), req)
	}
	route := func(string) (string, bool) { return "n0", true }
	clients := []*lease.Client{mustClient(t, "a", clk), mustClient(t, "b", clk), mustClient(t, "c", clk)}
	for range 3 {
		for _, c := range clients {
			res, err := c.Refresh(context.Background(), 0, []lease.Demand{{Namespace: "ns", Wants: 6}}, route, direct)
			if err != nil || len(res) != 1 || res[0].Err != nil || res[0].Namespaces != 1 {
				t.Fatalf("refresh: %+v, %v", res, err)
			}
		}
		clk.Advance(testRefresh)
	}
	var grants []uint32
	for _, c := range clients {
		grants = append(grants, grantOf(c, "ns", clk.Now()))
	}
	if !slices.Equal(grants, []uint32{2, 2, 2}) {
		t.Fatalf("grants %v, want 2 each", grants)
	}
}

// A refresh measures the node's demand only between sweeps: a sweep that
// read a grant of 3 and has not committed its claims yet holds the
// measurement off, so the report that follows counts those claims. The
// case: the coordinator lowered the node's grant from 3 to 2 while a sweep
// under 3 was claiming its third row; a report of the store's count from
// before that commit (2) would let the coordinator hand the third row to
// another node while it runs here.
func TestRefreshMeasuresBetweenSweeps(t *testing.T) {
	clk := newClock()
	c := mustClient(t, "me", clk)
	coord := byName(map[string]string{"ns": "n1"})
	ctx := context.Background()
	grant := func(g uint32) lease.Transport {
		return func(_ context.Context, _ string, req lease.Request) (lease.Response, error) {
			return lease.Response{Leases: []lease.Lease{{Namespace: "ns", Grant: g, ExpiryMS: 60_000, RefreshMS: 100}}}, nil
		}
	}
	if _, err := c.Refresh(ctx, 0, []lease.Demand{{Namespace: "ns", Wants: 3}}, coord, grant(3)); err != nil {
		t.Fatal(err)
	}

	var committed atomic.Int32 // the store's claimed count
	committed.Store(2)
	done := c.Claiming() // a sweep read the grant of 3 and claims its third row
	if rows, _, _ := c.Grant("ns", clk.Now()); rows != 3 {
		t.Fatalf("grant %d, want 3", rows)
	}
	var sent atomic.Uint32 // the Has of the refresh's request
	measured := make(chan struct{})
	finished := make(chan error, 1)
	go func() {
		_, err := c.RefreshMeasured(ctx, 0, func() ([]lease.Demand, error) {
			close(measured)
			return []lease.Demand{{Namespace: "ns", Wants: 3, Claimed: uint32(committed.Load())}}, nil
		}, coord, func(ctx context.Context, to string, req lease.Request) (lease.Response, error) {
			sent.Store(req.Asks[0].Has)
			return grant(2)(ctx, to, req)
		})
		finished <- err
	}()
	select {
	case <-measured:
		t.Fatal("the refresh measured demand while a sweep was claiming")
	case <-time.After(100 * time.Millisecond):
	}
	committed.Store(3) // the sweep's claim is committed
	done()
	if err := <-finished; err != nil {
		t.Fatal(err)
	}
	if has := sent.Load(); has < 3 {
		t.Fatalf("the refresh reported has %d with 3 rows claimed", has)
	}
	// A later refresh reports the committed count, not the lowered grant.
	if _, err := c.RefreshMeasured(ctx, 0, func() ([]lease.Demand, error) {
		return []lease.Demand{{Namespace: "ns", Wants: 3, Claimed: uint32(committed.Load())}}, nil
	}, coord, func(ctx context.Context, to string, req lease.Request) (lease.Response, error) {
		sent.Store(req.Asks[0].Has)
		return grant(2)(ctx, to, req)
	}); err != nil {
		t.Fatal(err)
	}
	if has := sent.Load(); has != 3 {
		t.Fatalf("after the grant was lowered to 2 the refresh reported has %d with 3 rows claimed, want 3", has)
	}
}

// TestClientAsksAgainAfterALostAnswer: the coordinator recorded a grant
// but its answer never reached the node. The node, whose demand has ended
// meanwhile, asks again at its next refresh (wants and has 0) instead of
// staying silent while the coordinator counts the grant against the
// others until it expires; Release covers such a grant too; and after
// MaxLeaseMS, the longest a grant can last, the node stops asking.
func TestClientAsksAgainAfterALostAnswer(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 1)
	coord := mustCoordinator(t, w.config())
	var lose atomic.Bool
	transport := func(_ context.Context, _ string, req lease.Request) (lease.Response, error) {
		resp, err := coord.Handle(clk.Now(), req)
		if err == nil && lose.Load() {
			return lease.Response{}, errors.New("answer lost")
		}
		return resp, err
	}
	route := func(string) (string, bool) { return "n0", true }
	refresh := func(c *lease.Client, wants uint32) []lease.CallResult {
		t.Helper()
		res, err := c.Refresh(context.Background(), 0, []lease.Demand{{Namespace: "ns", Wants: wants}}, route, transport)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	// a wants a row; the coordinator grants it, the answer is lost.
	a, b := mustClient(t, "a", clk), mustClient(t, "b", clk)
	lose.Store(true)
	if res := refresh(a, 1); len(res) != 1 || res[0].Err == nil {
		t.Fatalf("results %+v, want one failed call", res)
	}
	lose.Store(false)
	if g := grantOf(a, "ns", clk.Now()); g != 0 {
		t.Fatalf("a acts on %d rows it never heard of", g)
	}
	clk.Advance(testRefresh)
	// a's demand has ended: it still asks, so the coordinator drops a's
	// grant and b gets the row.
	if res := refresh(a, 0); len(res) != 1 || res[0].Err != nil {
		t.Fatalf("a after the lost answer: results %+v, want one call asking again", res)
	}
	if refresh(b, 1); grantOf(b, "ns", clk.Now()) != 1 {
		t.Fatalf("b got %d while a holds nothing, want the row", grantOf(b, "ns", clk.Now()))
	}

	// Release gives back a grant whose answer was lost. (b first gives its
	// row back: a report of wants 0 still holding it, then one of has 0.)
	c, d := mustClient(t, "c", clk), mustClient(t, "d", clk)
	clk.Advance(testRefresh)
	refresh(b, 0)
	refresh(b, 0)
	lose.Store(true)
	refresh(c, 1)
	lose.Store(false)
	if res := c.Release(context.Background(), 0, route, transport); len(res) != 1 || res[0].Err != nil {
		t.Fatalf("c's Release: results %+v, want one call giving the unheard grant back", res)
	}
	if refresh(d, 1); grantOf(d, "ns", clk.Now()) != 1 {
		t.Fatalf("d got %d after c released, want the row", grantOf(d, "ns", clk.Now()))
	}

	// An unanswered ask is asked about again for MaxLeaseMS, then dropped.
	e := mustClient(t, "e", clk)
	coordOf := byName(map[string]string{"ns": "n0"})
	calls, _ := e.Calls(0, []lease.Demand{{Namespace: "ns", Wants: 1}}, coordOf)
	if len(calls) != 1 {
		t.Fatalf("calls %+v, want one", calls)
	}
	clk.Advance(lease.MaxLeaseMS*time.Millisecond - time.Millisecond)
	if calls, _ := e.Calls(0, nil, coordOf); len(calls) != 1 || calls[0].Request.Asks[0] != (lease.Ask{Namespace: "ns"}) {
		t.Fatalf("calls %+v within MaxLeaseMS of the unanswered ask, want ns with wants and has 0", calls)
	}
	clk.Advance(time.Millisecond)
	if calls, _ := e.Calls(0, nil, coordOf); len(calls) != 0 {
		t.Fatalf("calls %+v MaxLeaseMS after the unanswered ask, want none", calls)
	}
}
