package backpressure_test

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/lease"
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
//
// source=proportional is the seed's ceiling; source=lease is exact mode's
// (quota.ByMode over quota.Leased over a real lease.Client holding a grant
// of 4 rows for every namespace): the cost the lease adds to a sweep is a
// client lookup per active namespace.
func BenchmarkSweep(b *testing.B) {
	for _, n := range []int{10, 100, 1_000, 10_000} {
		for _, src := range []string{"proportional", "lease"} {
			b.Run(fmt.Sprintf("store=boltstore/source=%s/namespaces=%d", src, n), func(b *testing.B) {
				s, err := boltstore.Open(filepath.Join(b.TempDir(), "bench.db"), boltstore.Options{ShardCount: 1024, SkipOpenCheck: true})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				benchSweep(b, s, n, ceilingSource(b, src, n))
			})
			b.Run(fmt.Sprintf("store=memstore/source=%s/namespaces=%d", src, n), func(b *testing.B) {
				benchSweep(b, memstore.New(1024), n, ceilingSource(b, src, n))
			})
		}
	}
}

// ceilingSource builds the benchmark's ceilings: proportional (the
// default quota, one node), or exact over a lease client that holds a
// grant of 4 rows for each of the namespaces, valid for an hour.
func ceilingSource(b *testing.B, src string, namespaces int) quota.Source {
	b.Helper()
	pol := quota.NewPolicies(nil, quota.Defaults{Quota: quota.DefaultQuota, Mode: quota.ModeProportional}, time.Minute)
	if src == "proportional" {
		return quota.NewProportional(pol, nil)
	}
	exact := quota.NewPolicies(nil, quota.Defaults{Quota: quota.DefaultQuota, Mode: quota.ModeExact}, time.Minute)
	client, err := lease.NewClient(lease.ClientConfig{Node: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	demand := make([]lease.Demand, namespaces)
	for i := range demand {
		demand[i] = lease.Demand{Namespace: fmt.Sprintf("ns%05d", i), Wants: 4}
	}
	calls, err := client.Calls(0, demand, func(string) (string, bool) { return "coordinator", true })
	if err != nil {
		b.Fatal(err)
	}
	for _, call := range calls {
		resp := lease.Response{Leases: make([]lease.Lease, len(call.Request.Asks))}
		for i, a := range call.Request.Asks {
			resp.Leases[i] = lease.Lease{Namespace: a.Namespace, Grant: 4, ExpiryMS: 3_600_000 / 6, RefreshMS: 250}
		}
		if err := client.Apply(call, resp); err != nil {
			b.Fatal(err)
		}
	}
	return quota.NewByMode(exact, quota.NewProportional(exact, nil), quota.NewLeased(exact, client, nil))
}

// benchSweep is shared with the boltstore variant of this benchmark.
func benchSweep(b *testing.B, store outbox.Store, namespaces int, ceilings quota.Source) {
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
		Ceilings: ceilings,
		Claimed:  quota.CountFunc(store.CountClaimedByNamespace),
		Now:      func() time.Time { return outboxtest.T0 },
	})
	claimed := 0
	b.ResetTimer()
	for b.Loop() {
		s, err := p.Sweep(ctx, store, backpressure.SweepRequest{Batch: 256})
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
