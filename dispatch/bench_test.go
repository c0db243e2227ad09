package dispatch

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/fairshard/fairshard/outbox"
)

// benchMode is one way of feeding the dispatcher.
type benchMode struct {
	name      string
	rows      int  // rows per op
	producers int  // concurrent appenders (batches of 100 rows, Wake after each)
	rate      int  // offered rows/s over all producers; 0 = as fast as the store accepts
	backlog   bool // append every row before Run starts: the dispatcher's drain rate
	batchSize int  // Config.BatchSize; 0 = default (256)
}

var benchModes = []benchMode{
	{name: "saturate", rows: 20_000, producers: 8},
	{name: "backlog", rows: 20_000, backlog: true},
	{name: "backlog-batch1024", rows: 20_000, backlog: true, batchSize: 1024},
	{name: "paced-2000rps", rows: 4_000, producers: 1, rate: 2000},
}

// BenchmarkEndToEnd measures rows/s from append to done on one node:
// rows (2 namespaces × 4 task queues) are appended, the dispatcher
// (default Config unless the mode says otherwise) claims them, POSTs each
// to a local no-op httptest target and settles it. One op is mode.rows rows
// on a fresh store. Modes: saturate (8 producers appending as fast as the
// store accepts), backlog (every row appended before Run: the dispatcher's
// drain rate alone), paced (a steady offered rate: latency at moderate
// load). Reported: rows/s (rows / time from the first append, or from Run
// for a backlog, to the last settle), append→done latency percentiles
// (FinishedAt − CreatedAt of every row, ms; for a backlog they mostly
// measure the queue), sweeps/s and the mean sweep duration.
//
//	go test -run '^$' -bench EndToEnd -benchtime 3x ./dispatch/
func BenchmarkEndToEnd(b *testing.B) {
	for _, st := range storeKinds {
		for _, m := range benchModes {
			if testing.Short() {
				// make test runs every benchmark once with -short, for its
				// checks (every row done, once): a tenth of the rows.
				m.rows /= 10
			}
			b.Run(st.name+"/"+m.name, func(b *testing.B) { benchEndToEnd(b, st, m) })
		}
	}
}

func benchEndToEnd(b *testing.B, st storeKind, mode benchMode) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	srvHost := srv.URL // http://127.0.0.1:port is already a host key
	const batch = 100
	namespaces := []string{"alpha", "beta"}

	var (
		lat      []time.Duration
		rows     int
		elapsed  time.Duration
		sweeps   uint64
		sweepSum float64
		limits   float64 // the target host's limit at the end of each op, summed
		cuts     float64 // the host's limit cuts, all reasons, summed
		delN     uint64  // delivery attempts, and their summed duration (s)
		delSum   float64
	)
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		store, _ := st.open(b)
		cfg := Config{Store: store, Targets: static(srv.URL), Registerer: prometheus.NewRegistry(), Tunables: Tunables{BatchSize: mode.batchSize}}
		cfg.fillDefaults()
		cfg.Hosts = testHosts(b, cfg)
		claims := newLateClaims(cfg.Store)
		cfg.Planner = testPlanner(cfg.Hosts, claims)
		d, err := New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		claims.bind(d)
		// Keys are split among producers; each producer appends its share.
		keys := make([]string, mode.rows)
		for j := range keys {
			keys[j] = fmt.Sprintf("op%d-%06d", i, j)
		}
		appendRange := func(ctx context.Context, from, to int) error {
			now := time.Now()
			rs := make([]outbox.Row, 0, to-from)
			for j := from; j < to; j++ {
				rs = append(rs, mkRow(keys[j], namespaces[j%2], fmt.Sprintf("tq-%d", (j/2)%4), now))
			}
			_, err := store.Append(ctx, rs)
			d.Wake()
			return err
		}
		ctx, cancel := context.WithCancel(context.Background())
		if mode.backlog {
			for off := 0; off < mode.rows; off += 1000 {
				if err := appendRange(ctx, off, min(off+1000, mode.rows)); err != nil {
					b.Fatal(err)
				}
			}
		}
		delivered := func() int {
			n := 0
			for _, ns := range namespaces {
				n += int(testutil.ToFloat64(d.m.delivered.WithLabelValues(ns)))
			}
			return n
		}
		b.StartTimer()

		start := time.Now()
		runDone := make(chan error, 1)
		go func() { runDone <- d.Run(ctx) }()
		var producers sync.WaitGroup
		errs := make(chan error, max(mode.producers, 1))
		for p := range mode.producers {
			producers.Go(func() {
				var pace *time.Ticker
				if mode.rate > 0 {
					pace = time.NewTicker(time.Duration(float64(time.Second) * batch * float64(mode.producers) / float64(mode.rate)))
					defer pace.Stop()
				}
				for off := p * batch; off < mode.rows; off += batch * mode.producers {
					if pace != nil {
						<-pace.C
					}
					if err := appendRange(ctx, off, min(off+batch, mode.rows)); err != nil {
						errs <- err
						return
					}
				}
			})
		}
		producers.Wait()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		deadline := time.Now().Add(2 * time.Minute)
		for delivered() < mode.rows {
			if time.Now().After(deadline) {
				b.Fatalf("only %d of %d rows done after 2 min", delivered(), mode.rows)
			}
			time.Sleep(time.Millisecond)
		}
		elapsed += time.Since(start)
		rows += mode.rows

		b.StopTimer()
		cancel()
		if err := <-runDone; err != nil {
			b.Fatal(err)
		}
		var m dto.Metric
		_ = d.m.sweepDur.Write(&m)
		sweeps += m.GetHistogram().GetSampleCount()
		sweepSum += m.GetHistogram().GetSampleSum()
		for _, ns := range namespaces {
			var dm dto.Metric
			_ = d.m.deliveryDur.WithLabelValues(ns).(prometheus.Histogram).Write(&dm)
			delN += dm.GetHistogram().GetSampleCount()
			delSum += dm.GetHistogram().GetSampleSum()
		}
		for _, h := range d.Hosts().Hosts() {
			limits += float64(h.Limit)
		}
		for _, reason := range []string{cutTimeout, cutConnection, cut429, cut503, cutLatency} {
			cuts += testutil.ToFloat64(d.hosts.m.cuts.WithLabelValues(srvHost, reason))
		}
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
	b.ReportMetric(float64(rows)/elapsed.Seconds(), "rows/s")
	b.ReportMetric(pctMS(lat, 0.50), "p50_ms")
	b.ReportMetric(pctMS(lat, 0.99), "p99_ms")
	b.ReportMetric(float64(sweeps)/elapsed.Seconds(), "sweeps/s")
	b.ReportMetric(1000*sweepSum/float64(max(sweeps, 1)), "sweep_ms")
	b.ReportMetric(limits/float64(b.N), "host_limit")
	b.ReportMetric(1000*delSum/float64(max(delN, 1)), "delivery_ms")
	b.ReportMetric(cuts/float64(b.N), "limit_cuts")
	b.ReportMetric(0, "ns/op") // the per-op time is meaningless here; rows/s is the figure
}
