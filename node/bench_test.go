package node_test

import (
	"context"
	"fmt"
	"testing"
	"time"
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
