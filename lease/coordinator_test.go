package lease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/lease"
)

const (
	testLease   = 10 * time.Second
	testRefresh = 250 * time.Millisecond
)

// world is what a coordinator reads from outside: which namespaces it
// coordinates since when, their quotas, and its ownership epoch.
type world struct {
	mu     sync.Mutex
	since  map[string]time.Time // coordinated namespaces
	quotas map[string]uint32
	epoch  uint64
}

func newWorld() *world {
	return &world{since: map[string]time.Time{}, quotas: map[string]uint32{}}
}

func (w *world) coordinate(ns string, since time.Time, quota uint32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.since[ns], w.quotas[ns] = since, quota
}

func (w *world) drop(ns string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.since, ns)
}

func (w *world) setQuota(ns string, q uint32) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.quotas[ns] = q
}

func (w *world) config() lease.CoordinatorConfig {
	return lease.CoordinatorConfig{
		LeaseLength:     testLease,
		RefreshInterval: testRefresh,
		Coordinates: func(ns string) (time.Time, bool) {
			w.mu.Lock()
			defer w.mu.Unlock()
			s, ok := w.since[ns]
			return s, ok
		},
		Quota: func(ns string) uint32 {
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.quotas[ns]
		},
		Epoch: func() uint64 {
			w.mu.Lock()
			defer w.mu.Unlock()
			return w.epoch
		},
	}
}

func mustCoordinator(t testing.TB, cfg lease.CoordinatorConfig) *lease.Coordinator {
	t.Helper()
	c, err := lease.NewCoordinator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// ask sends one node's single-namespace request and returns its grant.
func ask(t testing.TB, c *lease.Coordinator, now time.Time, node, ns string, wants, has uint32) lease.Lease {
	t.Helper()
	resp, err := c.Handle(now, lease.Request{Node: node, Asks: []lease.Ask{{Namespace: ns, Wants: wants, Has: has}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Leases) != 1 {
		t.Fatalf("%s asking for %s: %+v, want one lease", node, ns, resp)
	}
	return resp.Leases[0]
}

func wantGrant(t testing.TB, l lease.Lease, grant uint32) {
	t.Helper()
	if l.Grant != grant {
		t.Fatalf("%s: grant %d, want %d", l.Namespace, l.Grant, grant)
	}
}

func TestCoordinatorConfigValidation(t *testing.T) {
	w := newWorld()
	for name, mutate := range map[string]func(*lease.CoordinatorConfig){
		"no Coordinates":            func(c *lease.CoordinatorConfig) { c.Coordinates = nil },
		"no Quota":                  func(c *lease.CoordinatorConfig) { c.Quota = nil },
		"refresh longer than lease": func(c *lease.CoordinatorConfig) { c.RefreshInterval = 2 * c.LeaseLength },
		"lease over the wire limit": func(c *lease.CoordinatorConfig) { c.LeaseLength = time.Hour },
		"negative drain":            func(c *lease.CoordinatorConfig) { c.Drain = -time.Second },
	} {
		cfg := w.config()
		mutate(&cfg)
		if _, err := lease.NewCoordinator(cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	cfg := w.config()
	cfg.LeaseLength, cfg.RefreshInterval, cfg.Drain = 0, 0, 3*time.Second
	c := mustCoordinator(t, cfg).Config()
	if c.LeaseLength != lease.DefaultLeaseLength || c.RefreshInterval != lease.DefaultRefreshInterval || c.LearningPeriod != lease.DefaultLeaseLength {
		t.Fatalf("defaults: %+v", c)
	}
}

// Grants follow demand: a node alone gets the whole quota; a second node
// that wants as much gets nothing while the first holds it all (claimed
// rows are never pre-empted), the first is cut to half at its next
// refresh, and the second gets its half once the first reports it no
// longer holds more.
func TestCoordinatorGrantsFollowDemand(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 8) // long past learning
	c := mustCoordinator(t, w.config())

	l := ask(t, c, clk.Now(), "a", "ns", 8, 0)
	wantGrant(t, l, 8)
	if l.ExpiryMS != 10000 || l.RefreshMS != 250 || l.Learning {
		t.Fatalf("lease terms %+v, want expiry 10000 ms, refresh 250 ms, not learning", l)
	}
	clk.Advance(testRefresh)
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 8, 8), 8)   // a claims all 8
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 8, 0), 0)   // nothing free
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 8, 8), 4)   // a cut to its share
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 8, 0), 0)   // a's 8 claimed rows still run
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 8, 5), 4)   // 3 finished
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 8, 0), 3)   // 3 free
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 8, 4), 4)   // one more finished
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 8, 3), 4)   // fair: 4 and 4
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 0, 2), 0)   // a's demand ends
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 8, 4), 6)   // a still holds 2
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 0, 0), 0)   // a drained: forgotten
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 100, 6), 8) // wants capped at the quota
	st, _ := c.Status(clk.Now(), "ns")
	if len(st.Nodes) != 1 || st.Nodes[0].Node != "b" || st.Outstanding != 8 {
		t.Fatalf("status %+v: want only b, holding 8", st)
	}
}

// The sum of holdings stays within the quota whatever the order of
// requests: the coordinator counts each node's grant until the node
// reports it no longer acts on it.
func TestCoordinatorCountsAGrantUntilTheNodeReportsLess(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 6)
	c := mustCoordinator(t, w.config())
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 6, 0), 6)
	// a has not claimed anything yet, but holds a grant of 6: b gets
	// nothing until a's report (has = its grant) comes back lower.
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 6, 0), 0)
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 6, 6), 3) // a reports has = grant 6
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 6, 0), 0) // a may still act on 6
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 6, 3), 3) // a applied 3
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 6, 0), 3)
}

// A request that reaches the coordinator after a later one from the same
// node (its caller timed out and asked again) must not replace the later
// report: the node acts on the later answer. Reproduces a quota overshoot
// seen on a loaded host: a's stale report (has 0) lowered its record to a
// grant of 1 while a acted on 2, and b was granted the row a still held.
func TestCoordinatorIgnoresAReportOlderThanTheLastApplied(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 2)
	c := mustCoordinator(t, w.config())
	a, err := lease.NewClient(lease.ClientConfig{Node: "a", Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	coordinatorOf := func(string) (string, bool) { return "c", true }
	demand := []lease.Demand{{Namespace: "ns", Wants: 2}}
	ctx := context.Background()

	var held []lease.Request // requests the network holds up
	stall := func(_ context.Context, _ string, req lease.Request) (lease.Response, error) {
		held = append(held, req)
		return lease.Response{}, context.DeadlineExceeded
	}
	through := func(_ context.Context, _ string, req lease.Request) (lease.Response, error) {
		return c.Handle(clk.Now(), req)
	}
	if _, err := a.Refresh(ctx, 0, demand, coordinatorOf, stall); err != nil {
		t.Fatal(err)
	}
	clk.Advance(testRefresh)
	if _, err := a.Refresh(ctx, 0, demand, coordinatorOf, through); err != nil {
		t.Fatal(err)
	}
	if rows, _, ok := a.Grant("ns", clk.Now()); !ok || rows != 2 {
		t.Fatalf("a's grant after its second refresh: %d (ok %v), want 2", rows, ok)
	}
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 2, 0), 0) // a holds both
	if len(held) != 1 {
		t.Fatalf("%d held requests, want 1", len(held))
	}
	if _, err := c.Handle(clk.Now(), held[0]); err != nil { // the first request arrives late
		t.Fatal(err)
	}
	aRows, _, _ := a.Grant("ns", clk.Now())
	b := ask(t, c, clk.Now(), "b", "ns", 2, 0)
	if aRows+b.Grant > 2 {
		t.Fatalf("a acts on %d and b is granted %d: %d rows against a quota of 2", aRows, b.Grant, aRows+b.Grant)
	}
	st, _ := c.Status(clk.Now(), "ns")
	if st.Outstanding > 2 {
		t.Fatalf("the coordinator counts %d outstanding against a quota of 2", st.Outstanding)
	}
}

// After a failover the new coordinator learns for one learning period: it
// confirms what nodes report they hold, never more than the quota in
// total, and gives a node that holds nothing nothing, until learning ends.
func TestCoordinatorLearningAfterFailover(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("ns", clk.Now(), 10) // became coordinator just now
	cfg := w.config()
	// Learning shorter than the lease here, so the test needs no refresh
	// loop to keep the records alive across it.
	const learn = 2 * time.Second
	cfg.LearningPeriod = learn
	c := mustCoordinator(t, cfg)

	l := ask(t, c, clk.Now(), "a", "ns", 10, 4) // a holds 4 from the old coordinator
	wantGrant(t, l, 4)
	if !l.Learning {
		t.Fatal("lease not marked learning")
	}
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 10, 0), 0) // new demand waits
	wantGrant(t, ask(t, c, clk.Now(), "c", "ns", 10, 5), 5)
	// d reports holding 3 more (claimed rows a lowered grant left it):
	// they run, but only 1 row of grant is left under the quota.
	wantGrant(t, ask(t, c, clk.Now(), "d", "ns", 10, 3), 1)
	// With d's 3 counted, a's 4 no longer fit: its confirmation shrinks
	// to 2 (its claimed rows are not taken back).
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 10, 4), 2)
	st, _ := c.Status(clk.Now(), "ns")
	if !st.Learning || st.LearningUntil != clk.Now().Add(learn) {
		t.Fatalf("status %+v: want learning for the learning period", st)
	}

	clk.Advance(learn - time.Millisecond)
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 10, 0), 0) // still learning
	clk.Advance(time.Millisecond)
	// Learning is over: fair shares (3, 2, 3, 2), within what is held.
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 10, 4), 3)
	wantGrant(t, ask(t, c, clk.Now(), "c", "ns", 10, 3), 3)
	wantGrant(t, ask(t, c, clk.Now(), "d", "ns", 10, 2), 2)
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 10, 0), 1) // a still holds 4
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 10, 3), 3)
	l = ask(t, c, clk.Now(), "b", "ns", 10, 1)
	wantGrant(t, l, 2)
	if l.Learning {
		t.Fatal("lease still marked learning")
	}
	if st, _ := c.Status(clk.Now(), "ns"); st.Learning || st.Outstanding != 10 {
		t.Fatalf("status %+v: want 10 outstanding, not learning", st)
	}
}

// A coordinator that founded the cluster (its term started longer than a
// learning period ago) grants at once; a negative LearningPeriod turns
// learning off.
func TestCoordinatorLearningCanBeSkipped(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("old", clk.Now().Add(-testLease), 5)
	w.coordinate("new", clk.Now(), 5)
	c := mustCoordinator(t, w.config())
	wantGrant(t, ask(t, c, clk.Now(), "a", "old", 5, 0), 5)
	wantGrant(t, ask(t, c, clk.Now(), "a", "new", 5, 0), 0)
	cfg := w.config()
	cfg.LearningPeriod = -1
	wantGrant(t, ask(t, mustCoordinator(t, cfg), clk.Now(), "a", "new", 5, 0), 5)
}

// A change of term (this node stopped coordinating and started again, or
// resumed after a pause) learns again, starting from what the last term
// still had outstanding: a's grant counts until it is forgotten, though a
// does not report in the new term.
func TestCoordinatorNewTermStartsOver(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 4)
	c := mustCoordinator(t, w.config())
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 4, 0), 4)
	w.coordinate("ns", clk.Now(), 4) // a new term begins now
	st := func() lease.NamespaceStatus { s, _ := c.Status(clk.Now(), "ns"); return s }
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 4, 0), 0) // learning; a's 4 still count
	if s := st(); len(s.Nodes) != 2 || s.Nodes[0].Node != "a" || s.Outstanding != 4 || !s.Learning {
		t.Fatalf("new term status %+v: want a's 4 and b, learning", s)
	}
}

func TestCoordinatorNotCoordinatorAndEpochs(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("mine", clk.Now().Add(-time.Hour), 3)
	w.epoch = 7
	c := mustCoordinator(t, w.config())
	req := lease.Request{Node: "a", Asks: []lease.Ask{{Namespace: "other", Wants: 1}, {Namespace: "mine", Wants: 1}}}
	for _, epoch := range []uint64{0, 6, 7} {
		req.Epoch = epoch
		resp, err := c.Handle(clk.Now(), req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Epoch != 7 || len(resp.Leases) != 1 || resp.Leases[0].Namespace != "mine" || len(resp.NotCoordinator) != 1 || resp.NotCoordinator[0] != "other" {
			t.Fatalf("epoch %d: %+v", epoch, resp)
		}
		if err := resp.Validate(req); err != nil {
			t.Fatalf("epoch %d: response does not validate: %v", epoch, err)
		}
	}
	// The sender saw a newer view: this node's may be stale, so it answers
	// nothing, not even for namespaces it believes it coordinates.
	req.Epoch = 8
	resp, err := c.Handle(clk.Now(), req)
	if err != nil || len(resp.Leases) != 0 || len(resp.NotCoordinator) != 2 {
		t.Fatalf("newer epoch: %+v, %v: want all not coordinated", resp, err)
	}
	// Dropped ownership: not coordinator any more.
	w.drop("mine")
	req.Epoch = 0
	if resp, _ := c.Handle(clk.Now(), req); len(resp.Leases) != 0 {
		t.Fatalf("after losing the shard: %+v", resp)
	}
}

// A node that stops refreshing keeps counting until its grant expires, and
// for Drain after that: it claims nothing new once its grant has expired,
// but it may have claimed up to the grant before (even if it last reported
// fewer), and those rows may still be in flight. Then its share is free.
func TestCoordinatorSilentNodeCountsUntilExpiryPlusDrain(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 4)
	cfg := w.config()
	cfg.Drain = 2 * time.Second
	c := mustCoordinator(t, cfg)
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 4, 0), 4)
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 4, 3), 4) // a claimed 3, then goes silent
	clk.Advance(testLease - time.Millisecond)
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 4, 0), 0) // a's grant still live
	clk.Advance(time.Millisecond)
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 4, 0), 0) // expired; a's rows may still run
	clk.Advance(cfg.Drain - time.Millisecond)
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 4, 0), 0)
	if st, _ := c.Status(clk.Now(), "ns"); st.Outstanding != 4 || len(st.Nodes) != 2 {
		t.Fatalf("status %+v: want a's 4 still counted", st)
	}
	clk.Advance(time.Millisecond)
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 4, 0), 4) // a forgotten
	if st, _ := c.Status(clk.Now(), "ns"); len(st.Nodes) != 1 || st.Nodes[0].Node != "b" {
		t.Fatalf("a not forgotten: %+v", st)
	}
}

// Paused (quota 0) grants nothing; a lowered quota stops new grants until
// what is held drains below it, and never takes back claimed rows.
func TestCoordinatorPausedAndLoweredQuota(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 10)
	c := mustCoordinator(t, w.config())
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 10, 0), 10)
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 10, 10), 10)
	w.setQuota("ns", 4)
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 4, 0), 0)
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 10, 10), 2)
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 4, 0), 0) // a still holds 10 claimed
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 10, 2), 2)
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 4, 0), 2)
	w.setQuota("ns", 0) // paused
	wantGrant(t, ask(t, c, clk.Now(), "a", "ns", 10, 2), 0)
	wantGrant(t, ask(t, c, clk.Now(), "b", "ns", 4, 2), 0)
}

func TestCoordinatorInvalidRequestChangesNothing(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 4)
	c := mustCoordinator(t, w.config())
	_, err := c.Handle(clk.Now(), lease.Request{Node: "a", Asks: []lease.Ask{{Namespace: "ns", Wants: 4}, {Namespace: "ns", Wants: 4}}})
	wantField(t, err, "namespaces[1].namespace")
	_, err = c.Handle(clk.Now(), lease.Request{Node: "", Asks: []lease.Ask{{Namespace: "ns", Wants: 4}}})
	wantField(t, err, "node")
	if c.Namespaces() != 0 {
		t.Fatalf("an invalid request left state for %d namespaces", c.Namespaces())
	}
}

// Expire drops forgotten records, empty namespaces and namespaces this
// node no longer coordinates; Handle forgets a node that wants and holds
// nothing at once.
func TestCoordinatorExpire(t *testing.T) {
	clk, w := newClock(), newWorld()
	for i := range 3 {
		w.coordinate(nsName(i), clk.Now().Add(-time.Hour), 4)
	}
	c := mustCoordinator(t, w.config())
	for i := range 3 {
		ask(t, c, clk.Now(), "a", nsName(i), 2, 0)
	}
	ask(t, c, clk.Now(), "a", nsName(2), 0, 0)
	if c.Namespaces() != 2 {
		t.Fatalf("%d namespaces after a node released ns-2, want 2", c.Namespaces())
	}
	w.drop(nsName(0))
	if n := c.Expire(clk.Now()); n != 1 || c.Namespaces() != 1 {
		t.Fatalf("Expire dropped %d, %d left: want ns-0 dropped", n, c.Namespaces())
	}
	clk.Advance(testLease)
	if n := c.Expire(clk.Now()); n != 1 || c.Namespaces() != 0 {
		t.Fatalf("Expire after the lease dropped %d, %d left", n, c.Namespaces())
	}
}

// One batched request answers every namespace in order; concurrent
// batches from many nodes keep every namespace within its quota.
func TestCoordinatorConcurrentBatches(t *testing.T) {
	clk, w := newClock(), newWorld()
	const namespaces, nodes, quota = 200, 8, 5
	for i := range namespaces {
		w.coordinate(nsName(i), clk.Now().Add(-time.Hour), quota)
	}
	c := mustCoordinator(t, w.config())
	var wg sync.WaitGroup
	for n := range nodes {
		wg.Go(func() {
			req := lease.Request{Node: fmt.Sprintf("node-%d", n)}
			for i := range namespaces {
				req.Asks = append(req.Asks, lease.Ask{Namespace: nsName(i), Wants: quota})
			}
			for range 20 {
				resp, err := c.Handle(clk.Now(), req)
				if err != nil {
					t.Error(err)
					return
				}
				for i, l := range resp.Leases {
					if l.Namespace != nsName(i) {
						t.Errorf("lease %d is for %s", i, l.Namespace)
					}
					req.Asks[i].Has = l.Grant
				}
			}
		})
	}
	wg.Wait()
	for i := range namespaces {
		st, _ := c.Status(clk.Now(), nsName(i))
		if st.Outstanding > quota {
			t.Fatalf("%s: %d outstanding > quota %d", nsName(i), st.Outstanding, quota)
		}
	}
}

// TestFirstRefreshCapsAtMemberShare: with Members set, for one refresh
// interval after a namespace's state is created no node gets more than
// max(has, ceil(q / members)); later asks get the fair share over the
// nodes on record, and a node alone gets the whole quota one refresh in.
func TestFirstRefreshCapsAtMemberShare(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 64)
	cfg := w.config()
	cfg.Members = func() int { return 5 }
	c := mustCoordinator(t, cfg)
	ask := func(node string, wants, has uint32) uint32 {
		t.Helper()
		resp, err := c.Handle(clk.Now(), lease.Request{Node: node, Asks: []lease.Ask{{Namespace: "ns", Wants: wants, Has: has}}})
		if err != nil || len(resp.Leases) != 1 {
			t.Fatalf("%s: %+v, %v", node, resp, err)
		}
		return resp.Leases[0].Grant
	}
	if g := ask("a", 80, 0); g != 13 {
		t.Fatalf("first asker: grant %d, want ceil(64/5) = 13", g)
	}
	for _, n := range []string{"b", "c", "d"} {
		if g := ask(n, 80, 0); g != 13 {
			t.Fatalf("%s in the first refresh: grant %d, want 13", n, g)
		}
	}
	if g := ask("e", 80, 0); g != 12 {
		t.Fatalf("e in the first refresh: grant %d, want the 12 left", g)
	}
	// A refresh later the cap is off: a alone again (the others gave
	// theirs back) gets the whole quota.
	clk.Advance(testRefresh)
	for _, n := range []string{"b", "c", "d", "e"} {
		ask(n, 0, 0)
	}
	if g := ask("a", 80, 13); g != 64 {
		t.Fatalf("a refresh later, alone: grant %d, want 64", g)
	}
}

// A new coordinator stops learning as soon as every member of its view
// has reported in the term (CoordinatorConfig.Reporters): each report
// counts the member's unexpired grant in its has, so every grant a
// predecessor handed out is on record. Until the last member has
// reported nothing new is granted; a member that reports nothing held
// counts as heard; a node outside the view does not end it; a record the
// predecessor shipped (a silent holder) keeps counting after it.
func TestCoordinatorLearningEndsWhenEveryMemberReported(t *testing.T) {
	clk, w := newClock(), newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 4)
	old := mustCoordinator(t, w.config())
	wantGrant(t, ask(t, old, clk.Now(), "z", "ns", 1, 1), 1) // z: the old coordinator's node, about to die
	ship := old.Handoff(clk.Now(), "z", func(string) []string { return []string{"b"} }, true)

	wb := newWorld()
	wb.coordinate("ns", clk.Now(), 4) // b's term begins now
	members := []string{"a", "b", "c"}
	cfg := wb.config()
	cfg.Reporters = func() []string { return members }
	b := mustCoordinator(t, cfg)
	if n := b.Inherit(clk.Now(), ship["b"][0]); n != 1 {
		t.Fatalf("inherited %d namespaces, want 1", n)
	}
	learning := func() bool { st, _ := b.Status(clk.Now(), "ns"); return st.Learning }

	l := ask(t, b, clk.Now(), "a", "ns", 4, 2) // a holds 2 from the old coordinator
	wantGrant(t, l, 2)
	if !l.Learning || !learning() {
		t.Fatal("learning ended after one of three members reported")
	}
	wantGrant(t, ask(t, b, clk.Now(), "x", "ns", 4, 0), 0) // not a member: heard, ends nothing
	wantGrant(t, ask(t, b, clk.Now(), "c", "ns", 0, 0), 0) // c holds nothing
	if !learning() {
		t.Fatal("learning ended before b reported")
	}
	// b's report completes the members: learning ends with it, and b gets
	// the one row left (quota 4 − a's 2 − z's shipped 1).
	l = ask(t, b, clk.Now(), "b", "ns", 4, 0)
	if l.Learning || learning() {
		t.Fatalf("lease %+v: learning goes on after every member reported", l)
	}
	wantGrant(t, l, 1)
	if st, _ := b.Status(clk.Now(), "ns"); st.Outstanding != 4 || !st.LearningUntil.Equal(clk.Now()) {
		t.Fatalf("status %+v: want 4 outstanding (z's shipped 1 counts), learning until now", st)
	}
	wantGrant(t, ask(t, b, clk.Now(), "x", "ns", 4, 0), 0) // z's row still counts: nothing is left

	// Without Reporters the same term learns for the whole period.
	wc := newWorld()
	wc.coordinate("ns", clk.Now(), 4)
	c := mustCoordinator(t, wc.config())
	for _, n := range members {
		ask(t, c, clk.Now(), n, "ns", 4, 0)
	}
	if l := ask(t, c, clk.Now(), "a", "ns", 4, 0); !l.Learning || l.Grant != 0 {
		t.Fatalf("lease %+v without Reporters: want learning, no grant", l)
	}
}
