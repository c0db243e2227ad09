package lease_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/fairshard/fairshard/lease"
)

// BenchmarkCoordinatorBatch measures the coordinator's side of one batched
// refresh: one node's Request over 10,000 namespaces, each with 5 nodes on
// record (the other 4 refreshed once before the timer), quota 64, learning
// over. "handle" is Coordinator.Handle alone; "wire" adds decoding the
// request body and encoding the response (what the HTTP handler will add,
// minus the network).
func BenchmarkCoordinatorBatch(b *testing.B) {
	const namespaces, nodes, quota = 10_000, 5, 64
	clk, _, c, reqs := busyCoordinator(b, namespaces, nodes, quota)
	body, err := lease.EncodeRequest(reqs[0])
	if err != nil {
		b.Fatal(err)
	}
	check := func(b *testing.B, resp lease.Response) {
		if len(resp.Leases) != namespaces {
			b.Fatalf("%d leases for %d namespaces", len(resp.Leases), namespaces)
		}
		for _, ns := range []int{0, namespaces / 2, namespaces - 1} {
			if st, _ := c.Status(clk.Now(), nsName(ns)); st.Outstanding > quota || len(st.Nodes) != nodes {
				b.Fatalf("%s: %+v", nsName(ns), st)
			}
		}
	}
	b.Run(fmt.Sprintf("namespaces=%d/nodes=%d/handle", namespaces, nodes), func(b *testing.B) {
		var resp lease.Response
		b.ReportAllocs()
		for b.Loop() {
			resp, err = c.Handle(clk.Now(), reqs[0])
			if err != nil {
				b.Fatal(err)
			}
		}
		check(b, resp)
	})
	b.Run(fmt.Sprintf("namespaces=%d/nodes=%d/wire", namespaces, nodes), func(b *testing.B) {
		var out []byte
		b.ReportAllocs()
		b.SetBytes(int64(len(body)))
		for b.Loop() {
			req, err := lease.DecodeRequest(bytes.NewReader(body))
			if err != nil {
				b.Fatal(err)
			}
			resp, err := c.Handle(clk.Now(), req)
			if err != nil {
				b.Fatal(err)
			}
			if out, err = lease.EncodeResponse(resp); err != nil {
				b.Fatal(err)
			}
		}
		b.StopTimer()
		resp, err := lease.DecodeResponse(bytes.NewReader(out), reqs[0])
		if err != nil {
			b.Fatal(err)
		}
		check(b, resp)
		b.ReportMetric(float64(len(body)), "req-bytes")
		b.ReportMetric(float64(len(out)), "resp-bytes")
	})
}

// BenchmarkClientBatch measures a node's side of one batched refresh over
// 10,000 namespaces: Calls (build the request) and Apply (validate and
// apply the answer).
func BenchmarkClientBatch(b *testing.B) {
	const namespaces = 10_000
	clk := newClock()
	c := mustClient(b, "me", clk)
	demand := make([]lease.Demand, namespaces)
	grants := map[string]uint32{}
	for i := range demand {
		demand[i] = lease.Demand{Namespace: nsName(i), Wants: 4, Claimed: 1}
		grants[nsName(i)] = 2
	}
	route := func(string) (string, bool) { return "coord", true }
	calls, _ := c.Calls(1, demand, route)
	resp := answer(calls[0], 10*time.Second, grants)
	b.ReportAllocs()
	for b.Loop() {
		calls, err := c.Calls(1, demand, route)
		if err != nil || len(calls) != 1 {
			b.Fatalf("%d calls, %v", len(calls), err)
		}
		if err := c.Apply(calls[0], resp); err != nil {
			b.Fatal(err)
		}
	}
	if g := grantOf(c, nsName(7), clk.Now()); g != 2 {
		b.Fatalf("grant %d, want 2", g)
	}
}

// BenchmarkCoordinatorHandoff measures one round of the coordinator's
// hand-off to its successor (handoff.go): 10,000 namespaces with 5 nodes
// on record each, all shipped to one successor. "build" is
// Coordinator.Handoff alone; "wire" adds encoding the shipment and the
// successor's decoding and Inherit.
func BenchmarkCoordinatorHandoff(b *testing.B) {
	const namespaces, nodes, quota = 10_000, 5, 64
	clk, w, c, _ := busyCoordinator(b, namespaces, nodes, quota)
	to := func(string) []string { return []string{"successor"} }
	b.Run(fmt.Sprintf("namespaces=%d/nodes=%d/build", namespaces, nodes), func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if hs := c.Handoff(clk.Now(), "self", to, true)["successor"]; len(hs) == 0 {
				b.Fatal("nothing shipped")
			}
		}
	})
	succ := mustCoordinator(b, w.config())
	b.Run(fmt.Sprintf("namespaces=%d/nodes=%d/wire", namespaces, nodes), func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			for _, h := range c.Handoff(clk.Now(), "self", to, true)["successor"] {
				body, err := json.Marshal(h)
				if err != nil {
					b.Fatal(err)
				}
				got, err := lease.DecodeHandoff(bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				if succ.Inherit(clk.Now(), got) == 0 {
					b.Fatal("nothing kept")
				}
			}
		}
	})
}

// busyCoordinator returns a coordinator of namespaces namespaces (quota
// each, learning over) with nodes nodes on record in every one, each
// having sent the returned request once.
func busyCoordinator(b *testing.B, namespaces, nodes int, quota uint32) (*clock, *world, *lease.Coordinator, []lease.Request) {
	b.Helper()
	clk, w := newClock(), newWorld()
	for i := range namespaces {
		w.coordinate(nsName(i), clk.Now().Add(-time.Hour), quota)
	}
	c := mustCoordinator(b, w.config())
	reqs := make([]lease.Request, nodes)
	for n := range reqs {
		reqs[n] = lease.Request{Node: fmt.Sprintf("node-%d", n), Epoch: 1, Asks: make([]lease.Ask, namespaces)}
		for i := range namespaces {
			reqs[n].Asks[i] = lease.Ask{Namespace: nsName(i), Wants: uint32(8 + (i+n)%32), Has: uint32((i * n) % 12)}
		}
		if _, err := c.Handle(clk.Now(), reqs[n]); err != nil {
			b.Fatal(err)
		}
	}
	return clk, w, c, reqs
}
