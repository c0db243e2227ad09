package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/peer"
	"github.com/fairshard/fairshard/lease"
)

// BenchmarkShutdownHandoff measures a graceful stop of one node of two
// that holds rows spread over the ~512 shards it owns: the final handoff
// dominates. Reported: rows handed off per second of Shutdown.
//
//	go test -run '^$' -bench BenchmarkShutdownHandoff -benchtime 3x ./node
func BenchmarkShutdownHandoff(b *testing.B) {
	for _, rows := range []int{2000, 10000} {
		b.Run(fmt.Sprintf("rows=%d", rows), func(b *testing.B) {
			var total time.Duration
			moved := 0
			for range b.N {
				b.StopTimer()
				nodes := startCluster(b, 2, nil)
				pause(b, nodes, "bench")
				for i := 0; i < rows; i += 500 {
					var batch []rowIn
					for j := i; j < min(i+500, rows); j++ {
						batch = append(batch, rowIn{"dispatch_key": fmt.Sprintf("bench-%d", j), "namespace": "bench"})
					}
					nodes[0].appendRows(batch...)
				}
				held := nodes[1].namespace("bench").Pending
				ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
				b.StartTimer()
				start := time.Now()
				err := nodes[1].Shutdown(ctx)
				total += time.Since(start)
				b.StopTimer()
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				moved += held
			}
			b.ReportMetric(float64(moved)/total.Seconds(), "rows/s")
		})
	}
}

// BenchmarkLeaseRefreshHTTP measures one lease refresh of a node with
// demand for 10,000 namespaces whose coordinator is another node: the
// client builds the batched request (lease.Client.Calls), sends it over
// the real node-to-node HTTP client (peer.Client.Lease: JSON, validation)
// to a real node's POST /internal/v1/leases, whose coordinator answers for
// all 10,000 (5 nodes on record each, learning over), and applies the
// answer. One call per node pair per refresh carries all of it. Reported:
// request bytes and calls per refresh.
//
//	go test -run '^$' -bench BenchmarkLeaseRefreshHTTP -benchtime 20x ./node
func BenchmarkLeaseRefreshHTTP(b *testing.B) {
	const namespaces = 10_000
	coord := startNode(b, nil)   // alone: it coordinates every namespace, without learning
	peers := peer.NewClient(nil) // the test node has no cluster secret: unsigned calls
	defer peers.CloseIdle()
	addr := coord.APIAddr()
	transport := func(ctx context.Context, _ string, req lease.Request) (lease.Response, error) {
		return peers.Lease(ctx, addr, req)
	}
	to := func(string) (string, bool) { return coord.Name(), true }
	demand := make([]lease.Demand, namespaces)
	for i := range demand {
		demand[i] = lease.Demand{Namespace: fmt.Sprintf("ns%05d", i), Wants: uint32(1 + i%16), Claimed: uint32(i % 3)}
	}
	// Four other nodes on record for every namespace, as in a 5-node cluster.
	for n := range 4 {
		c, err := lease.NewClient(lease.ClientConfig{Node: fmt.Sprintf("other-%d", n)})
		if err != nil {
			b.Fatal(err)
		}
		if res, _ := c.Refresh(context.Background(), 0, demand, to, transport); len(res) != 1 || res[0].Err != nil {
			b.Fatalf("warm-up refresh of other-%d: %+v", n, res)
		}
	}
	client, err := lease.NewClient(lease.ClientConfig{Node: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	calls, _ := client.Calls(0, demand, to)
	body, _ := lease.EncodeRequest(calls[0].Request)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		res, err := client.Refresh(context.Background(), 0, demand, to, transport)
		if err != nil || len(res) != 1 || res[0].Err != nil || res[0].Namespaces != namespaces {
			b.Fatalf("refresh: %+v, %v", res, err)
		}
		n += len(res)
	}
	b.ReportMetric(float64(n)/float64(b.N), "calls/refresh")
	if g, _, ok := client.Grant("ns00015", time.Now()); !ok || g == 0 {
		b.Fatalf("ns00015: grant %d (%v), want > 0", g, ok)
	}
}
