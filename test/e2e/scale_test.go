package e2e

import (
	"fmt"
	"math"
	"os"
	"regexp"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/loadgen"
)

// Scenario 3, scale out under load: 2 nodes take appends (a steady
// "live" namespace plus a paused "parked" one whose rows must stay pending),
// then a third node joins. Ownership converges (every node sees the same
// table, each owning about a third: within ±0.02), the newcomer syncs the
// shards of its replica sets from the first two, which drop the copies
// they no longer replicate (synced and dropped counters > 0; the parked
// rows, exactly counted at R = 2 copies each, end up spread over three
// nodes), nothing is lost and nothing is delivered twice (the newcomer
// claims from a shard only once its old primary's deliveries ended:
// replication's handover).
func TestScaleOut(t *testing.T) {
	const (
		parkedRows = 3_000
		liveRows   = 6_000
		liveRate   = 1_000 // rows/s: the third node joins mid-load
	)
	c := newCluster(t, clusterOpts{TargetDelay: 20 * time.Millisecond})
	a := c.startNode("out-a")
	b := c.startNode("out-b")
	c.waitConverged(20 * time.Second)
	c.setNamespace("parked", map[string]any{"paused": true})

	l := newLedger()
	rep := runLoad(t, c.generator(l, loadgen.Config{
		Rows: parkedRows, BatchSize: 100, Concurrency: 2, KeyPrefix: "parked-",
		Namespaces: []loadgen.Namespace{{Name: "parked", Weight: 1}},
	}))
	if rep.Appended != parkedRows || rep.GaveUp != 0 {
		t.Fatalf("parked: appended %d of %d (%d given up)", rep.Appended, parkedRows, rep.GaveUp)
	}
	recv := c.receiver()
	live := c.generator(l, loadgen.Config{
		Rows: liveRows, Rate: liveRate, BatchSize: 50, Concurrency: 2, KeyPrefix: "live-",
		Namespaces: []loadgen.Namespace{{Name: "live", Weight: 1, TaskQueues: 2}},
	})
	waitLive := startLoad(t, live)
	poll.Eventually(t, deadline(10*time.Second), "live load under way", func() (bool, string) {
		return recv.Delivered() >= liveRate, fmt.Sprintf("%d delivered", recv.Delivered())
	})

	joinAt := time.Now()
	n3 := c.startNode("out-c")
	conv := c.waitConverged(20 * time.Second)
	t.Logf("out-c ready %v after its start; ownership converged %v later", time.Since(joinAt)-conv, conv.Round(time.Millisecond))
	for _, p := range c.members() {
		for name, f := range c.fractions(p) {
			if math.Abs(f-1.0/3) > 0.02 {
				t.Errorf("%s sees %s owning a fraction %.4f; want 1/3 ± 0.02", p.name, name, f)
			}
		}
	}
	for _, p := range []*proc{a, b, n3} {
		if f := c.mustMetric(p, "fairshard_owned_shard_fraction", nil); math.Abs(f-1.0/3) > 0.02 {
			t.Errorf("%s: fairshard_owned_shard_fraction %.4f; want 1/3 ± 0.02", p.name, f)
		}
	}

	// Shard sync: out-c copies its shards; a and b drop what they no
	// longer replicate.
	handoff := time.Now()
	poll.Eventually(t, deadline(30*time.Second), "leftover copies dropped on every node", func() (bool, string) {
		for _, p := range c.members() {
			v, err := c.clusterView(p)
			if err != nil {
				return false, err.Error()
			}
			if v.Handoff.ShardsPending != 0 {
				return false, fmt.Sprintf("%s: %d shards still to drop", p.name, v.Handoff.ShardsPending)
			}
		}
		return true, ""
	})
	t.Logf("leftovers dropped %v after convergence", time.Since(handoff).Round(time.Millisecond))
	dropped := c.mustMetric(a, "fairshard_replication_dropped_rows_total", nil) + c.mustMetric(b, "fairshard_replication_dropped_rows_total", nil)
	synced := c.mustMetric(n3, "fairshard_replication_sync_rows_total", nil)
	t.Logf("shard sync: out-c received %.0f rows; out-a and out-b dropped %.0f copies", synced, dropped)
	if synced == 0 || dropped == 0 {
		t.Errorf("no rows moved (out-c synced %.0f, out-a and out-b dropped %.0f), yet %d parked rows were pending on 2 nodes", synced, dropped, parkedRows)
	}
	// Every parked row is still pending, in exactly R = 2 copies, and
	// out-c holds its share of them now.
	total := 0
	for _, p := range c.members() {
		v, err := c.namespace(p, "parked")
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s holds %d parked rows", p.name, v.Pending)
		if v.Pending == 0 {
			t.Errorf("%s holds no parked row; every node owns a third of the shards", p.name)
		}
		total += v.Pending + v.Claimed
	}
	if total != 2*parkedRows {
		t.Errorf("the cluster holds %d copies of parked rows; want exactly %d (R = 2)", total, 2*parkedRows)
	}

	lrep := waitLive()
	if lrep.Appended != liveRows || lrep.GaveUp != 0 {
		t.Fatalf("live: appended %d of %d (%d given up, %d request errors, last: %s)", lrep.Appended, liveRows, lrep.GaveUp, lrep.Errors, live.LastError())
	}
	c.setNamespace("parked", map[string]any{"paused": false})
	took := c.waitDelivered(l, recv, time.Minute)
	t.Logf("all %d rows delivered %v after the live load ended", l.len(), took.Round(time.Millisecond))
	if dups := checkNoStrays(t, l, recv); len(dups) != 0 {
		t.Errorf("%d dispatch_keys delivered more than once across a scale out: %v", len(dups), firstN(dups, 5))
	}
	if got, want := recv.Distinct(), parkedRows+liveRows; got != want {
		t.Errorf("target saw %d distinct dispatch_keys; want %d", got, want)
	}
	c.waitSettled(20*time.Second, "parked", "live")
}

// Scenario 4, scale in under load: one of 3 nodes gets SIGTERM while it
// holds a backlog and the load goes on. It drains (in-flight deliveries
// finish, its copies are merged into their replica sets on the two others
// before it drops them), exits 0, and every acknowledged row is delivered
// exactly once (the new primaries claim a shard only once the leaver's
// deliveries of it ended: replication's handover).
func TestScaleIn(t *testing.T) {
	const (
		backlogRows = 3_000
		liveRows    = 4_000
		liveRate    = 800
	)
	c := newCluster(t, clusterOpts{TargetDelay: 20 * time.Millisecond})
	a := c.startNode("in-a")
	b := c.startNode("in-b")
	leaver := c.startNode("in-c")
	c.waitConverged(20 * time.Second)
	// A slow namespace keeps a backlog pending on every node.
	c.setNamespace("backlog", map[string]any{"max_in_flight": 12})

	l := newLedger()
	recv := c.receiver()
	rep := runLoad(t, c.generator(l, loadgen.Config{
		Rows: backlogRows, BatchSize: 100, Concurrency: 2, KeyPrefix: "backlog-",
		Namespaces: []loadgen.Namespace{{Name: "backlog", Weight: 1}},
	}))
	if rep.Appended != backlogRows || rep.GaveUp != 0 {
		t.Fatalf("backlog: appended %d of %d (%d given up)", rep.Appended, backlogRows, rep.GaveUp)
	}
	live := c.generator(l, loadgen.Config{
		Rows: liveRows, Rate: liveRate, BatchSize: 40, Concurrency: 2, KeyPrefix: "live-",
		Namespaces: []loadgen.Namespace{{Name: "live", Weight: 1}},
	})
	waitLive := startLoad(t, live)
	poll.Eventually(t, deadline(10*time.Second), "live load under way", func() (bool, string) {
		return recv.Delivered() >= 500, fmt.Sprintf("%d delivered", recv.Delivered())
	})
	v, err := c.namespace(leaver, "backlog")
	if err != nil {
		t.Fatal(err)
	}
	if v.Pending == 0 {
		t.Fatalf("%s holds no pending backlog row at SIGTERM; the scenario needs some", leaver.name)
	}
	t.Logf("SIGTERM %s while it holds %d pending and %d claimed backlog rows", leaver.name, v.Pending, v.Claimed)

	stopAt := time.Now()
	code := leaver.stop(t, 30*time.Second)
	t.Logf("%s exited with code %d after %v", leaver.name, code, time.Since(stopAt).Round(time.Millisecond))
	if code != 0 {
		t.Fatalf("%s exited %d after SIGTERM; want 0 (a complete drain)", leaver.name, code)
	}
	conv := c.waitConverged(10 * time.Second)
	t.Logf("2 nodes converged %v after the exit", conv.Round(time.Millisecond))
	for _, p := range c.members() {
		for name, f := range c.fractions(p) {
			if math.Abs(f-0.5) > 0.02 {
				t.Errorf("%s sees %s owning %.4f; want 1/2 ± 0.02", p.name, name, f)
			}
		}
	}
	received := c.mustMetric(a, "fairshard_replication_received_rows_total", nil) + c.mustMetric(b, "fairshard_replication_received_rows_total", nil)
	t.Logf("in-a and in-b merged %.0f rows pushed by replication (state changes, the drain of %s)", received, leaver.name)
	if received == 0 {
		t.Errorf("no row merged from the leaving node, yet it held %d pending rows", v.Pending)
	}
	// The leaver's own account of its drain (it exited: its log is what
	// is left of it).
	if log, err := os.ReadFile(leaver.logPath); err != nil {
		t.Fatal(err)
	} else if !drainedRE.Match(log) {
		t.Errorf("%s's log has no drain that dropped rows after handing them to their replica sets", leaver.name)
	}

	lrep := waitLive()
	if lrep.Appended != liveRows || lrep.GaveUp != 0 {
		t.Fatalf("live: appended %d of %d (%d given up, %d request errors, last: %s)", lrep.Appended, liveRows, lrep.GaveUp, lrep.Errors, live.LastError())
	}
	took := c.waitDelivered(l, recv, time.Minute)
	t.Logf("all %d rows delivered %v after the live load ended (%d append requests failed over to another node)", l.len(), took.Round(time.Millisecond), lrep.Errors)
	if dups := checkNoStrays(t, l, recv); len(dups) != 0 {
		t.Errorf("%d dispatch_keys delivered more than once across a graceful leave: %v", len(dups), firstN(dups, 5))
	}
	if got, want := recv.Distinct(), backlogRows+liveRows; got != want {
		t.Errorf("target saw %d distinct dispatch_keys; want %d", got, want)
	}
	c.waitSettled(20*time.Second, "backlog", "live")
}

// drainedRE matches replication's log line of a drain that dropped rows.
var drainedRE = regexp.MustCompile(`msg="copies handed to their replica sets and dropped".* rows=[1-9][0-9]* .*drain=true`)
