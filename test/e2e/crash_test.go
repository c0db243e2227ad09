package e2e

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/loadgen"
)

// Scenario 5, crash: SIGKILL one of 3 nodes under load, restart it with the
// same name and data dir. Every acknowledged row is delivered. Only rows
// that were in flight at the kill may be delivered twice:
//
//   - rows the killed node had claimed and the target had answered, but
//     whose done it had not committed yet: re-armed on restart, delivered
//     again. Their number is bounded by the rows it could have had claimed:
//     in exact quota mode (the default) a node's ceiling is its lease
//     grant, which follows its demand and never exceeds the namespace's
//     quota, so the bound is the sum of the quotas (a ceiling read before
//     the load is the grant of a node without demand: 0),
//     and each is a row of its shards. (A delivery cut off by the kill is
//     not counted by the target: loadgen.Receiver ignores abandoned ones.)
//   - with replicated shards (R = 2, the default), rows the killed node
//     had settled whose done its backup had not acknowledged yet (the
//     settle lag): the backup, primary while the node is down, delivers
//     them again. Bounded by the node's unacknowledged state changes
//     (fairshard_replication_pending_changes, which counts a batch in
//     flight to a backup until it is acknowledged; one backup per shard at
//     R = 2, so changes are rows; read from GET /v1/cluster, quicker than a
//     scrape of a race-built node), read just before the kill, plus what it
//     could settle between that read and the kill (its ceilings' sum of
//     deliveries per target delay).
//   - appends in flight to the killed node: the node may have stored a
//     batch and died before answering, the generator then retried it on a
//     survivor, which may own the shard by then. These keys are known
//     (loadgen's OnFailed) and reported apart: a retried append across a
//     crash is at-least-once by design (the target deduplicates by
//     dispatch_key), as under a partition.
func TestCrashRestart(t *testing.T) {
	const (
		rows = 8_000
		rate = 1_000 // rows/s, so the kill lands mid-load
	)
	quotas := map[string]int{"crash-a": 24, "crash-b": 48}
	const targetDelay = 20 * time.Millisecond
	c := newCluster(t, clusterOpts{TargetDelay: targetDelay})
	c.startNode("crash-0")
	c.startNode("crash-1")
	victim := c.startNode("crash-2")
	c.waitConverged(20 * time.Second)
	for ns, q := range quotas {
		c.setNamespace(ns, map[string]any{"max_in_flight": q})
	}
	// The bound: what the victim may have claimed at any instant. Exact
	// mode (the default): its grant, at most the quota.
	bound := 0
	for ns, q := range quotas {
		v, err := c.namespace(victim, ns)
		if err != nil {
			t.Fatal(err)
		}
		if v.Mode != "exact" {
			t.Fatalf("%s is in %q mode; this bound is exact mode's", ns, v.Mode)
		}
		bound += q
	}

	l := newLedger()
	recv := c.receiver()
	gen := c.generator(l, loadgen.Config{
		Rows: rows, Rate: rate, BatchSize: 50, Concurrency: 3, KeyPrefix: "crash-",
		// A producer retries until acknowledged: while the cluster has not
		// yet declared the victim dead, a batch with a row of its replica
		// sets is refused (insufficient_copies) on every attempt of one
		// Append.
		KeepTrying: true,
		Namespaces: []loadgen.Namespace{{Name: "crash-a", Weight: 1, TaskQueues: 2}, {Name: "crash-b", Weight: 2, TaskQueues: 2}},
	})
	wait := startLoad(t, gen)
	poll.Eventually(t, deadline(15*time.Second), "load under way", func() (bool, string) {
		return recv.Delivered() >= 2_000, fmt.Sprintf("%d delivered", recv.Delivered())
	})
	inFlight := 0
	for _, r := range recv.Namespaces() {
		inFlight += r.InFlight
	}
	lag := c.killCountingSettleLag(victim, bound)
	killAt := time.Now()
	t.Logf("SIGKILL %s with %d deliveries in flight at the target (cluster-wide), %s; bound on duplicates = its ceilings' sum %d + %d",
		victim.name, inFlight, lag, bound, lag.bound())
	bound += lag.bound()

	// The survivors declare it dead and take its shards.
	c.waitMembers(2, 20*time.Second)
	t.Logf("survivors dropped %s %v after the kill", victim.name, time.Since(killAt).Round(time.Millisecond))

	restartAt := time.Now()
	c.restart(victim)
	conv := c.waitConverged(20 * time.Second)
	t.Logf("%s restarted (ready in %v) and the cluster converged %v later", victim.name,
		(time.Since(restartAt) - conv).Round(time.Millisecond), conv.Round(time.Millisecond))

	rep := wait()
	if rep.Appended != rows || rep.GaveUp != 0 {
		t.Fatalf("appended %d of %d rows (%d given up, %d request errors, last: %s)", rep.Appended, rows, rep.GaveUp, rep.Errors, gen.LastError())
	}
	took := c.waitDelivered(l, recv, time.Minute)
	t.Logf("all %d rows delivered %v after the load ended; %d append requests failed over; outcomes %v",
		rows, took.Round(time.Millisecond), rep.Errors, rep.ByStatus)
	c.waitSettled(30*time.Second, "crash-a", "crash-b")

	dups := checkNoStrays(t, l, recv)
	extra, retried := 0, 0
	for k, n := range dups {
		if l.wasRetried(k) {
			retried += n - 1
			continue
		}
		extra += n - 1
	}
	t.Logf("duplicates after the crash: %d keys delivered more than once: %d extra deliveries of claimed or settled rows (bound %d), %d of retried appends",
		len(dups), extra, bound, retried)
	if extra > bound {
		t.Errorf("%d extra deliveries after a crash; at most %d rows could have been in flight on %s or settled there and not yet on a backup", extra, bound, victim.name)
	}
	for _, r := range recv.Namespaces() {
		t.Logf("namespace %s (quota %d): max %d deliveries in flight at the target across the crash and restart",
			r.Namespace, quotas[r.Namespace], r.MaxInFlight)
	}
	if got := recv.Distinct(); got != rows {
		t.Errorf("target saw %d distinct dispatch_keys; want %d", got, rows)
	}
	// Every duplicate of a claimed row was a row of the killed node: after
	// the restart the member set is the same, so it owns the same shards and
	// holds them.
	for k := range dups {
		if l.wasRetried(k) {
			continue
		}
		var v rowView
		code, body, err := c.do(http.MethodGet, c.members()[0].baseURL()+"/v1/rows/"+url.PathEscape(k), nil, &v)
		if err != nil || code != http.StatusOK {
			t.Fatalf("GET /v1/rows/%s: HTTP %d %s: %v", k, code, body, err)
		}
		if v.Node != victim.name || v.Status != "done" {
			t.Errorf("duplicate %s is %s on %s (attempt %d); want done on the killed node %s", k, v.Status, v.Node, v.Attempt, victim.name)
		}
	}
}
