package backpressure_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/outbox/memstore"
	"github.com/fairshard/fairshard/outbox/outboxtest"
	"github.com/fairshard/fairshard/quota"
)

// BenchmarkSweep measures one planner sweep (batch 256) over N namespaces
// that each have pending rows on two routes, against boltstore (the
// production store: maintained indexes, one fsync'd group commit per claim
// call) and memstore (the reference store: scans). The claimed rows are
// re-armed between iterations, outside the timer.
func BenchmarkSweep(b *testing.B) {
	for _, n := range []int{10, 100, 1_000, 10_000} {
		b.Run(fmt.Sprintf("store=boltstore/namespaces=%d", n), func(b *testing.B) {
			s, err := boltstore.Open(filepath.Join(b.TempDir(), "bench.db"), boltstore.Options{ShardCount: 1024, SkipOpenCheck: true})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			benchSweep(b, s, n)
		})
		b.Run(fmt.Sprintf("store=memstore/namespaces=%d", n), func(b *testing.B) {
			benchSweep(b, memstore.New(1024), n)
		})
	}
}

// benchSweep is shared with the boltstore variant of this benchmark.
func benchSweep(b *testing.B, store outbox.Store, namespaces int) {
	rows := make([]outbox.Row, 0, namespaces*4)
	for i := range namespaces {
		for j := range 4 {
			rows = append(rows, outboxtest.Row(fmt.Sprintf("ns%05d-%d", i, j), fmt.Sprintf("ns%05d", i), fmt.Sprintf("q%d", j%2)))
		}
	}
	for len(rows) > 0 {
		n := min(len(rows), 1000)
		if _, err := store.Append(ctx, rows[:n]); err != nil {
			b.Fatal(err)
		}
		rows = rows[n:]
	}
	p := backpressure.NewPlanner(backpressure.PlannerConfig{
		Ceilings: quota.NewProportional(quota.NewPolicies(nil, quota.Defaults{Quota: quota.DefaultQuota}, time.Minute), nil),
		Now:      func() time.Time { return outboxtest.T0 },
	})
	claimed := 0
	b.ResetTimer()
	for b.Loop() {
		s, err := p.Sweep(ctx, store, 256, nil)
		if err != nil {
			b.Fatal(err)
		}
		claimed += len(s.Rows)
		b.StopTimer()
		if _, err := store.RearmStale(ctx, outbox.RearmParams{OlderThan: outboxtest.T0.Add(time.Hour), VisibleAfter: outboxtest.T0, Limit: len(s.Rows) + 1}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(claimed)/float64(b.N), "rows/sweep")
}
