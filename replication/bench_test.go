package replication_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/replication"
	"github.com/fairshard/fairshard/transfer"
)

// BenchmarkShardSync measures shard sync in bulk: one node holds rows
// (R = 1), a second joins and R becomes 2, so the second copies every
// shard over HTTP (real bbolt files both sides); the timer runs from the
// view change until the newcomer reports every shard synced. Figure:
// rows/s synced.
//
//	go test -run '^$' -bench BenchmarkShardSync -benchtime 1x ./replication
func BenchmarkShardSync(b *testing.B) {
	for _, tc := range []struct {
		rows    int
		payload int
	}{{200_000, 100}, {200, 1 << 20}} {
		b.Run(fmt.Sprintf("rows=%d/payload=%d", tc.rows, tc.payload), func(b *testing.B) {
			var total time.Duration
			synced := 0
			for range b.N {
				b.StopTimer()
				c := newTCluster(b, 1024, 1, "a")
				c.limits = transfer.Limits{}
				c.nodes["a"].repl.Apply(c.view("a")) // limits apply to new nodes only
				fill(b, c.nodes["a"], tc.rows, tc.payload)
				c.factor = 2
				c.add("b")
				b.StartTimer()
				start := time.Now()
				c.apply()
				poll.Eventually(b, 10*time.Minute, "b synced", func() (bool, string) {
					st := c.nodes["b"].repl.Status()
					return st.SyncingShards == 0 && st.ReplicaShards > 0, fmt.Sprint(st)
				})
				total += time.Since(start)
				b.StopTimer()
				synced += tc.rows
				c.close()
			}
			b.ReportMetric(float64(synced)/total.Seconds(), "rows/s")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// fill appends rows straight into n's store, in batches of 2,000.
func fill(b testing.TB, n *tnode, rows, payload int) {
	b.Helper()
	body := make([]byte, payload)
	for i := range body {
		body[i] = 'x'
	}
	now := time.Now().UTC()
	for i := 0; i < rows; {
		batch := make([]outbox.Row, 0, 2000)
		for ; i < rows && len(batch) < 2000; i++ {
			batch = append(batch, outbox.Row{DispatchKey: fmt.Sprintf("wf-%d:%d", i/10, i%10), Namespace: "ns", TaskQueue: "q",
				Payload: body, ContentType: "application/octet-stream", CreatedAt: now, VisibleAfter: now})
		}
		if _, err := n.store.Append(context.Background(), batch); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRoute measures the replicated write path in process (3 nodes,
// real bbolt files and HTTP between them): 64 concurrent producers append
// 16-row batches through one node; R = 1 beside R = 2. Figure: rows/s
// acknowledged.
//
//	go test -run '^$' -bench BenchmarkRoute -benchtime 20000x ./replication
func BenchmarkRoute(b *testing.B) {
	for _, r := range []int{1, 2} {
		b.Run(fmt.Sprintf("R=%d", r), func(b *testing.B) {
			c := &tcluster{t: b, shards: 1024, factor: r, nodes: map[string]*tnode{}}
			c.opts = func(cfg *replication.Config) { cfg.PollInterval = 0 } // the default, 2 s
			for _, n := range []string{"a", "b", "c"} {
				c.add(n)
			}
			c.apply()
			b.Cleanup(c.close)
			poll.Eventually(b, time.Minute, "synced", c.converged)
			b.SetParallelism(benchProducers / 2) // × GOMAXPROCS 2
			var seq atomicCounter
			start := time.Now()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				ctx := context.Background()
				for pb.Next() {
					base := seq.add()
					rows := rowsFor(fmt.Sprintf("r%d-%d", r, base), 16, time.Now().UTC())
					if _, err := c.nodes["a"].repl.Route(ctx, rows); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(16*b.N)/time.Since(start).Seconds(), "rows/s")

		})
	}
}

// benchProducers is BenchmarkRoute's number of concurrent producers.
var benchProducers = 64
