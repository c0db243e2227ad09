package dispatch

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/quota"
)

// BenchmarkSlotUse measures how busy a namespace's quota keeps its target
// on one node (DESIGN.md: a quota is a promise of concurrency): one
// namespace of quota q, a backlog of rows appended before Run, a target
// that holds each request hold. Reported per op (a fresh boltstore):
// drain_x (drain time ÷ the ideal rows ÷ q × hold), quota_used (Σ time the
// target held requests ÷ (q × drain)), and the gap from a response leaving
// the target to the next request of the namespace arriving there, p50 and
// p99 (ms; only while rows were waiting). The check: the target never
// sees more than q at once and every row is delivered once.
//
//	go test -run '^$' -bench SlotUse -benchtime 3x ./dispatch/
func BenchmarkSlotUse(b *testing.B) {
	for _, c := range []struct {
		q    uint32
		hold time.Duration
		rows int
	}{{1, 20 * time.Millisecond, 300}, {3, 50 * time.Millisecond, 420}, {7, 50 * time.Millisecond, 420}, {64, 50 * time.Millisecond, 3200}} {
		if testing.Short() {
			c.rows /= 10
		}
		b.Run(fmt.Sprintf("q=%d/hold=%v", c.q, c.hold), func(b *testing.B) { benchSlotUse(b, c.q, c.hold, c.rows) })
	}
}

func benchSlotUse(b *testing.B, q uint32, hold time.Duration, rows int) {
	var (
		mu       sync.Mutex
		inflight int
		peak     int
		busy     time.Duration
		lastFree []time.Time // response times not yet followed by a request
		gaps     []time.Duration
		seen     = map[string]int{}
	)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		start := time.Now()
		mu.Lock()
		inflight++
		peak = max(peak, inflight)
		if n := len(lastFree); n > 0 {
			gaps = append(gaps, start.Sub(lastFree[0]))
			lastFree = lastFree[1:]
		}
		seen[r.Header.Get("Fairshard-Dispatch-Key")]++
		mu.Unlock()
		time.Sleep(hold)
		end := time.Now()
		mu.Lock()
		inflight--
		busy += end.Sub(start)
		lastFree = append(lastFree, end)
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()

	var drain time.Duration
	for i := range b.N {
		b.StopTimer()
		mu.Lock()
		lastFree = lastFree[:0]
		mu.Unlock()
		store, _ := storeKinds[1].open(b) // boltstore: the commits are part of the gap
		cfg := Config{Store: store, Targets: static(srv.URL), Registerer: prometheus.NewRegistry()}
		cfg.fillDefaults()
		cfg.Hosts = testHosts(b, cfg)
		claims := newLateClaims(cfg.Store)
		cfg.Planner = backpressure.NewPlanner(backpressure.PlannerConfig{
			Ceilings: quota.NewProportional(quota.NewPolicies(nil, quota.Defaults{Quota: q}, 0), nil),
			Claimed:  claims,
			Hosts:    cfg.Hosts,
		})
		d, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		claims.bind(d)
		now := time.Now()
		rs := make([]outbox.Row, rows)
		for j := range rs {
			rs[j] = mkRow(fmt.Sprintf("op%d-%05d", i, j), "ns", "tq", now)
		}
		if _, err := store.Append(context.Background(), rs); err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		runDone := make(chan error, 1)
		b.StartTimer()
		start := time.Now()
		go func() { runDone <- d.Run(ctx) }()
		deadline := start.Add(2 * time.Minute)
		for {
			left, err := store.CountInFlight(context.Background(), "ns")
			if err != nil {
				b.Fatal(err)
			}
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d rows not done after 2 min", left, rows)
			}
			time.Sleep(time.Millisecond)
		}
		drain += time.Since(start)
		b.StopTimer()
		cancel()
		if err := <-runDone; err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	mu.Lock()
	defer mu.Unlock()
	if peak > int(q) {
		b.Fatalf("the target saw %d requests at once; the quota is %d", peak, q)
	}
	for k, n := range seen {
		if n != 1 {
			b.Fatalf("row %s delivered %d times", k, n)
		}
	}
	if len(seen) != rows*b.N {
		b.Fatalf("%d distinct rows delivered, want %d", len(seen), rows*b.N)
	}
	ideal := time.Duration(float64(hold) * float64(rows) / float64(q) * float64(b.N))
	b.ReportMetric(drain.Seconds()/ideal.Seconds(), "drain_x")
	b.ReportMetric(busy.Seconds()/(float64(q)*drain.Seconds()), "quota_used")
	b.ReportMetric(pctMS(gaps, 0.50), "gap_p50_ms")
	b.ReportMetric(pctMS(gaps, 0.99), "gap_p99_ms")
	b.ReportMetric(0, "ns/op")
}

// pctMS is the p-quantile of ds in milliseconds (0 for none); it sorts ds.
func pctMS(ds []time.Duration, p float64) float64 {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return float64(ds[min(int(p*float64(len(ds))), len(ds)-1)]) / float64(time.Millisecond)
}
