package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/fairshard/fairshard/loadgen"
)

// Scenario 2, fairness: a "big" namespace appends 50,000 rows while a
// "small" one appends 200 spread over the same time. The small one's p99
// append-to-delivery latency must stay within 5× its p99 on an idle
// cluster plus 200 ms, and below a tenth of the big one's p50. The nodes
// are plain-built (clusterOpts.PlainBuild) even under -race: the bound is
// a latency, and race-built nodes took 4-8× longer per sweep and commit
// (and two minutes of the suite to drain the big backlog).
//
// The big namespace has a quota of 32, so it sits at its ceiling on every
// node with a backlog of tens of thousands of rows (it appends at 2,500
// rows/s and delivers a few hundred per second) while the target is not
// saturated: a quota is how an operator protects a shared target, and with
// the target saturated no scheduler could keep anyone's latency. What is
// measured is then the claim planner's promise: a quiet namespace gets a
// slot every sweep however deep another's backlog is. Were the small
// namespace queued behind the big one (FIFO), its latency would be the big
// one's, seconds (the big p50 is logged).
//
// The additive 200 ms is headroom for the 2-core machine: under load the
// small row's append itself waits behind the big namespace's batches in
// each node's single bbolt writer (POST p50 ~20 ms vs ~3 ms idle), sweeps
// over the big backlog take ~10 ms, and the same cores run three nodes, the
// target and the generator, and in CI other packages' race tests. The
// latency figures of both phases are logged.
func TestFairness(t *testing.T) {
	const (
		bigRows   = 50_000
		smallRows = 200
		// The big namespace appends at bigRate rows/s for 20 s; the small
		// one spreads its rows over the same 20 s.
		bigRate   = 2_500
		smallRate = float64(smallRows) * bigRate / bigRows
		bigQuota  = 32
	)
	c := newCluster(t, clusterOpts{TargetDelay: 20 * time.Millisecond, PlainBuild: true})
	for i := range 3 {
		c.startNode(fmt.Sprintf("fair-%d", i))
	}
	c.waitConverged(20 * time.Second)
	c.setNamespace("big", map[string]any{"max_in_flight": bigQuota})

	// Idle: the small namespace alone (at 4× its loaded rate, to save
	// time: on an idle cluster the rate does not change the latency).
	idle := newLedger()
	recv := c.receiver()
	rep := runLoad(t, c.generator(idle, loadgen.Config{
		Rows: smallRows, Rate: 4 * smallRate, BatchSize: 1, Concurrency: 1, KeyPrefix: "idle-",
		Namespaces: []loadgen.Namespace{{Name: "small", Weight: 1}},
	}))
	if rep.Appended != smallRows || rep.GaveUp != 0 {
		t.Fatalf("idle phase appended %d of %d rows (%d given up)", rep.Appended, smallRows, rep.GaveUp)
	}
	c.waitDelivered(idle, recv, 30*time.Second)
	idleLat := recv.Latency("small").Summary()

	// Loaded: the same small load while the big namespace floods.
	recv = c.resetReceiver()
	big, small := newLedger(), newLedger()
	waitBig := startLoad(t, c.generator(big, loadgen.Config{
		Rows: bigRows, Rate: bigRate, BatchSize: 250, Concurrency: 4, KeyPrefix: "big-",
		Namespaces: []loadgen.Namespace{{Name: "big", Weight: 1, TaskQueues: 4}},
	}))
	srep := runLoad(t, c.generator(small, loadgen.Config{
		Rows: smallRows, Rate: smallRate, BatchSize: 1, Concurrency: 1, KeyPrefix: "small-",
		Namespaces: []loadgen.Namespace{{Name: "small", Weight: 1}},
	}))
	brep := waitBig()
	if brep.Appended != bigRows || brep.GaveUp != 0 || srep.Appended != smallRows || srep.GaveUp != 0 {
		t.Fatalf("appended big %d/%d (%d given up), small %d/%d (%d given up)",
			brep.Appended, bigRows, brep.GaveUp, srep.Appended, smallRows, srep.GaveUp)
	}
	smallTook := c.waitDelivered(small, recv, time.Minute)
	// The small namespace is measured; let the big backlog drain at full
	// speed.
	c.setNamespace("big", map[string]any{"max_in_flight": 128})
	bigTook := c.waitDelivered(big, recv, 2*time.Minute)
	loadedLat := recv.Latency("small").Summary()
	bigLat := recv.Latency("big").Summary()

	t.Logf("big: %d rows appended in %v (%.0f rows/s), all delivered %v after the last append; append→delivery p50 %.0f ms p99 %.0f ms",
		bigRows, brep.Elapsed.Round(time.Millisecond), brep.RowsPerSec, bigTook.Round(time.Millisecond), bigLat.P50, bigLat.P99)
	t.Logf("small: appended over %v (POST p50 %.1f ms p99 %.1f ms; idle POST p50 %.1f ms p99 %.1f ms); delivered %v after its last append",
		srep.Elapsed.Round(time.Millisecond), srep.AppendLatency.P50, srep.AppendLatency.P99, rep.AppendLatency.P50, rep.AppendLatency.P99, smallTook.Round(time.Millisecond))
	t.Logf("small append→delivery idle:   p50 %.1f ms p90 %.1f ms p99 %.1f ms max %.1f ms", idleLat.P50, idleLat.P90, idleLat.P99, idleLat.Max)
	t.Logf("small append→delivery loaded: p50 %.1f ms p90 %.1f ms p99 %.1f ms max %.1f ms", loadedLat.P50, loadedLat.P90, loadedLat.P99, loadedLat.Max)

	timing := logNodeTimings(t, c, c.members()[0])
	logHostLimits(t, c)
	// The quiet namespace never waits behind the noisy one's backlog,
	// whatever the build: its p99 stays a small fraction of the big one's
	// p50 (measured: 40-70× below in plain and -race builds).
	if loadedLat.P99 > bigLat.P50/10 {
		t.Errorf("small namespace p99 %.1f ms under load is more than a tenth of the big namespace's p50 %.0f ms: it queued behind the backlog",
			loadedLat.P99, bigLat.P50)
	}
	// The latency bound: the idle p99 plus a few loaded sweeps and commits,
	// 200 ms (≈ 13 × (8 + 7) ms, the plain build's mean sweep and commit
	// under this load).
	const allowance = 200.0
	bound := 5*idleLat.P99 + allowance
	if loadedLat.P99 > bound {
		t.Errorf("small namespace p99 %.1f ms under load exceeds 5 × idle p99 %.1f ms + %.0f ms = %.1f ms (mean sweep %.1f ms, commit %.1f ms)",
			loadedLat.P99, idleLat.P99, allowance, bound, timing["sweep_duration"], timing["store_commit_duration"])
	}
	if dups := checkNoStrays(t, mergeLedgers(big, small), recv); len(dups) != 0 {
		t.Errorf("%d dispatch_keys delivered more than once (no fault): %v", len(dups), firstN(dups, 5))
	}
	if got, want := recv.Distinct(), bigRows+smallRows; got != want {
		t.Errorf("target saw %d distinct dispatch_keys; want %d", got, want)
	}
}

// mergeLedgers returns one ledger holding the keys of all of ls.
func mergeLedgers(ls ...*ledger) *ledger {
	out := newLedger()
	for _, l := range ls {
		for k, ns := range l.snapshot() {
			out.keys[k] = ns
		}
	}
	return out
}
