package lease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fairshard/fairshard/lease"
)

// TestContendedQuotaTakesTurns: quota 2 and three nodes that never run out
// of rows (each claims its whole grant every round and its rows take one
// refresh interval). The rows left over by FairShare's level go round the
// nodes: every node is granted a row again within a bound of a few turns,
// and the holdings never exceed the quota. Before turns, the two first
// holders kept the quota for as long as they had a backlog and the third
// node's rows waited for good (a 12-minute soak left thousands of rows of
// a quota-2 namespace undelivered on one node).
func TestContendedQuotaTakesTurns(t *testing.T) {
	for _, tc := range []struct {
		quota uint32
		nodes int
	}{{2, 3}, {1, 3}, {3, 5}, {7, 4}} {
		t.Run(fmt.Sprintf("quota %d, %d nodes", tc.quota, tc.nodes), func(t *testing.T) {
			const R = testRefresh
			clk := newClock()
			w := newWorld()
			w.coordinate("ns", clk.Now().Add(-time.Hour), tc.quota) // past learning
			cfg := w.config()
			coord, err := lease.NewCoordinator(cfg)
			if err != nil {
				t.Fatal(err)
			}
			turn := coord.Config().Turn
			nodes := make([]*simNode, tc.nodes)
			for i := range nodes {
				name := fmt.Sprintf("node-%d", i)
				c, err := lease.NewClient(lease.ClientConfig{Node: name, Now: clk.Now})
				if err != nil {
					t.Fatal(err)
				}
				nodes[i] = &simNode{name: name, client: c, demand: tc.quota}
			}
			transport := func(_ context.Context, _ string, req lease.Request) (lease.Response, error) {
				return coord.Handle(clk.Now(), req)
			}
			route := func(string) (string, bool) { return "coord", true }
			lastGranted := make([]time.Time, len(nodes))
			ran, slots := 0, 0 // rows run and quota slots offered, over the rounds
			start := clk.Now()
			// The longest a node may go without a row: one turn for each
			// other node that may be ahead of it, plus the refreshes a row
			// takes to change hands.
			bound := time.Duration(len(nodes))*turn + 4*R
			for round := 0; round < int(60*time.Second/R); round++ {
				clk.Advance(R)
				now := clk.Now()
				for i, n := range nodes {
					n.rows = n.rows[:0] // last round's rows are done
					g, _, _ := n.client.Grant("ns", now)
					for uint32(len(n.rows)) < min(g, n.demand) {
						n.rows = append(n.rows, now.Add(R))
					}
					ran += len(n.rows)
					if len(n.rows) > 0 || lastGranted[i].IsZero() {
						lastGranted[i] = now
					}
					demand := []lease.Demand{{Namespace: "ns", Wants: n.demand, Claimed: uint32(len(n.rows))}}
					if _, err := n.client.Refresh(context.Background(), 0, demand, route, transport); err != nil {
						t.Fatal(err)
					}
					var total uint32
					for _, m := range nodes {
						total += m.holds(now)
					}
					if total > tc.quota {
						t.Fatalf("%v: nodes hold %d > quota %d", now.Sub(start), total, tc.quota)
					}
				}
				slots += int(tc.quota)
				for i, n := range nodes {
					if waited := now.Sub(lastGranted[i]); waited > bound {
						t.Fatalf("%v: %s has run no row for %v (bound %v: %d nodes × turn %v + 4 refreshes)",
							now.Sub(start), n.name, waited, bound, len(nodes), turn)
					}
				}
			}
			// Turns cost the rounds a row takes to change hands; the quota
			// stays mostly busy (a count over the same run, not a clock).
			if used := float64(ran) / float64(slots); used < 0.8 {
				t.Fatalf("the quota was used %.2f of the rounds, want ≥ 0.8 (%d rows in %d slots)", used, ran, slots)
			} else {
				t.Logf("quota used %.3f of the rounds (%d rows in %d slots)", used, ran, slots)
			}
		})
	}
}

// TestReleaseFreesTheQuotaAtOnce: a node that stops for good (a graceful
// stop, its deliveries finished) gives its grants back; the coordinator
// forgets it at once, so another node gets the quota on its next refresh
// instead of one lease length (plus the drain) later, and the released
// client asks for nothing more.
func TestReleaseFreesTheQuotaAtOnce(t *testing.T) {
	clk := newClock()
	w := newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 2)
	cfg := w.config()
	cfg.Drain = time.Minute
	coord, err := lease.NewCoordinator(cfg)
	if err != nil {
		t.Fatal(err)
	}
	transport := func(_ context.Context, _ string, req lease.Request) (lease.Response, error) {
		return coord.Handle(clk.Now(), req)
	}
	route := func(string) (string, bool) { return "coord", true }
	newClient := func(name string) *lease.Client {
		c, err := lease.NewClient(lease.ClientConfig{Node: name, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := newClient("a"), newClient("b")
	refresh := func(c *lease.Client, claimed uint32) uint32 {
		t.Helper()
		if _, err := c.Refresh(context.Background(), 0, []lease.Demand{{Namespace: "ns", Wants: 2, Claimed: claimed}}, route, transport); err != nil {
			t.Fatal(err)
		}
		g, _, _ := c.Grant("ns", clk.Now())
		return g
	}
	if g := refresh(a, 0); g != 2 {
		t.Fatalf("a alone got %d, want the whole quota 2", g)
	}
	clk.Advance(testRefresh)
	if g := refresh(b, 0); g != 0 {
		t.Fatalf("b got %d while a holds the quota", g)
	}
	for _, res := range a.Release(context.Background(), 0, route, transport) {
		if res.Err != nil {
			t.Fatal(res.Err)
		}
	}
	if g, _, ok := a.Grant("ns", clk.Now()); ok || g != 0 {
		t.Fatalf("a's grant after Release: %d (ok %v), want none", g, ok)
	}
	if calls, _ := a.Calls(0, []lease.Demand{{Namespace: "ns", Wants: 2}}, route); len(calls) != 0 {
		t.Fatalf("a released builds %d calls, want none", len(calls))
	}
	clk.Advance(testRefresh)
	if g := refresh(b, 0); g != 2 {
		t.Fatalf("b got %d right after a released, want 2", g)
	}
}

// TestHandoffRefreshesSooner: a node waiting for a contended row, and a
// holder whose grant is below what it holds, are told to refresh at a
// fifth of the interval, so a row changing hands idles about a fifth of a
// refresh; a node that has what it wants keeps the interval.
func TestHandoffRefreshesSooner(t *testing.T) {
	clk := newClock()
	w := newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 1)
	coord, err := lease.NewCoordinator(w.config())
	if err != nil {
		t.Fatal(err)
	}
	ask := func(node string, wants, has uint32) lease.Lease {
		t.Helper()
		resp, err := coord.Handle(clk.Now(), lease.Request{Node: node, Asks: []lease.Ask{{Namespace: "ns", Wants: wants, Has: has}}})
		if err != nil || len(resp.Leases) != 1 {
			t.Fatalf("Handle: %+v %v", resp, err)
		}
		return resp.Leases[0]
	}
	full, fast := uint32(testRefresh/time.Millisecond), uint32(testRefresh/time.Millisecond)/5
	if l := ask("a", 1, 0); l.Grant != 1 || l.RefreshMS != full {
		t.Fatalf("a alone: %+v, want the row and the usual refresh", l)
	}
	if l := ask("b", 1, 0); l.Grant != 0 || l.RefreshMS != fast {
		t.Fatalf("b waiting: %+v, want no row and refresh_ms %d", l, fast)
	}
	// a's turn ends; b has waited longer: a's grant goes to 0 while it
	// still runs its row.
	clk.Advance(coord.Config().Turn + testRefresh)
	if l := ask("a", 1, 1); l.Grant != 0 || l.RefreshMS != fast {
		t.Fatalf("a at the end of its turn: %+v, want grant 0 and refresh_ms %d", l, fast)
	}
}

// TestFreedRowGoesToTheLongestWaiter: quota 2 is held by a and b; z has
// waited for a row since before c. When a's row finishes and b still runs
// its own, the one free row is z's: c, asking first, gets nothing, and z
// gets the row at its own refresh. Node names put c before z, so an order
// by index would hand the row to c and leave z waiting behind a later
// arrival.
func TestFreedRowGoesToTheLongestWaiter(t *testing.T) {
	clk := newClock()
	w := newWorld()
	w.coordinate("ns", clk.Now().Add(-time.Hour), 2)
	coord, err := lease.NewCoordinator(w.config())
	if err != nil {
		t.Fatal(err)
	}
	ask := func(node string, wants, has uint32) uint32 {
		t.Helper()
		resp, err := coord.Handle(clk.Now(), lease.Request{Node: node, Asks: []lease.Ask{{Namespace: "ns", Wants: wants, Has: has}}})
		if err != nil || len(resp.Leases) != 1 {
			t.Fatalf("Handle: %+v %v", resp, err)
		}
		return resp.Leases[0].Grant
	}
	if ga, gb := ask("a", 1, 0), ask("b", 1, 0); ga != 1 || gb != 1 {
		t.Fatalf("a and b got %d and %d, want the quota split 1 and 1", ga, gb)
	}
	if g := ask("z", 1, 0); g != 0 {
		t.Fatalf("z got %d while a and b hold the quota", g)
	}
	clk.Advance(testRefresh)
	if g := ask("c", 1, 0); g != 0 {
		t.Fatalf("c got %d while a and b hold the quota", g)
	}
	clk.Advance(testRefresh)
	// a and b still run their rows: their grants go to the waiters, the
	// rows are not pre-empted.
	if ga, gb := ask("a", 1, 1), ask("b", 1, 1); ga != 0 || gb != 0 {
		t.Fatalf("a and b kept %d and %d, want 0 each: z and c wait longer", ga, gb)
	}
	clk.Advance(testRefresh)
	if g := ask("a", 1, 0); g != 0 { // a's row finished: one row is free
		t.Fatalf("a got %d back, want 0", g)
	}
	if g := ask("c", 1, 0); g != 0 {
		t.Fatalf("c got the free row (%d) although z has waited longer", g)
	}
	if g := ask("z", 1, 0); g != 1 {
		t.Fatalf("z got %d, want the free row", g)
	}
}
