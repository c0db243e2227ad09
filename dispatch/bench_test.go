package dispatch

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/fairshard/fairshard/outbox"
)

// BenchmarkEndToEnd measures rows/s from append to done on one node: a
// producer appends rows (batches of 100, 2 namespaces × 4 task queues,
// Wake after each batch) as fast as the store accepts them, or at a paced
// offered rate; the dispatcher (default Config) claims, POSTs each row to a
// local no-op httptest target and settles it. One op is rowsPerOp rows on
// a fresh store. Reported: rows/s (rows / time from the first append to
// the last settle) and the append→done latency percentiles (FinishedAt −
// CreatedAt of every row, in ms).
//
//	go test -run '^$' -bench EndToEnd -benchtime 3x ./dispatch/
func BenchmarkEndToEnd(b *testing.B) {
	for _, st := range storeKinds {
		b.Run(st.name+"/saturate", func(b *testing.B) { benchEndToEnd(b, st, 20_000, 0, 0) })
		b.Run(st.name+"/saturate-batch1024", func(b *testing.B) { benchEndToEnd(b, st, 20_000, 0, 1024) })
		b.Run(st.name+"/paced-2000rps", func(b *testing.B) { benchEndToEnd(b, st, 4_000, 2000, 0) })
	}
}

func benchEndToEnd(b *testing.B, st storeKind, rowsPerOp, ratePerSec, batchSize int) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	const batch = 100
	namespaces := []string{"alpha", "beta"}

	var (
		lat      []time.Duration
		rows     int
		elapsed  time.Duration
		sweeps   uint64
		sweepSum float64
	)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		store, _ := st.open(b)
		reg := prometheus.NewRegistry()
		cfg := Config{Store: store, Planner: testPlanner(), Targets: static(srv.URL), Registerer: reg, BatchSize: batchSize}
		d, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		runDone := make(chan error, 1)
		go func() { runDone <- d.Run(ctx) }()
		delivered := func() int {
			n := 0
			for _, ns := range namespaces {
				n += int(testutil.ToFloat64(d.m.delivered.WithLabelValues(ns)))
			}
			return n
		}
		b.StartTimer()

		start := time.Now()
		var pace *time.Ticker
		if ratePerSec > 0 {
			pace = time.NewTicker(time.Duration(float64(time.Second) * batch / float64(ratePerSec)))
		}
		keys := make([]string, 0, rowsPerOp)
		for off := 0; off < rowsPerOp; off += batch {
			if pace != nil {
				<-pace.C
			}
			now := time.Now()
			rs := make([]outbox.Row, 0, batch)
			for j := off; j < min(off+batch, rowsPerOp); j++ {
				k := fmt.Sprintf("op%d-%06d", i, j)
				keys = append(keys, k)
				rs = append(rs, mkRow(k, namespaces[j%2], fmt.Sprintf("tq-%d", (j/2)%4), now))
			}
			if _, err := store.Append(ctx, rs); err != nil {
				b.Fatal(err)
			}
			d.Wake()
		}
		if pace != nil {
			pace.Stop()
		}
		deadline := time.Now().Add(2 * time.Minute)
		for delivered() < rowsPerOp {
			if time.Now().After(deadline) {
				b.Fatalf("only %d of %d rows done after 2 min", delivered(), rowsPerOp)
			}
			time.Sleep(time.Millisecond)
		}
		elapsed += time.Since(start)
		rows += rowsPerOp

		b.StopTimer()
		cancel()
		if err := <-runDone; err != nil {
			b.Fatal(err)
		}
		var m dto.Metric
		_ = d.m.sweepDur.Write(&m)
		sweeps += m.GetHistogram().GetSampleCount()
		sweepSum += m.GetHistogram().GetSampleSum()
		for _, k := range keys {
			r, err := store.Get(context.Background(), k)
			if err != nil || r.Status != outbox.StatusDone {
				b.Fatalf("row %s: %v %v", k, r.Status, err)
			}
			lat = append(lat, r.FinishedAt.Sub(r.CreatedAt))
		}
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(int(p*float64(len(lat))), len(lat)-1)]) / float64(time.Millisecond)
	}
	b.ReportMetric(float64(rows)/elapsed.Seconds(), "rows/s")
	b.ReportMetric(pct(0.50), "p50_ms")
	b.ReportMetric(pct(0.99), "p99_ms")
	b.ReportMetric(float64(sweeps)/elapsed.Seconds(), "sweeps/s")
	b.ReportMetric(1000*sweepSum/float64(max(sweeps, 1)), "sweep_ms")
	b.ReportMetric(0, "ns/op") // the per-op time is meaningless here; rows/s is the figure
}
