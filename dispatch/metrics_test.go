package dispatch

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fairshard/fairshard/outbox"
)

// TestMetrics drives a known sequence (2 rows delivered in "a"; in "b" one
// dead letter and one retry) and compares the counters and gauges, the
// target host's limit included (the 503 halves it), then lints every
// series the dispatcher exports.
func TestMetrics(t *testing.T) {
	tg := newTarget(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get(HeaderDispatchKey) {
		case "b-404":
			w.WriteHeader(404)
		case "b-503":
			w.WriteHeader(503)
		}
	})
	clock := newFakeClock(t0)
	cfg := testConfig(TargetsFunc(func(r outbox.ClaimScope) (Target, bool) {
		return Target{URL: tg.URL()}, r.TaskQueue != "none"
	}))
	cfg.Now = clock.Now
	d, b := setup(t, cfg)
	defer drain(t, d)
	b.quotas.Store("b", uint32(2))
	mustAppend(t, b.store,
		mkRow("a-1", "a", "q", t0), mkRow("a-2", "a", "q", t0),
		mkRow("b-404", "b", "q", t0), mkRow("b-503", "b", "q", t0),
		mkRow("c-wait", "c", "none", t0))
	clock.Advance(1500 * time.Millisecond) // enqueue→delivery of 1.5 s
	sweep(t, d)

	want := `
# HELP fairshard_rows_claimed_total Rows this node claimed for delivery, by namespace.
# TYPE fairshard_rows_claimed_total counter
fairshard_rows_claimed_total{namespace="a"} 2
fairshard_rows_claimed_total{namespace="b"} 2
# HELP fairshard_rows_delivered_total Rows delivered (target answered 2xx) and settled done, by namespace.
# TYPE fairshard_rows_delivered_total counter
fairshard_rows_delivered_total{namespace="a"} 2
# HELP fairshard_rows_failed_total Rows failed for good (dead letters: permanent error or attempts exhausted), by namespace.
# TYPE fairshard_rows_failed_total counter
fairshard_rows_failed_total{namespace="b"} 1
# HELP fairshard_rows_retried_total Delivery attempts that failed retryably and were put back to pending with backoff, by namespace.
# TYPE fairshard_rows_retried_total counter
fairshard_rows_retried_total{namespace="b"} 1
# HELP fairshard_namespace_ceiling This node's per-node ceiling of the namespace: ceil(quota × owned/total) rows.
# TYPE fairshard_namespace_ceiling gauge
fairshard_namespace_ceiling{namespace="a"} 1024
fairshard_namespace_ceiling{namespace="b"} 2
# HELP fairshard_claimed_rows Rows of the namespace claimed on this node, as of the last sweep (CLAIMED only, never pending).
# TYPE fairshard_claimed_rows gauge
fairshard_claimed_rows{namespace="a"} 2
fairshard_claimed_rows{namespace="b"} 2
# HELP fairshard_namespace_headroom Per-node ceiling minus claimed rows of the namespace after the last sweep (rows, ≥ 0).
# TYPE fairshard_namespace_headroom gauge
fairshard_namespace_headroom{namespace="a"} 1022
fairshard_namespace_headroom{namespace="b"} 0
# HELP fairshard_sweeps_at_ceiling_total Sweeps that ended with the namespace at its per-node ceiling (no headroom left).
# TYPE fairshard_sweeps_at_ceiling_total counter
fairshard_sweeps_at_ceiling_total{namespace="b"} 1
# HELP fairshard_routes_without_target Routes with visible pending rows but no delivery target configured, as of the last sweep; their rows wait.
# TYPE fairshard_routes_without_target gauge
fairshard_routes_without_target 1
# HELP fairshard_deliveries_in_flight Rows this process is delivering right now.
# TYPE fairshard_deliveries_in_flight gauge
fairshard_deliveries_in_flight 0
# HELP fairshard_target_host_limit Current adaptive concurrency limit of a target host on this node (rows in flight, 1 … --max-conns-per-host).
# TYPE fairshard_target_host_limit gauge
fairshard_target_host_limit{host="HOST"} 10
# HELP fairshard_target_host_in_flight Rows this node is delivering to a target host right now.
# TYPE fairshard_target_host_in_flight gauge
fairshard_target_host_in_flight{host="HOST"} 0
# HELP fairshard_target_host_limit_cuts_total Times a target host's concurrency limit was halved, by reason (timeout, connection, status_429, status_503, latency).
# TYPE fairshard_target_host_limit_cuts_total counter
fairshard_target_host_limit_cuts_total{host="HOST",reason="status_503"} 1
`
	want = strings.ReplaceAll(want, "HOST", tg.URL())
	names := []string{
		"fairshard_rows_claimed_total", "fairshard_rows_delivered_total", "fairshard_rows_failed_total",
		"fairshard_rows_retried_total", "fairshard_namespace_ceiling", "fairshard_claimed_rows",
		"fairshard_namespace_headroom", "fairshard_sweeps_at_ceiling_total", "fairshard_routes_without_target",
		"fairshard_deliveries_in_flight", "fairshard_target_host_limit", "fairshard_target_host_in_flight",
		"fairshard_target_host_limit_cuts_total",
	}
	if err := testutil.GatherAndCompare(b.reg, strings.NewReader(want), names...); err != nil {
		t.Fatal(err)
	}

	// The next sweep sees no visible pending rows of "a" or "b" (the retry
	// is backing off): their claimed gauges fall back to this process's
	// own deliveries, now 0, and headroom is the whole ceiling.
	sweep(t, d)
	if v := testutil.ToFloat64(d.m.claimedNow.WithLabelValues("b")); v != 0 {
		t.Errorf("fairshard_claimed_rows{b} after settling = %v, want 0", v)
	}
	if v := testutil.ToFloat64(d.m.headroom.WithLabelValues("b")); v != 2 {
		t.Errorf("fairshard_namespace_headroom{b} after settling = %v, want 2", v)
	}
	if n := testutil.CollectAndCount(d.m.enqueueToDel); n != 1 {
		t.Errorf("enqueue-to-delivery histogram has %d series, want 1 (namespace a)", n)
	}
	if n := testutil.CollectAndCount(d.m.deliveryDur); n != 2 {
		t.Errorf("delivery duration histogram has %d series, want 2 (a, b)", n)
	}

	problems, err := testutil.GatherAndLint(b.reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric lint: %s: %s", p.Metric, p.Text)
	}
	// Every family the dispatcher exports is there and carries no label
	// but namespace, except the per-host ones: host (and reason).
	mfs, err := b.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "fairshard_") {
			t.Errorf("metric %s lacks the fairshard_ prefix", mf.GetName())
		}
		for _, m := range mf.GetMetric() {
			allowed := map[string]bool{"namespace": true}
			if strings.HasPrefix(mf.GetName(), "fairshard_target_host_") {
				allowed = map[string]bool{"host": true, "reason": true}
			}
			for _, l := range m.GetLabel() {
				if !allowed[l.GetName()] {
					t.Errorf("metric %s has label %s; only %v allowed", mf.GetName(), l.GetName(), allowed)
				}
			}
		}
	}
}
