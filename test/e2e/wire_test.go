package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/loadgen"
)

// Fair and gentle at the wire: a slow but healthy target, a noisy
// namespace with a deep backlog and a quiet one, on real processes.

// defaultDeliveryFlags undo baseNodeFlags' short delivery timings, so the
// slow-target scenarios run with the dispatcher's real defaults (as a
// new user would: 20 ms poll, 10 s delivery timeout, 500 ms × 2 backoff
// up to 5 min).
var defaultDeliveryFlags = []string{
	"--poll-interval", "20ms",
	"--delivery-timeout", "10s",
	"--retry-base", "500ms",
	"--retry-cap", "5m",
}

// slowTarget is the scenario's slow but healthy webhook receiver: it
// answers 200 after 2 s.
const slowTarget = 2 * time.Second

// quietExpected is one target latency plus a sweep: about how long a
// quiet row takes from its append to its delivery behind a noisy backlog
// (logged beside the figures, not asserted: a clock on a shared machine).
const quietExpected = slowTarget + 500*time.Millisecond

// noisyQuiet runs the slow-target scenario on c: 3,000 rows of "noisy"
// appended as fast as the cluster takes them, then 20 rows of "quiet" at 2
// rows/s (a quiet namespace: its few rows in flight stay below its fair
// share of the target's slots). It returns the ledgers and when the noisy
// rows were all appended, once the quiet rows are all delivered.
func noisyQuiet(t *testing.T, c *testCluster) (noisy, quiet *ledger, noisyAppended time.Time) {
	t.Helper()
	noisy, quiet = newLedger(), newLedger()
	rep := runLoad(t, c.generator(noisy, loadgen.Config{
		Rows: 3000, BatchSize: 100, Concurrency: 4, KeyPrefix: "noisy-",
		Namespaces: []loadgen.Namespace{{Name: "noisy", Weight: 1, TaskQueues: 4}},
	}))
	noisyAppended = time.Now()
	qrep := runLoad(t, c.generator(quiet, loadgen.Config{
		Rows: 20, Rate: 2, BatchSize: 1, Concurrency: 1, KeyPrefix: "quiet-",
		Namespaces: []loadgen.Namespace{{Name: "quiet", Weight: 1}},
	}))
	if rep.Appended != 3000 || rep.GaveUp != 0 || qrep.Appended != 20 || qrep.GaveUp != 0 {
		t.Fatalf("appended noisy %d/3000 (%d given up), quiet %d/20 (%d given up)", rep.Appended, rep.GaveUp, qrep.Appended, qrep.GaveUp)
	}
	c.waitDelivered(quiet, c.receiver(), 60*time.Second)
	return noisy, quiet, noisyAppended
}

// checkWire asserts the scenario's promises once every row is settled: no
// row reached the target twice (requests counted whatever their outcome,
// cut-off ones included), and the slowest quiet row was delivered sooner
// after its append than the noisy namespace's median row (a ratio within
// the run: queued behind the noisy backlog, FIFO, it would wait longer
// than every noisy row). It logs the figures BENCHMARKS.md records.
func checkWire(t *testing.T, c *testCluster, noisy, quiet *ledger, noisyDrain time.Duration) {
	t.Helper()
	recv := c.receiver()
	all := mergeLedgers(noisy, quiet)
	reqs := recv.Requests()
	var total, repeats int
	var repeated []string
	for k, n := range reqs {
		total += n
		if n > 1 {
			repeats += n - 1
			repeated = append(repeated, fmt.Sprintf("%s×%d", k, n))
		}
	}
	if got, want := recv.Distinct(), all.len(); got != want {
		t.Errorf("target delivered %d distinct rows, want %d", got, want)
	}
	checkNoStrays(t, all, recv)
	ql := recv.Latency("quiet").Summary()
	nl := recv.Latency("noisy").Summary()
	var limits []string
	for _, p := range c.members() {
		limits = append(limits, fmt.Sprintf("%s %.0f", p.name, c.mustMetric(p, "fairshard_target_host_limit", map[string]string{"host": c.target.URL})))
	}
	t.Logf("target received %d requests for %d rows (%.3f per row, %d repeat deliveries); at most %d requests at once (noisy %d, quiet %d); target host limit per node at the end: %s",
		total, all.len(), float64(total)/float64(all.len()), repeats, recv.MaxInFlight(),
		nsMax(recv, "noisy"), nsMax(recv, "quiet"), strings.Join(limits, ", "))
	t.Logf("quiet append→delivery: p50 %.0f ms, p99 %.0f ms, worst %.0f ms (expected about %v); noisy p50 %.0f ms, all delivered %v after its last append",
		ql.P50, ql.P99, ql.Max, quietExpected, nl.P50, noisyDrain.Round(time.Second))
	if repeats != 0 {
		sort.Strings(repeated)
		t.Errorf("%d repeat deliveries: %v", repeats, firstStrings(repeated, 5))
	}
	if ql.Max >= nl.P50 {
		t.Errorf("the slowest quiet row took %.0f ms from append to delivery, not less than the noisy namespace's median %.0f ms: it queued behind the backlog", ql.Max, nl.P50)
	}
	if ql.Count != quiet.len() {
		t.Errorf("%d quiet latencies recorded, want %d", ql.Count, quiet.len())
	}
}

func nsMax(r *loadgen.Receiver, ns string) int {
	for _, rep := range r.Namespaces() {
		if rep.Namespace == ns {
			return rep.MaxInFlight
		}
	}
	return 0
}

func firstStrings(s []string, n int) []string { return s[:min(n, len(s))] }

// TestSlowTargetNoisyQuiet is the slow-target scenario as a new user meets
// it: two nodes, default delivery flags, one target that answers 200 after
// 2 s, 3,000 noisy rows then 20 quiet ones. Before the per-host slot fix
// the target received 9,136 requests for the 3,000 noisy rows (64
// connections per host; claimed rows waited for a connection inside their
// delivery timeout and were cut off mid-flight) and the worst quiet row
// came 11 s after its append. Now: 0 repeat deliveries, and every quiet row
// delivered sooner than the noisy namespace's median row. The noisy backlog
// drains at the target's pace: each node's limit for the host starts at 20
// and doubles per 2 s round trip up to --max-conns-per-host.
func TestSlowTargetNoisyQuiet(t *testing.T) {
	c := newCluster(t, clusterOpts{TargetDelay: slowTarget, Flags: defaultDeliveryFlags, PlainBuild: true}) // a latency bound
	c.startNode("wire-0")
	c.startNode("wire-1")
	c.waitConverged(20 * time.Second)
	noisy, quiet, appended := noisyQuiet(t, c)
	c.waitDelivered(noisy, c.receiver(), 3*time.Minute)
	took := time.Since(appended)
	c.waitSettled(time.Minute, "noisy", "quiet")
	checkWire(t, c, noisy, quiet, took)
}

// TestSlowTargetNoisyQuietEightConns: the same with three nodes and
// --max-conns-per-host 8, where the noisy namespace (per-node ceiling 342)
// holds every slot of the target on every node. Once the quiet rows are
// measured the target turns fast, so the noisy backlog (250 s at 2 s per
// 24 rows) drains in seconds; every request is still counted.
func TestSlowTargetNoisyQuietEightConns(t *testing.T) {
	c := newCluster(t, clusterOpts{TargetDelay: slowTarget, Flags: append([]string{"--max-conns-per-host", "8"}, defaultDeliveryFlags...), PlainBuild: true})
	for i := range 3 {
		c.startNode(fmt.Sprintf("wire8-%d", i))
	}
	c.waitConverged(20 * time.Second)
	noisy, quiet, appended := noisyQuiet(t, c)
	// The noisy namespace was held to the target's slots all along.
	if m := nsMax(c.receiver(), "noisy"); m > 3*8 {
		t.Errorf("target saw %d noisy requests at once, over 3 nodes × 8", m)
	}
	c.receiver().SetDelay(0)
	c.waitDelivered(noisy, c.receiver(), 3*time.Minute)
	took := time.Since(appended)
	c.waitSettled(time.Minute, "noisy", "quiet")
	checkWire(t, c, noisy, quiet, took)
}

// TestTargetThrottlingCutsConcurrency: a target that starts answering 429
// gets its concurrency cut, as each node's exported limit shows, and gets
// it back once it answers 200 again; no row is lost or dead-lettered.
func TestTargetThrottlingCutsConcurrency(t *testing.T) {
	const maxConns = 16
	c := newCluster(t, clusterOpts{TargetDelay: 100 * time.Millisecond,
		Flags: []string{"--max-conns-per-host", fmt.Sprint(maxConns), "--max-attempts", "1000"}})
	c.startNode("throttle-0")
	c.startNode("throttle-1")
	c.waitConverged(20 * time.Second)
	bulk := newLedger()
	rep := runLoad(t, c.generator(bulk, loadgen.Config{
		Rows: 8000, BatchSize: 200, Concurrency: 4, KeyPrefix: "bulk-",
		Namespaces: []loadgen.Namespace{{Name: "bulk", Weight: 1, TaskQueues: 4}},
	}))
	if rep.Appended != 8000 || rep.GaveUp != 0 {
		t.Fatalf("appended %d/8000 (%d given up)", rep.Appended, rep.GaveUp)
	}
	host := map[string]string{"host": c.target.URL}
	limits := func() ([]float64, string) {
		var out []float64
		var s []string
		for _, p := range c.members() {
			v := c.mustMetric(p, "fairshard_target_host_limit", host)
			out = append(out, v)
			s = append(s, fmt.Sprintf("%s %.0f", p.name, v))
		}
		return out, strings.Join(s, ", ")
	}
	every := func(pred func(float64) bool) func() (bool, string) {
		return func() (bool, string) {
			ls, s := limits()
			for _, l := range ls {
				if !pred(l) {
					return false, "limits " + s
				}
			}
			return true, ""
		}
	}
	start := time.Now()
	poll.Eventually(t, deadline(30*time.Second), "every node's limit to reach --max-conns-per-host", every(func(l float64) bool { return l == maxConns }))
	grown := time.Since(start)

	c.receiver().SetStatus(429)
	start = time.Now()
	poll.Eventually(t, deadline(30*time.Second), "every node's limit to be cut under 429s", every(func(l float64) bool { return l <= 2 }))
	cut := time.Since(start)
	for _, p := range c.members() {
		if n := c.mustMetric(p, "fairshard_target_host_limit_cuts_total", map[string]string{"host": c.target.URL, "reason": "status_429"}); n < 3 {
			t.Errorf("%s: %v cuts for 429, want ≥ 3 (16 → ≤ 2)", p.name, n)
		}
	}

	c.receiver().SetStatus(0)
	start = time.Now()
	poll.Eventually(t, deadline(60*time.Second), "every node's limit to recover", every(func(l float64) bool { return l == maxConns }))
	recovered := time.Since(start)
	t.Logf("limit grew to %d in %v; cut to ≤ 2 within %v of the first 429s; back to %d within %v of the 429s stopping",
		maxConns, grown.Round(10*time.Millisecond), cut.Round(10*time.Millisecond), maxConns, recovered.Round(10*time.Millisecond))

	c.receiver().SetDelay(0)
	c.waitDelivered(bulk, c.receiver(), 2*time.Minute)
	c.waitSettled(time.Minute, "bulk")
	if m := c.receiver().MaxInFlight(); m > 2*maxConns {
		t.Errorf("target saw %d requests at once, over 2 nodes × %d", m, maxConns)
	}
}

// TestRetryAfterNeverShortensTheBackoff is the Retry-After scenario
// on a real process with the default retry policy (500 ms × 2, ±20 %
// jitter): a target answering 503 with "Retry-After: 0", or with an HTTP
// date an hour in the past (its clock behind ours), was retried at once
// (10 attempts in under 200 ms, then dead letter). Now every retry waits
// at least our backoff, and the rows stay pending.
func TestRetryAfterNeverShortensTheBackoff(t *testing.T) {
	values := map[string]func() string{
		"ra-zero": func() string { return "0" },
		"ra-past": func() string { return time.Now().Add(-time.Hour).UTC().Format(http.TimeFormat) },
	}
	var mu sync.Mutex
	attempts := map[string][]time.Time{}
	tg := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		attempts[key] = append(attempts[key], time.Now())
		mu.Unlock()
		if v, ok := values[key]; ok {
			w.Header().Set("Retry-After", v())
		}
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	t.Cleanup(tg.Close)

	c := newCluster(t, clusterOpts{Flags: defaultDeliveryFlags})
	p := c.startNode("retryafter-0")
	c.waitConverged(20 * time.Second)
	code, body, err := c.do(http.MethodPut, p.baseURL()+"/v1/namespaces/ra/task-queues/default/target", map[string]any{"url": tg.URL + "/hook"}, nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("PUT target: HTTP %d %s: %v", code, body, err)
	}
	var rows []map[string]any
	for key := range values {
		rows = append(rows, map[string]any{"dispatch_key": key, "namespace": "ra", "payload": map[string]string{"k": key}})
	}
	if code, body, err := c.do(http.MethodPost, p.baseURL()+"/v1/rows", map[string]any{"rows": rows}, nil); err != nil || code != http.StatusOK {
		t.Fatalf("POST /v1/rows: HTTP %d %s: %v", code, body, err)
	}
	const want = 4 // attempts 1-4: waits of 0.5, 1 and 2 s (±20 %)
	poll.Eventually(t, deadline(30*time.Second), "four attempts of each row", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		for key := range values {
			if len(attempts[key]) < want {
				return false, fmt.Sprintf("%s: %d attempts", key, len(attempts[key]))
			}
		}
		return true, ""
	})
	mu.Lock()
	defer mu.Unlock()
	for key := range values {
		at := attempts[key]
		var gaps []string
		for i := 1; i < want; i++ {
			gap := at[i].Sub(at[i-1])
			gaps = append(gaps, gap.Round(time.Millisecond).String())
			// Attempt i waited the backoff of attempt i: 500 ms × 2^(i-1), -20 % jitter at most.
			if floor := time.Duration(float64(500*time.Millisecond) * float64(int(1)<<(i-1)) * 0.8); gap < floor {
				t.Errorf("%s: attempt %d came %v after attempt %d, want ≥ %v (our backoff; the Retry-After may only lengthen it)", key, i+1, gap, i, floor)
			}
		}
		t.Logf("%s: gaps between the first %d attempts %v", key, want, gaps)
	}
	for key := range values {
		var v struct {
			Status  string `json:"status"`
			Attempt int    `json:"attempt"`
		}
		if code, body, err := c.do(http.MethodGet, p.baseURL()+"/v1/rows/"+key, nil, &v); err != nil || code != http.StatusOK {
			t.Fatalf("GET /v1/rows/%s: HTTP %d %s: %v", key, code, body, err)
		}
		if v.Status != "pending" && v.Status != "claimed" {
			t.Errorf("%s is %s after %d attempts, want pending (10 attempts before dead letter)", key, v.Status, v.Attempt)
		}
	}
}

// logHostLimits logs each node's limit for the test target's host and its
// cuts by reason (diagnostics: a cut limit slows every namespace).
func logHostLimits(t *testing.T, c *testCluster) {
	t.Helper()
	host := map[string]string{"host": c.target.URL}
	var parts []string
	for _, p := range c.members() {
		cuts := []string{}
		for _, reason := range []string{"timeout", "connection", "status_429", "status_503", "latency"} {
			if n := c.mustMetric(p, "fairshard_target_host_limit_cuts_total", map[string]string{"host": c.target.URL, "reason": reason}); n > 0 {
				cuts = append(cuts, fmt.Sprintf("%s %.0f", reason, n))
			}
		}
		parts = append(parts, fmt.Sprintf("%s limit %.0f (cuts: %s)", p.name, c.mustMetric(p, "fairshard_target_host_limit", host), strings.Join(cuts, ", ")))
	}
	t.Logf("target host limits: %s", strings.Join(parts, "; "))
}
