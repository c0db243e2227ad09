package dispatch

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/outbox"
)

// TestQuotaCapsConcurrencyAtTarget: a namespace with quota 3 whose target
// holds each request 200 ms never has more than 3 concurrent requests at
// the target (measured there), and its backlog of 30 rows drains.
func TestQuotaCapsConcurrencyAtTarget(t *testing.T) {
	skipInLaterStorePass(t)
	for _, st := range storeKinds {
		t.Run(st.name, func(t *testing.T) { testQuotaCaps(t, st) })
	}
}

func testQuotaCaps(t *testing.T, st storeKind) {
	tg := newTarget(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(200 * time.Millisecond):
		case <-r.Context().Done():
		}
	})
	cfg := testConfig(static(tg.URL()))
	cfg.Store, _ = st.open(t)
	d, b := setup(t, cfg)
	b.quotas.Store("slow", uint32(3))
	now := time.Now()
	var rows []outbox.Row
	for i := range 30 {
		rows = append(rows, mkRow(fmt.Sprintf("s-%02d", i), "slow", fmt.Sprintf("q%d", i%3), now))
	}
	mustAppend(t, b.store, rows...)
	run(t, d)
	d.Wake()

	poll.Eventually(t, 20*time.Second, fmt.Sprintf("30 rows of a quota-3 namespace done (target saw %d requests)", tg.total()), func() (bool, string) {
		for _, r := range rows {
			if !statusIs(b.store, r.DispatchKey, outbox.StatusDone) {
				return false, ""
			}
		}
		return true, ""
	})
	if p := tg.peak.Load(); p != 3 {
		t.Fatalf("peak concurrent requests at the target = %d, want exactly the quota 3", p)
	}
	if n := tg.total(); n != 30 {
		t.Fatalf("target received %d requests, want 30 (each row once)", n)
	}
	if v := testutil.ToFloat64(d.m.atCeiling.WithLabelValues("slow")); v < 1 {
		t.Fatalf("fairshard_sweeps_at_ceiling_total{slow} = %v, want ≥ 1", v)
	}
	if v := testutil.ToFloat64(d.m.ceiling.WithLabelValues("slow")); v != 3 {
		t.Fatalf("fairshard_namespace_ceiling{slow} = %v, want 3", v)
	}
}

// TestBurstyNamespaceDoesNotDelayQuiet: while a bursty namespace's 10,000
// rows over 8 task queues drain, each row of a quiet namespace is claimed
// at the latest by the first sweep that starts after its append returned
// (the seed's "quiet tenant gets a slot every sweep"), and so reaches its
// target within a couple of sweeps. The assertion counts sweeps; the wall-clock figure is
// reported and bounded by 20 poll intervals plus a delivery (widened under
// -race), because a sweep's duration is the store's: memstore scans every
// row, about 25 ms per sweep with 10,000 rows, 85-150 ms under -race on the
// shared 2-core machine.
func TestBurstyNamespaceDoesNotDelayQuiet(t *testing.T) {
	skipInLaterStorePass(t)
	for _, st := range storeKinds {
		t.Run(st.name, func(t *testing.T) { testBurstyQuiet(t, st) })
	}
}

func testBurstyQuiet(t *testing.T, st storeKind) {
	if testing.Short() {
		t.Skip("10,000-row burst")
	}
	bursty := newTarget(t, nil)
	quiet := newTarget(t, nil)
	targets := TargetsFunc(func(r outbox.ClaimScope) (Target, bool) {
		if r.Namespace == "quiet" {
			return Target{URL: quiet.URL()}, true
		}
		return Target{URL: bursty.URL()}, true
	})
	cfg := testConfig(targets)
	cfg.Store, _ = st.open(t)
	cfg.Registerer = prometheus.NewPedanticRegistry()
	cfg.Hosts = testHosts(t, cfg)
	claims := newLateClaims(cfg.Store)
	cp := &countingPlanner{Planner: testPlanner(cfg.Hosts, claims), claims: claims, claimed: map[string]int64{}}
	cfg.Planner = cp
	d, b := setup(t, cfg)
	stop := run(t, d)

	const burst = 10_000
	now := time.Now()
	for chunk := 0; chunk < burst; chunk += 1000 {
		rows := make([]outbox.Row, 0, 1000)
		for i := chunk; i < chunk+1000; i++ {
			rows = append(rows, mkRow(fmt.Sprintf("b-%05d", i), "bursty", fmt.Sprintf("tq-%d", i%8), now))
		}
		mustAppend(t, b.store, rows...)
		d.Wake()
	}
	poll.Eventually(t, 20*time.Second, "bursty namespace flowing", func() (bool, string) { return bursty.total() >= 500, "" })

	const quietRows = 8
	var lat, appendTook []time.Duration
	var waited, untilReceipt []int64
	for i := range quietRows {
		key := fmt.Sprintf("quiet-%d", i)
		appendStart := time.Now()
		mustAppend(t, b.store, mkRow(key, "quiet", "q", appendStart))
		appended := time.Now() // the row is stored: from here on it is the dispatcher's
		startedBy := cp.started.Load()
		d.Wake()
		poll.Eventually(t, 20*time.Second, fmt.Sprintf("quiet row %s delivered", key), func() (bool, string) { return quiet.count(key) == 1, "" })
		untilReceipt = append(untilReceipt, cp.started.Load()-startedBy)
		reqs := quiet.requests()
		lat = append(lat, reqs[len(reqs)-1].at.Sub(appended))
		appendTook = append(appendTook, appended.Sub(appendStart))
		in, _ := cp.claimedIn(key)
		waited = append(waited, in-startedBy)
	}
	burstDone := bursty.total()
	sweeps, longest := cp.started.Load(), cp.longestSweep()
	stop()

	slices.Sort(lat)
	slices.Sort(appendTook)
	p50, worst := lat[len(lat)/2], lat[len(lat)-1]
	t.Logf("quiet rows behind a %d-row burst: claimed by sweep +%v and received before sweep +%v (counted from the last sweep "+
		"started when the append returned); stored→receipt p50 %v, max %v; Append took up to %v; longest sweep %v; "+
		"bursty delivered %d meanwhile; %d sweeps in all",
		burst, waited, untilReceipt, p50, worst, appendTook[len(appendTook)-1], longest, burstDone, sweeps)
	for i := range waited {
		// ≤ 0: claimed by the sweep in progress when the append returned;
		// 1: by the next one, the first to start after the row was stored.
		if waited[i] > 1 {
			t.Errorf("quiet row %d was claimed %d sweeps after the first sweep that could see it, want that sweep", i, waited[i])
		}
	}
	// From claim to receipt the row is one goroutine's HTTP request; it
	// waits for no connection and no other namespace's delivery (asserted
	// by TestNoClaimedRowWaitsForAConnection and
	// TestQuietRowGoesOutWhileAHostIsFull). Counted in sweeps it measured
	// the Go scheduler: on 2 loaded cores under -race, 5 sweeps of ~80 ms
	// started while one claimed row waited for a CPU (CI, 2026-12-01, row
	// received 430 ms after it was stored). So it is logged above, and the
	// bound is the wall clock's: 20 poll intervals plus the sweeps a row
	// may wait through (the rest of the running one and the next: their
	// duration is the store's, and the machine's load) plus a delivery.
	if bound := 20*cfg.PollInterval + 3*longest + 100*time.Millisecond; worst > bound {
		t.Errorf("quiet row took %v (> %v) to be delivered behind a bursty namespace", worst, bound)
	}
	if burstDone >= burst {
		t.Fatalf("the burst finished (%d rows) before the quiet rows were measured: nothing was proven", burstDone)
	}
}

// TestHeldWorkflowWaitsThenFlows: rows of a held workflow stay pending,
// untouched, while other rows of the same route flow; released, they flow.
func TestHeldWorkflowWaitsThenFlows(t *testing.T) {
	tg := newTarget(t, nil)
	var held atomic.Pointer[map[string]struct{}]
	h := map[string]struct{}{"wf-held": {}}
	held.Store(&h)
	cfg := testConfig(static(tg.URL()))
	cfg.Held = func() map[string]struct{} { return *held.Load() }
	d, b := setup(t, cfg)
	now := time.Now()
	var heldKeys, freeKeys []string
	for i := range 3 {
		r := mkRow(fmt.Sprintf("h%d", i), "ns", "q", now)
		r.WorkflowID = "wf-held"
		heldKeys = append(heldKeys, r.DispatchKey)
		f := mkRow(fmt.Sprintf("f%d", i), "ns", "q", now)
		freeKeys = append(freeKeys, f.DispatchKey)
		mustAppend(t, b.store, r, f)
	}
	run(t, d)
	d.Wake()
	poll.Eventually(t, 5*time.Second, "unheld rows done", func() (bool, string) {
		for _, k := range freeKeys {
			if !statusIs(b.store, k, outbox.StatusDone) {
				return false, ""
			}
		}
		return true, ""
	})
	// Several more sweeps pass; the held rows must still be untouched.
	sweepsBefore := sweepCount(d)
	poll.Eventually(t, 5*time.Second, "5 more sweeps", func() (bool, string) { return sweepCount(d) >= sweepsBefore+5, "" })
	for _, k := range heldKeys {
		r := wantStatus(t, b.store, k, outbox.StatusPending)
		if r.Attempt != 1 || tg.count(k) != 0 {
			t.Fatalf("held row %s: attempt %d, delivered %d times; want untouched", k, r.Attempt, tg.count(k))
		}
	}
	none := map[string]struct{}{}
	held.Store(&none)
	d.Wake()
	poll.Eventually(t, 5*time.Second, "released rows done", func() (bool, string) {
		for _, k := range heldKeys {
			if !statusIs(b.store, k, outbox.StatusDone) {
				return false, ""
			}
		}
		return true, ""
	})
}

// sweepCount is how many sweeps have run (the sweep duration histogram's
// sample count).
func sweepCount(d *Dispatcher) uint64 {
	var m dto.Metric
	if err := d.m.sweepDur.Write(&m); err != nil {
		panic(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// TestRouteWithoutTargetWaits: a route with no target keeps its rows
// pending with attempt unchanged, is reported (gauge and
// RoutesWithoutTarget), while other routes flow; given a target, it flows.
func TestRouteWithoutTargetWaits(t *testing.T) {
	tg := newTarget(t, nil)
	var configured sync.Map // route → URL
	configured.Store(outbox.ClaimScope{Namespace: "ns", TaskQueue: "ok"}, tg.URL())
	targets := TargetsFunc(func(r outbox.ClaimScope) (Target, bool) {
		u, ok := configured.Load(r)
		if !ok {
			return Target{}, false
		}
		return Target{URL: u.(string)}, true
	})
	d, b := setup(t, testConfig(targets))
	defer drain(t, d)
	now := time.Now()
	mustAppend(t, b.store, mkRow("ok-1", "ns", "ok", now), mkRow("ok-2", "ns", "ok", now),
		mkRow("nt-1", "ns", "none", now), mkRow("nt-2", "other", "none", now))
	for range 3 {
		sweep(t, d)
	}
	wantStatus(t, b.store, "ok-1", outbox.StatusDone)
	wantStatus(t, b.store, "ok-2", outbox.StatusDone)
	for _, k := range []string{"nt-1", "nt-2"} {
		if r := wantStatus(t, b.store, k, outbox.StatusPending); r.Attempt != 1 || r.LastError != "" {
			t.Fatalf("row %s without target: attempt %d last_error %q; want untouched", k, r.Attempt, r.LastError)
		}
	}
	wantWaiting := []outbox.ClaimScope{{Namespace: "ns", TaskQueue: "none"}, {Namespace: "other", TaskQueue: "none"}}
	if got := d.RoutesWithoutTarget(); !slices.Equal(got, wantWaiting) {
		t.Fatalf("RoutesWithoutTarget = %v, want %v", got, wantWaiting)
	}
	if v := testutil.ToFloat64(d.m.routesNoTarget); v != 2 {
		t.Fatalf("fairshard_routes_without_target = %v, want 2", v)
	}
	if d.Eligible(outbox.ClaimScope{Namespace: "ns", TaskQueue: "none"}) || !d.Eligible(outbox.ClaimScope{Namespace: "ns", TaskQueue: "ok"}) {
		t.Fatal("Eligible disagrees with the configured targets")
	}

	configured.Store(outbox.ClaimScope{Namespace: "ns", TaskQueue: "none"}, tg.URL())
	sweep(t, d)
	wantStatus(t, b.store, "nt-1", outbox.StatusDone)
	wantStatus(t, b.store, "nt-2", outbox.StatusPending)
	if got := d.RoutesWithoutTarget(); len(got) != 1 {
		t.Fatalf("RoutesWithoutTarget after configuring one = %v", got)
	}
}

// TestTargetRemovedAfterClaim: a route that loses its target between the
// sweep and the delivery puts the row back to pending, attempt unchanged.
func TestTargetRemovedAfterClaim(t *testing.T) {
	tg := newTarget(t, nil)
	var calls atomic.Int64
	targets := TargetsFunc(func(outbox.ClaimScope) (Target, bool) {
		// The sweep's filter asks first; the delivery asks second.
		return Target{URL: tg.URL()}, calls.Add(1) == 1
	})
	d, b := setup(t, testConfig(targets))
	defer drain(t, d)
	mustAppend(t, b.store, mkRow("k", "ns", "q", time.Now()))
	sw := sweep(t, d)
	if len(sw.Rows) != 1 {
		t.Fatalf("sweep claimed %d rows, want 1", len(sw.Rows))
	}
	if r := wantStatus(t, b.store, "k", outbox.StatusPending); r.Attempt != 1 {
		t.Fatalf("attempt %d after a lost target, want 1", r.Attempt)
	}
	if tg.total() != 0 {
		t.Fatal("a row without target was sent")
	}
}

// TestPausedNamespaceWaits: a paused namespace's rows stay pending while
// others flow, and are not reported as lacking a target.
func TestPausedNamespaceWaits(t *testing.T) {
	tg := newTarget(t, nil)
	var paused atomic.Bool
	paused.Store(true)
	cfg := testConfig(static(tg.URL()))
	cfg.Paused = func(ns string) bool { return ns == "p" && paused.Load() }
	d, b := setup(t, cfg)
	defer drain(t, d)
	now := time.Now()
	mustAppend(t, b.store, mkRow("p1", "p", "q", now), mkRow("a1", "a", "q", now))
	sweep(t, d)
	wantStatus(t, b.store, "a1", outbox.StatusDone)
	wantStatus(t, b.store, "p1", outbox.StatusPending)
	if len(d.RoutesWithoutTarget()) != 0 || d.Eligible(outbox.ClaimScope{Namespace: "p", TaskQueue: "q"}) {
		t.Fatal("paused route misreported")
	}
	paused.Store(false)
	sweep(t, d)
	wantStatus(t, b.store, "p1", outbox.StatusDone)
}

// TestStoreErrorsDoNotKillLoop: failing route listings, claims, settles
// and re-arms are logged and retried; every row still ends up done, and a
// failed settle is tried again rather than left to the visibility
// timeout: no row is delivered twice.
func TestStoreErrorsDoNotKillLoop(t *testing.T) {
	tg := newTarget(t, nil)
	fs := newFaultStore(newStore(t))
	cfg := testConfig(static(tg.URL()))
	cfg.Store = fs
	cfg.DeliveryTimeout = 200 * time.Millisecond
	cfg.VisibilityTimeout = time.Minute // a failed Complete must not wait for the re-arm
	d, b := setup(t, cfg)
	fs.failNext("PendingRoutes", 3)
	fs.failNext("Claim", 2)
	fs.failNext("Complete", 2)
	fs.failNext("RearmStale", 2)
	var keys []string
	now := time.Now()
	for i := range 10 {
		k := fmt.Sprintf("k%d", i)
		keys = append(keys, k)
		mustAppend(t, b.store, mkRow(k, "ns", fmt.Sprintf("q%d", i%2), now))
	}
	run(t, d)
	poll.Eventually(t, 15*time.Second, "all rows done despite store faults", func() (bool, string) {
		for _, k := range keys {
			if !statusIs(b.store, k, outbox.StatusDone) {
				return false, ""
			}
		}
		return true, ""
	})
	for _, m := range []string{"PendingRoutes", "Claim", "Complete", "RearmStale"} {
		if n := fs.injected(m); n != map[string]int{"PendingRoutes": 3, "Claim": 2, "Complete": 2, "RearmStale": 2}[m] {
			t.Errorf("%s faults injected %d times, want all of them", m, n)
		}
	}
	if v := testutil.ToFloat64(d.m.sweepErrors); v < 4 {
		t.Errorf("fairshard_sweep_errors_total = %v, want ≥ 4 (3 listings, some claims, re-arms)", v)
	}
	if v := testutil.ToFloat64(d.m.settleErrors); v != 2 {
		t.Errorf("fairshard_settle_errors_total = %v, want 2", v)
	}
	// The two Completes that failed were tried again: the rows were not
	// re-armed and delivered a second time.
	redelivered := 0
	for _, k := range keys {
		redelivered += tg.count(k) - 1
	}
	if redelivered != 0 {
		t.Errorf("%d re-deliveries, want none: a failed settle is retried", redelivered)
	}
}

// TestMaxInFlightBoundsClaims: with MaxInFlight 4 and a blocking target,
// a sweep claims only 4 rows; the rest are claimed as deliveries finish.
func TestMaxInFlightBoundsClaims(t *testing.T) {
	tg, release := blockingTarget(t)
	cfg := testConfig(static(tg.URL()))
	cfg.MaxInFlight = 4
	d, b := setup(t, cfg)
	defer drain(t, d)
	var keys []string
	now := time.Now()
	for i := range 10 {
		keys = append(keys, fmt.Sprintf("k%d", i))
		mustAppend(t, b.store, mkRow(keys[i], "ns", "q", now))
	}
	sw, err := d.SweepOnce(t.Context())
	if err != nil || len(sw.Rows) != 4 {
		t.Fatalf("first sweep claimed %d rows (err %v), want MaxInFlight 4", len(sw.Rows), err)
	}
	if sw2, _ := d.SweepOnce(t.Context()); len(sw2.Rows) != 0 {
		t.Fatalf("a sweep at MaxInFlight claimed %d rows", len(sw2.Rows))
	}
	close(release)
	waitIdle(t, d)
	for range 3 {
		sweep(t, d)
	}
	sort.Strings(keys)
	for _, k := range keys {
		wantStatus(t, b.store, k, outbox.StatusDone)
	}
}

// TestUnusableTargetURLWaits: a target URL that is not an absolute http(s)
// URL is a configuration error: the route waits like one without target,
// its rows keep their attempts.
func TestUnusableTargetURLWaits(t *testing.T) {
	tg := newTarget(t, nil)
	urls := map[string]string{"relative": "/hooks", "ftp": "ftp://x/y", "empty": "", "good": tg.URL() + "/{task_queue}",
		"badhost": "http://x:{task_queue}/y"}
	d, b := setup(t, testConfig(TargetsFunc(func(r outbox.ClaimScope) (Target, bool) {
		return Target{URL: urls[r.TaskQueue]}, true
	})))
	defer drain(t, d)
	now := time.Now()
	for q := range urls {
		mustAppend(t, b.store, mkRow("k-"+q, "ns", q, now))
	}
	sweep(t, d)
	wantStatus(t, b.store, "k-good", outbox.StatusDone)
	for _, q := range []string{"relative", "ftp", "empty", "badhost"} {
		if r := wantStatus(t, b.store, "k-"+q, outbox.StatusPending); r.Attempt != 1 {
			t.Fatalf("row of route with %s URL: attempt %d, want 1", q, r.Attempt)
		}
	}
	if got := d.RoutesWithoutTarget(); len(got) != 4 {
		t.Fatalf("RoutesWithoutTarget = %v, want the 4 routes with unusable URLs", got)
	}
	// A placeholder may stand in the host: such a route is eligible.
	hostTmpl := TargetsFunc(func(outbox.ClaimScope) (Target, bool) { return Target{URL: "http://{namespace}.hooks.example/x"}, true })
	d2, _ := setup(t, testConfig(hostTmpl))
	defer drain(t, d2)
	if !d2.Eligible(outbox.ClaimScope{Namespace: "acme", TaskQueue: "q"}) {
		t.Fatal("a route whose target URL has {namespace} in its host is not eligible")
	}
}

// batchStore is a store that offers backpressure.BatchClaimer (as
// boltstore does) and counts its use.
type batchStore struct {
	outbox.Store
	batches atomic.Int64
}

func (s *batchStore) ClaimBatch(ctx context.Context, run func(claim func(outbox.ClaimParams) ([]outbox.Row, error)) error) error {
	s.batches.Add(1)
	return run(func(p outbox.ClaimParams) ([]outbox.Row, error) { return s.Claim(ctx, p) })
}

// TestBatchClaimerPassedThrough: the planner sees the dispatcher's store
// as it is, so a store's one-transaction sweep is used.
func TestBatchClaimerPassedThrough(t *testing.T) {
	tg := newTarget(t, nil)
	bs := &batchStore{Store: newStore(t)}
	cfg := testConfig(static(tg.URL()))
	cfg.Store = bs
	d, b := setup(t, cfg)
	defer drain(t, d)
	now := time.Now()
	mustAppend(t, b.store, mkRow("a", "ns", "q1", now), mkRow("b", "ns", "q2", now), mkRow("c", "other", "q", now))
	if sw := sweep(t, d); len(sw.Rows) != 3 {
		t.Fatalf("sweep claimed %d rows, want 3", len(sw.Rows))
	}
	if n := bs.batches.Load(); n != 1 {
		t.Fatalf("ClaimBatch called %d times for one sweep, want 1", n)
	}
}

// TestMergedAwayClaimStillCounts: a claimed row whose state a merge
// replaces while its delivery runs (a peer's newer copy, after a failover
// another node settled it) no longer counts as claimed in the store, but
// its request is still at the target: it must keep counting against the
// namespace's ceiling, or the next sweep claims past it (a chaos run saw
// 33 deliveries in flight from one node at quota 32).
func TestMergedAwayClaimStillCounts(t *testing.T) {
	for _, st := range storeKinds {
		t.Run(st.name, func(t *testing.T) {
			tg, release := blockingTarget(t)
			cfg := testConfig(static(tg.URL()))
			cfg.Store, _ = st.open(t)
			d, b := setup(t, cfg)
			defer drain(t, d)
			defer close(release)
			b.quotas.Store("ns", uint32(3))
			now := time.Now()
			for i := range 2 {
				mustAppend(t, b.store, mkRow(fmt.Sprintf("m%d", i), "ns", "q", now))
			}
			sw, err := d.SweepOnce(t.Context())
			if err != nil || len(sw.Rows) != 2 {
				t.Fatalf("first sweep claimed %d rows (err %v), want both", len(sw.Rows), err)
			}
			// Another node's newer copy of one row being delivered here.
			peer := wantStatus(t, b.store, sw.Rows[0].DispatchKey, outbox.StatusClaimed)
			peer.Status, peer.FinishedAt, peer.Version = outbox.StatusDone, time.Now(), peer.Version.Next()
			merger, ok := b.store.(interface {
				Merge(context.Context, []outbox.Row) (outbox.MergeResult, error)
			})
			if !ok {
				t.Fatalf("%T cannot merge a peer's copy", b.store)
			}
			if _, err := merger.Merge(t.Context(), []outbox.Row{peer}); err != nil {
				t.Fatal(err)
			}
			wantStatus(t, b.store, peer.DispatchKey, outbox.StatusDone)
			for i := 2; i < 6; i++ {
				mustAppend(t, b.store, mkRow(fmt.Sprintf("m%d", i), "ns", "q", now))
			}
			// Quota 3, 2 deliveries at the target (1 still claimed in the
			// store): exactly 1 more. Counting only the store claims 2;
			// adding the deliveries to the store's count claims 0.
			if sw2, err := d.SweepOnce(t.Context()); err != nil || len(sw2.Rows) != 1 {
				t.Fatalf("with 2 deliveries at the target (one of them merged to done meanwhile), a sweep claimed %d rows (err %v), want 1: the quota is 3",
					len(sw2.Rows), err)
			}
			if sw3, err := d.SweepOnce(t.Context()); err != nil || len(sw3.Rows) != 0 {
				t.Fatalf("at the quota, a sweep claimed %d rows (err %v)", len(sw3.Rows), err)
			}
		})
	}
}

// TestPeersRearmedCopyDoesNotResendADeliveryInFlight: a row being
// delivered here whose copy from another node arrives mid delivery, live
// and with a later Seq (a backup restarted and re-armed the claim it held
// when it was killed), stays claimed: the next sweeps claim nothing, the
// target sees the row once, and the delivery's settle marks it done (a
// chaos soak saw the primary send such a row twice).
func TestPeersRearmedCopyDoesNotResendADeliveryInFlight(t *testing.T) {
	for _, st := range storeKinds {
		t.Run(st.name, func(t *testing.T) {
			tg, release := blockingTarget(t)
			cfg := testConfig(static(tg.URL()))
			cfg.Store, _ = st.open(t)
			d, b := setup(t, cfg)
			defer drain(t, d)
			b.quotas.Store("ns", uint32(4))
			mustAppend(t, b.store, mkRow("rearmed", "ns", "q", time.Now()))
			sw, err := d.SweepOnce(t.Context())
			if err != nil || len(sw.Rows) != 1 {
				close(release)
				t.Fatalf("first sweep claimed %d rows (err %v), want 1", len(sw.Rows), err)
			}
			poll.Eventually(t, 10*time.Second, "the delivery reaches the target", func() (bool, string) {
				return tg.count("rearmed") == 1, fmt.Sprintf("%d requests", tg.count("rearmed"))
			})
			peer := wantStatus(t, b.store, "rearmed", outbox.StatusClaimed)
			peer.Status, peer.ClaimedAt, peer.Version = outbox.StatusPending, time.Time{}, peer.Version.Next()
			peer.VisibleAfter = time.Now().Add(-time.Second)
			merger := b.store.(interface {
				Merge(context.Context, []outbox.Row) (outbox.MergeResult, error)
			})
			if _, err := merger.Merge(t.Context(), []outbox.Row{peer}); err != nil {
				close(release)
				t.Fatal(err)
			}
			for range 3 {
				if sw, err := d.SweepOnce(t.Context()); err != nil || len(sw.Rows) != 0 {
					close(release)
					t.Fatalf("with the row's delivery in flight, a sweep claimed %d rows (err %v), want 0", len(sw.Rows), err)
				}
			}
			close(release)
			poll.Eventually(t, 10*time.Second, "the delivery's settle", func() (bool, string) {
				r, err := b.store.Get(t.Context(), "rearmed")
				return err == nil && r.Status == outbox.StatusDone, fmt.Sprintf("%s %v", r.Status, err)
			})
			if n := tg.count("rearmed"); n != 1 {
				t.Fatalf("the target saw the row %d times, want once", n)
			}
		})
	}
}

// fakeFence is a pause fence whose answers the test scripts: a pause at
// the exact moment between a claim and its request, which a real process
// cannot be made to hit on cue.
type fakeFence struct {
	gen    atomic.Uint64
	allow  atomic.Int64 // Allow calls answered by the generation alone first
	refuse atomic.Int64 // then this many answer false
}

func (f *fakeFence) Gen() uint64 { return f.gen.Load() }

func (f *fakeFence) Allow(gen uint64) bool {
	if f.allow.Add(-1) < 0 && f.refuse.Add(-1) >= 0 {
		return false
	}
	return gen == f.gen.Load()
}

// TestFencedRowsAreNotSent: rows claimed before a pause whose fence then
// refuses them are not sent (their requests never reach the target) and
// go back to pending with their attempt unchanged; claimed again after
// the pause, each reaches the target exactly once, at attempt 1.
func TestFencedRowsAreNotSent(t *testing.T) {
	tg := newTarget(t, nil)
	cfg := testConfig(static(tg.URL()))
	fence := &fakeFence{}
	cfg.Fence = fence
	d, b := setup(t, cfg)
	defer drain(t, d)
	now := time.Now()
	var keys []string
	for i := range 6 {
		keys = append(keys, fmt.Sprintf("f%d", i))
		mustAppend(t, b.store, mkRow(keys[i], "ns", "q", now))
	}
	// The sweep's own check passes; the check of each of its rows before
	// its request does not: a pause came in between.
	fence.allow.Store(1)
	fence.refuse.Store(int64(len(keys)))
	if sw := sweep(t, d); len(sw.Rows) != len(keys) {
		t.Fatalf("first sweep claimed %d rows, want %d", len(sw.Rows), len(keys))
	}
	poll.Eventually(t, 5*time.Second, "the fenced rows back to pending", func() (bool, string) {
		for _, k := range keys {
			if !statusIs(b.store, k, outbox.StatusPending) {
				return false, ""
			}
		}
		return true, ""
	})
	if n := tg.total(); n != 0 {
		t.Fatalf("the target received %d requests from fenced rows, want 0", n)
	}
	if v := testutil.ToFloat64(d.m.fenced.WithLabelValues("ns")); v != float64(len(keys)) {
		t.Fatalf("fairshard_deliveries_fenced_total = %v, want %d", v, len(keys))
	}
	fence.gen.Add(1) // the pause was handled: a new generation
	if sw := sweep(t, d); len(sw.Rows) != len(keys) {
		t.Fatalf("second sweep claimed %d rows, want %d", len(sw.Rows), len(keys))
	}
	poll.Eventually(t, 5*time.Second, "every row delivered after the pause", func() (bool, string) {
		for _, k := range keys {
			if !statusIs(b.store, k, outbox.StatusDone) {
				return false, ""
			}
		}
		return true, ""
	})
	for _, k := range keys {
		if c := tg.count(k); c != 1 {
			t.Errorf("%s reached the target %d times, want once", k, c)
		}
	}
	for _, rq := range tg.requests() {
		if a := rq.header.Get(HeaderAttempt); a != "1" {
			t.Errorf("a request carried attempt %s, want 1: a fenced row is not an attempt", a)
		}
	}
}

// gateStore holds every Complete and Retry at a gate until released: a
// settle slower than the next claim, which a real store shows only by
// chance. entered receives the dispatch_key of each settle held.
type gateStore struct {
	outbox.Store
	entered chan string
	release chan struct{}
	once    sync.Once
}

// open releases the settles held and lets every later one through.
func (g *gateStore) open() { g.once.Do(func() { close(g.release) }) }

func newGateStore(s outbox.Store) *gateStore {
	return &gateStore{Store: s, entered: make(chan string, 16), release: make(chan struct{})}
}

func (g *gateStore) hold(key string) {
	g.entered <- key
	<-g.release
}

func (g *gateStore) Complete(ctx context.Context, p outbox.CompleteParams) error {
	g.hold(p.DispatchKey)
	return g.Store.Complete(ctx, p)
}

func (g *gateStore) Retry(ctx context.Context, p outbox.RetryParams) error {
	g.hold(p.DispatchKey)
	return g.Store.Retry(ctx, p)
}

// waitEntered waits for a settle of key to reach the gate.
func (g *gateStore) waitEntered(t *testing.T, key string) {
	t.Helper()
	select {
	case got := <-g.entered:
		if got != key {
			t.Fatalf("settle of %s reached the gate, want %s", got, key)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the settle of %s did not start within 10s", key)
	}
}

// quotaOneOfTwo builds a dispatcher over gate for namespace ns of quota
// 1, appends rows prefix+"1" and prefix+"2" and runs a sweep, which must
// claim the first alone. The dispatcher is drained at cleanup.
func quotaOneOfTwo(t *testing.T, cfg Config, gate *gateStore, prefix string) *Dispatcher {
	t.Helper()
	cfg.Store = gate
	d, b := setup(t, cfg)
	t.Cleanup(func() { drain(t, d) })
	t.Cleanup(gate.open) // before the drain: a failed test leaves no settle held
	b.quotas.Store("ns", uint32(1))
	now := time.Now().Add(-time.Second) // both visible at once, in order
	mustAppend(t, gate.Store, mkRow(prefix+"1", "ns", "q", now), mkRow(prefix+"2", "ns", "q", now.Add(time.Millisecond)))
	if sw, err := d.SweepOnce(t.Context()); err != nil || len(sw.Rows) != 1 || sw.Rows[0].DispatchKey != prefix+"1" {
		t.Fatalf("first sweep claimed %v (err %v), want %s1 alone: the quota is 1", sw.Rows, err, prefix)
	}
	return d
}

// TestAnsweredSlotGoesBackToWorkBeforeItsSettle: with quota 1, once the
// target answered a row its slot takes the next row while the settle is
// still being written (quota.Claims: settling deliveries leave the count),
// and the target still never has more than one request at once.
func TestAnsweredSlotGoesBackToWorkBeforeItsSettle(t *testing.T) {
	tg := newTarget(t, nil)
	cfg := testConfig(static(tg.URL()))
	gate := newGateStore(newStore(t))
	d := quotaOneOfTwo(t, cfg, gate, "s")
	gate.waitEntered(t, "s1")
	wantStatus(t, gate.Store, "s1", outbox.StatusClaimed) // its settle is held
	sw, err := d.SweepOnce(t.Context())
	if err != nil || len(sw.Rows) != 1 || sw.Rows[0].DispatchKey != "s2" {
		t.Fatalf("with s1 answered and its settle held, a sweep claimed %v (err %v), want s2", sw.Rows, err)
	}
	gate.waitEntered(t, "s2")
	gate.open()
	waitIdle(t, d)
	wantStatus(t, gate.Store, "s1", outbox.StatusDone)
	wantStatus(t, gate.Store, "s2", outbox.StatusDone)
	if p := tg.peak.Load(); p != 1 {
		t.Fatalf("the target had %d requests at once, want 1 (quota 1)", p)
	}
}

// TestUnansweredSlotWaitsForItsSettle: a delivery that timed out may
// still be running at the target, so its slot stays taken until the
// settle is written: with quota 1 a sweep meanwhile claims nothing.
func TestUnansweredSlotWaitsForItsSettle(t *testing.T) {
	hung := make(chan struct{})
	tg := newTarget(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(HeaderDispatchKey) == "u1" {
			select {
			case <-hung:
			case <-r.Context().Done():
			}
		}
		w.WriteHeader(http.StatusOK)
	})
	defer close(hung)
	cfg := testConfig(static(tg.URL()))
	cfg.DeliveryTimeout = 100 * time.Millisecond
	gate := newGateStore(newStore(t))
	d := quotaOneOfTwo(t, cfg, gate, "u")
	gate.waitEntered(t, "u1") // timed out: its retry is held
	sw, err := d.SweepOnce(t.Context())
	if err != nil || len(sw.Rows) != 0 {
		t.Fatalf("with u1 timed out and its settle held, a sweep claimed %v (err %v), want nothing", sw.Rows, err)
	}
	if len(sw.Namespaces) != 1 || !sw.Namespaces[0].AtCeiling() {
		t.Fatalf("namespaces %+v, want ns at its ceiling", sw.Namespaces)
	}
	gate.open()
	waitIdle(t, d)
	if r := wantStatus(t, gate.Store, "u1", outbox.StatusPending); !strings.HasPrefix(r.LastError, OutcomeUnknownPrefix) {
		t.Fatalf("u1 last_error %q, want an outcome unknown", r.LastError)
	}
}
