package e2e

import (
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/shards"
)

// Exact cluster-wide quota. Every node runs with --lease-length 2s and
// --lease-refresh 100ms (baseNodeFlags); the target holds each request
// 50 ms and counts, per namespace, the most requests it held at once.

const (
	quotaHold     = 50 * time.Millisecond
	quotaShards   = 1024
	quotaLeaseLen = 2 * time.Second
)

// leaseNSView is GET /v1/namespaces/{ns} with the exact-mode fields.
type leaseNSView struct {
	namespaceView
	Mode  string `json:"mode"`
	Lease *struct {
		Coordinator string `json:"coordinator"`
		Grant       uint32 `json:"grant"`
		Wants       uint32 `json:"wants"`
		Cluster     *struct {
			Learning    bool   `json:"learning"`
			Outstanding uint64 `json:"outstanding"`
		} `json:"cluster"`
		ClusterError string `json:"cluster_error"`
	} `json:"lease"`
}

func (c *testCluster) leaseView(p *proc, ns string) (leaseNSView, error) {
	var v leaseNSView
	code, body, err := c.do(http.MethodGet, p.baseURL()+"/v1/namespaces/"+ns, nil, &v)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET /v1/namespaces/%s on %s: HTTP %d %s", ns, p.name, code, body)
	}
	return v, err
}

// waitLearned waits until every namespace's coordinator (as the first
// member sees it) has finished learning, so a drain measures the steady
// protocol and not the start-up of the cluster.
func (c *testCluster) waitLearned(namespaces ...string) {
	c.t.Helper()
	poll.Eventually(c.t, deadline(20*time.Second), "the namespaces' coordinators to finish learning", func() (bool, string) {
		for _, ns := range namespaces {
			v, err := c.leaseView(c.members()[0], ns)
			if err != nil {
				return false, err.Error()
			}
			if v.Lease == nil || v.Lease.Cluster == nil || v.Lease.Cluster.Learning {
				return false, fmt.Sprintf("%s: %+v", ns, v.Lease)
			}
		}
		return true, ""
	})
}

// setMode is setNamespace for settings that include a mode: it also waits
// until every member shows the mode (setNamespace checks max_in_flight
// and paused only, and the mode is a key of its own in the gossip).
func (c *testCluster) setMode(ns string, settings map[string]any) {
	c.t.Helper()
	c.setNamespace(ns, settings)
	want := settings["mode"].(string)
	poll.Eventually(c.t, deadline(10*time.Second), "mode of "+ns+" on every member", func() (bool, string) {
		for _, p := range c.members() {
			v, err := c.leaseView(p, ns)
			if err != nil {
				return false, err.Error()
			}
			if v.Mode != want {
				return false, fmt.Sprintf("%s: mode %q", p.name, v.Mode)
			}
		}
		return true, ""
	})
}

// appendKeysVia appends rows of ns with keys, 100 per request, through the
// given nodes in turn; it fails the test unless every row is stored. A 503
// (a replica set short of its write copies while a killed member is not yet
// failed over) is retried as a producer would, with the same rows, for up
// to 15 s (appends are idempotent by dispatch_key).
func (c *testCluster) appendKeysVia(via []*proc, ns string, keys []string) {
	c.t.Helper()
	for b := 0; len(keys) > 0; b++ {
		n := min(len(keys), 100)
		rows := make([]map[string]any, n)
		for i, k := range keys[:n] {
			rows[i] = map[string]any{"dispatch_key": k, "namespace": ns, "task_queue": "q"}
		}
		p := via[b%len(via)]
		deadline := time.Now().Add(deadline(15 * time.Second))
		for {
			code, body, err := c.do(http.MethodPost, p.baseURL()+"/v1/rows", map[string]any{"rows": rows}, nil)
			if err == nil && code == http.StatusOK {
				break
			}
			if err != nil || code != http.StatusServiceUnavailable || time.Now().After(deadline) {
				c.t.Fatalf("append %d rows of %s through %s: HTTP %d %s: %v", n, ns, p.name, code, body, err)
			}
			time.Sleep(200 * time.Millisecond)
		}
		keys = keys[n:]
	}
}

// drain follows one namespace's deliveries at the target, polled every
// 5 ms: when they started, when all rows were in, and the longest time
// without a delivery in between.
type drain struct {
	ns       string
	rows     int
	start    time.Time // when the rows were appended
	first    time.Time // first delivery
	done     time.Time // the rows-th delivery
	last     time.Time // latest delivery seen
	maxGap   time.Duration
	gapAt    time.Time // when the longest gap ended
	maxInFly int
	seen     int // deliveries seen at the last poll
}

// watchDrains polls the receiver until every drain is done or timeout
// passes, then returns them.
func (c *testCluster) watchDrains(timeout time.Duration, ds ...*drain) {
	c.t.Helper()
	end := time.Now().Add(deadline(timeout))
	for {
		now := time.Now()
		got := map[string]int{}
		for _, r := range c.receiver().Namespaces() {
			got[r.Namespace] = r.Delivered
			for _, d := range ds {
				if d.ns == r.Namespace {
					d.maxInFly = max(d.maxInFly, r.MaxInFlight)
				}
			}
		}
		pending := 0
		for _, d := range ds {
			if !d.done.IsZero() {
				continue
			}
			n := got[d.ns]
			if n > 0 && d.first.IsZero() {
				d.first, d.last = now, now
			}
			if !d.first.IsZero() {
				if n > d.seen {
					if gap := now.Sub(d.last); gap > d.maxGap {
						d.maxGap, d.gapAt = gap, now
					}
					d.last = now
				}
			}
			d.seen = n
			if n >= d.rows {
				d.done = now
				continue
			}
			pending++
		}
		if pending == 0 {
			return
		}
		if now.After(end) {
			for _, d := range ds {
				if d.done.IsZero() {
					c.t.Fatalf("%s: %d of %d rows delivered after %v (pending %d)", d.ns, got[d.ns], d.rows, time.Since(d.start), pending)
				}
			}
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// keysOn returns n keys with the given prefix whose shard is owned (in
// table) by a node for which want returns true.
func keysOn(prefix string, n int, table []string, want func(owner string) bool) []string {
	var out []string
	for i := 0; len(out) < n; i++ {
		k := fmt.Sprintf("%s-%06d", prefix, i)
		if want(table[shards.ShardOf(k, uint32(len(table)))]) {
			out = append(out, k)
		}
	}
	return out
}

// proportionalTwin returns the proportional-mode quota that gives a node
// owning owned of shardCount shards a per-node ceiling of exactly q (the
// largest such quota), or 0 if none does.
func proportionalTwin(q, owned, shardCount int) int {
	for qp := q*shardCount/owned + 1; qp >= q; qp-- {
		if (qp*owned+shardCount-1)/shardCount == q {
			return qp
		}
	}
	return 0
}

// TestExactQuota checks the exact cluster-wide quota on 5 nodes: quotas
// 1, 3, 7 and 64 with 400 rows each appended through different nodes, and a
// namespace whose 400 rows all sit on one node's shards (quota 7: it must
// get the whole quota there, not q/N). The target never sees more than the
// quota of a namespace at once.
//
// What is asserted is counts: the target never sees more than a
// namespace's quota at once, and every row is delivered. Drain times are
// logged beside each namespace's twin in proportional mode (its rows all
// on one node with a per-node ceiling of exactly q: the same concurrency
// with no lease) and against the ideal, rows/q × hold; docs/BENCHMARKS.md
// records the ratios (a wall-clock figure on a shared machine is a
// benchmark, not a test).
func TestExactQuota(t *testing.T) {
	c := newCluster(t, clusterOpts{TargetDelay: quotaHold, Shards: quotaShards, PlainBuild: true}) // drain-time ratios
	for i := range 5 {
		c.startNode(fmt.Sprintf("xq-%d", i))
	}
	c.waitConverged(30 * time.Second)
	ms := c.members()
	table, err := c.shardTable(ms[0])
	if err != nil {
		t.Fatal(err)
	}
	owned := map[string]int{}
	for _, o := range table {
		owned[o]++
	}
	type spec struct {
		ns   string
		q    int
		skew bool // every row on one node's shards
		twin string
		home *proc // the node holding the twin's (and a skewed namespace's) rows
	}
	specs := []spec{
		{ns: "xq-q1", q: 1, home: ms[0]}, {ns: "xq-q3", q: 3, home: ms[1]}, {ns: "xq-q7", q: 7, home: ms[2]},
		{ns: "xq-q64", q: 64, home: ms[3]}, {ns: "xq-skew", q: 7, skew: true, home: ms[4]},
	}
	var exact []string
	for i := range specs {
		s := &specs[i]
		s.twin = s.ns + "-twin"
		c.setNamespace(s.ns, map[string]any{"max_in_flight": s.q})
		qp := proportionalTwin(s.q, owned[s.home.name], quotaShards)
		if qp == 0 {
			t.Fatalf("no proportional quota gives %s (%d shards) a ceiling of %d", s.home.name, owned[s.home.name], s.q)
		}
		c.setMode(s.twin, map[string]any{"max_in_flight": qp, "mode": "proportional"})
		exact = append(exact, s.ns)
	}
	c.waitLearned(exact...)

	const rows = 400
	drains := map[string]*drain{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for i, s := range specs {
		on := func(home *proc) func(string) bool { return func(o string) bool { return o == home.name } }
		keys := keysOn(s.ns, rows, table, func(string) bool { return true })
		if s.skew {
			keys = keysOn(s.ns, rows, table, on(s.home))
		}
		twinKeys := keysOn(s.twin, rows, table, on(s.home))
		via := []*proc{ms[i%5], ms[(i+1)%5], ms[(i+2)%5], ms[(i+3)%5]}
		for _, a := range []struct {
			ns   string
			keys []string
		}{{s.ns, keys}, {s.twin, twinKeys}} {
			wg.Go(func() {
				c.appendKeysVia(via, a.ns, a.keys)
				mu.Lock()
				drains[a.ns] = &drain{ns: a.ns, rows: rows, start: time.Now()}
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	var all []*drain
	for _, d := range drains {
		all = append(all, d)
	}
	c.watchDrains(120*time.Second, all...)

	for _, s := range specs {
		d, tw := drains[s.ns], drains[s.twin]
		ideal := time.Duration(float64(rows) / float64(s.q) * float64(quotaHold))
		took, twinTook := d.done.Sub(d.start), tw.done.Sub(tw.start)
		t.Logf("%-8s q=%-3d max in flight %3d, drained in %v = %.2f × ideal %v, %.2f × its proportional twin's %v (twin max in flight %d; longest gap %v)",
			s.ns, s.q, d.maxInFly, took.Round(time.Millisecond), took.Seconds()/ideal.Seconds(), ideal,
			took.Seconds()/twinTook.Seconds(), twinTook.Round(time.Millisecond), tw.maxInFly, d.maxGap.Round(time.Millisecond))
		if d.maxInFly > s.q {
			t.Errorf("%s: the target saw %d rows at once, above the quota %d", s.ns, d.maxInFly, s.q)
		}
	}
}

// TestExactQuotaCoordinatorChanges checks the exact quota across
// coordinator changes on 5 nodes: a namespace with quota 5 runs while its
// coordinator is killed (SIGKILL), then while the next coordinator leaves
// gracefully (SIGTERM), then while a node joins that takes over the
// coordinator shard of a second namespace. The target never sees more than
// 5 rows of a namespace at once, every row is delivered, and new demand
// after each event gets a delivery; the longest pause in deliveries of
// each phase and the wait of the new demand are logged (they are of the
// order of lease length + failure detection, 2 s + 2 s here: benchmark
// figures). The rows avoid the shards of the node that goes away (no
// replication: rows on a killed node wait for its return), so what is
// measured is the lease's stall alone.
func TestExactQuotaCoordinatorChanges(t *testing.T) {
	c := newCluster(t, clusterOpts{TargetDelay: quotaHold, Shards: quotaShards})
	for i := range 5 {
		c.startNode(fmt.Sprintf("xc-%d", i))
	}
	c.waitConverged(30 * time.Second)
	const q, rows = 5, 400 // 4 s of work at the quota
	const ns = "xc-failover"
	c.setNamespace(ns, map[string]any{"max_in_flight": q})

	// phase runs ns's rows through event. When the coordinator goes away
	// (gone), it also measures new demand: right after the event, rows of
	// a namespace that coordinator coordinated and that no node had rows
	// of yet; their first delivery waits for the successor to see the
	// change (failure detection, or the leave's gossip) and learn for a
	// lease (DECISIONS.md "Expected stall per failover case").
	phase := func(name, ns string, gone bool, event func(coordinator *proc) string) {
		t.Helper()
		c.waitLearned(ns)
		v, err := c.leaseView(c.members()[0], ns)
		if err != nil {
			t.Fatal(err)
		}
		var coord *proc
		for _, p := range c.members() {
			if p.name == v.Lease.Coordinator {
				coord = p
			}
		}
		if coord == nil {
			t.Fatalf("%s: coordinator %q of %s is not a member", name, v.Lease.Coordinator, ns)
		}
		table, err := c.shardTable(c.members()[0])
		if err != nil {
			t.Fatal(err)
		}
		keys := keysOn(ns+"-"+name, rows, table, func(o string) bool { return o != coord.name })
		var via []*proc
		for _, p := range c.members() {
			if p != coord {
				via = append(via, p)
			}
		}
		fresh := ""
		if gone {
			for i := 0; fresh == ""; i++ {
				if cand := fmt.Sprintf("xc-fresh-%s-%d", name, i); table[shards.ShardOf(cand, quotaShards)] == coord.name {
					fresh = cand
				}
			}
			c.setNamespace(fresh, map[string]any{"max_in_flight": q})
		}
		recv := c.resetReceiver()
		d := &drain{ns: ns, rows: rows, start: time.Now()}
		c.appendKeysVia(via, ns, keys)
		poll.Eventually(t, deadline(20*time.Second), "a quarter of the rows to be delivered", func() (bool, string) {
			for _, r := range recv.Namespaces() {
				if r.Namespace == ns && r.Delivered >= rows/4 {
					return true, ""
				}
			}
			return false, "not yet"
		})
		at := time.Now()
		what := event(coord)
		if gone {
			c.appendKeysVia(via, fresh, keysOn(fresh, 20, table, func(o string) bool { return o != coord.name }))
			poll.Eventually(t, deadline(30*time.Second), "the first row of "+fresh, func() (bool, string) {
				for _, r := range recv.Namespaces() {
					if r.Namespace == fresh && r.Delivered > 0 {
						return true, ""
					}
				}
				return false, "none delivered"
			})
			waited := time.Since(at)
			t.Logf("%s: new demand for %s (coordinated by %s) got its first delivery %v after the event", name, fresh, coord.name, waited.Round(time.Millisecond))
		}
		c.watchDrains(60*time.Second, d)
		t.Logf("%s (%s at +%v): max in flight %d, longest pause in deliveries %v (ended %v after the event), all %d rows in %v",
			name, what, at.Sub(d.start).Round(time.Millisecond), d.maxInFly, d.maxGap.Round(time.Millisecond),
			d.gapAt.Sub(at).Round(time.Millisecond), rows, d.done.Sub(d.start).Round(time.Millisecond))
		if d.maxInFly > q {
			t.Errorf("%s: the target saw %d rows of %s at once, above the quota %d", name, d.maxInFly, ns, q)
		}
	}

	phase("kill", ns, true, func(coord *proc) string {
		coord.kill()
		return "SIGKILL of coordinator " + coord.name
	})
	c.waitConverged(30 * time.Second)

	phase("leave", ns, true, func(coord *proc) string {
		if code := coord.stop(t, 30*time.Second); code != 0 {
			t.Errorf("graceful stop of %s exited %d", coord.name, code)
		}
		return "graceful leave of coordinator " + coord.name
	})
	c.waitConverged(30 * time.Second)

	// The join: a namespace whose coordinator shard the new node takes.
	var names []string
	for _, p := range c.members() {
		names = append(names, p.name)
	}
	after := shards.Assign(append(names, "xc-new"), quotaShards)
	joinNS := ""
	for i := 0; joinNS == ""; i++ {
		if cand := fmt.Sprintf("xc-join-%d", i); after.Owner(shards.ShardOf(cand, quotaShards)) == "xc-new" {
			joinNS = cand
		}
	}
	c.setNamespace(joinNS, map[string]any{"max_in_flight": q})
	phase("join", joinNS, false, func(*proc) string {
		c.startNode("xc-new")
		return "join of xc-new, the new coordinator of " + joinNS
	})
	v, err := c.leaseView(c.members()[0], joinNS)
	if err != nil || v.Lease == nil || v.Lease.Coordinator != "xc-new" {
		t.Errorf("after the join, %s's coordinator is %+v (%v), want xc-new", joinNS, v.Lease, err)
	}
	var changes float64
	for _, p := range c.members() {
		changes += c.mustMetric(p, "fairshard_lease_coordinator_changes_total", nil)
	}
	if changes == 0 {
		t.Error("fairshard_lease_coordinator_changes_total stayed 0 through three coordinator changes")
	}
}

// TestExactQuotaLeaseTraffic bounds lease traffic: 1,000 namespaces with a
// quota of 2 on 3 nodes, every one with demand on every node for about 3 s
// (6 rows, the target holding each 1 s). While they run, lease traffic
// stays below one call per node pair per refresh interval (the calls are
// batched per coordinator node, whatever the number of namespaces); every
// row is delivered with no namespace above its quota. The mean sweep time
// is logged beside the calls (docs/BENCHMARKS.md).
func TestExactQuotaLeaseTraffic(t *testing.T) {
	if slowdown > 1 {
		// Measured: with race-built nodes on the shared 2 cores the 1,000
		// namespaces' 2,000 concurrent deliveries and /metrics pages of
		// 1,000 namespaces' series took over 9 minutes and hit the suite's
		// 20-minute timeout. The plain build runs it (go test ./test/e2e).
		t.Skip("1,000 namespaces with race-built nodes exceed the suite's time budget on 2 cores; run without -race")
	}
	c := newCluster(t, clusterOpts{TargetDelay: time.Second, Shards: quotaShards, DefaultMaxInFlight: 2,
		// 2,000 rows may be at the target at once: no connection queue.
		// A refresh of 1,000 namespaces by a race-built node on busy cores
		// can take seconds: the lease scales with the build (the last
		// --lease-length given wins).
		Flags: []string{"--max-conns-per-host", "2048", "--lease-length", (quotaLeaseLen * slowdown).String()}})
	for i := range 3 {
		c.startNode(fmt.Sprintf("xt-%d", i))
	}
	c.waitConverged(30 * time.Second)
	const namespaces, perNS = 1000, 6
	ms := c.members()
	table, err := c.shardTable(ms[0])
	if err != nil {
		t.Fatal(err)
	}
	// Every namespace's 6 rows: 2 on each node's shards, 300 rows (50
	// namespaces) per request, through the nodes in turn.
	var rows []map[string]any
	for i := range namespaces {
		ns := fmt.Sprintf("xt-%04d", i)
		for _, p := range ms {
			for _, k := range keysOn(ns+"-"+p.name, 2, table, func(o string) bool { return o == p.name }) {
				rows = append(rows, map[string]any{"dispatch_key": k, "namespace": ns, "task_queue": "q"})
			}
		}
	}
	for b := 0; len(rows) > 0; b++ {
		n := min(len(rows), 300)
		p := ms[b%len(ms)]
		code, body, err := c.do(http.MethodPost, p.baseURL()+"/v1/rows", map[string]any{"rows": rows[:n]}, nil)
		if err != nil || code != http.StatusOK {
			t.Fatalf("append %d rows through %s: HTTP %d %s: %v", n, p.name, code, body, err)
		}
		rows = rows[n:]
	}
	type sample struct{ calls, errors, sweeps, sweepSum float64 }
	// /metrics lists every namespace's series (1,000 of them here): read it
	// with a longer timeout than the API calls' 30 s, for race-built nodes
	// on busy cores.
	slow := &http.Client{Timeout: deadline(2 * time.Minute)}
	page := func(p *proc) string {
		t.Helper()
		resp, err := slow.Get(p.baseURL() + "/metrics")
		if err != nil {
			t.Fatalf("GET /metrics on %s: %v", p.name, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /metrics on %s: HTTP %d: %v", p.name, resp.StatusCode, err)
		}
		return string(b)
	}
	read := func() map[string]sample {
		out := map[string]sample{}
		for _, p := range ms {
			text := page(p) // one page per node per sample
			out[p.name] = sample{
				calls:    sumMetric(text, "fairshard_lease_calls_total", nil),
				errors:   sumMetric(text, "fairshard_lease_call_errors_total", nil),
				sweeps:   sumMetric(text, "fairshard_sweep_duration_seconds_count", nil),
				sweepSum: sumMetric(text, "fairshard_sweep_duration_seconds_sum", nil),
			}
		}
		return out
	}
	// The window: from the end of the appends (every namespace has been
	// asked for once) while at least half the rows are still to deliver.
	before, t0 := read(), time.Now()
	poll.Eventually(t, deadline(60*time.Second), "half the rows to be delivered", func() (bool, string) {
		n := c.receiver().Delivered()
		return n >= namespaces*perNS/2, fmt.Sprintf("%d of %d", n, namespaces*perNS)
	})
	after, window := read(), time.Since(t0)
	refresh := 100 * time.Millisecond
	limit := float64(len(ms)) * (window.Seconds()/refresh.Seconds() + 1)
	for _, p := range ms {
		a, b := after[p.name], before[p.name]
		n := a.calls - b.calls
		mean := 0.0
		if a.sweeps > b.sweeps {
			mean = (a.sweepSum - b.sweepSum) / (a.sweeps - b.sweeps)
		}
		t.Logf("%s: %.0f lease calls (%.0f failed) in %v (limit %.0f: %d coordinators × one per %v), %.0f sweeps, mean sweep %.2f ms",
			p.name, n, a.errors-b.errors, window.Round(time.Millisecond), limit, len(ms), refresh, a.sweeps-b.sweeps, mean*1000)
		if n > limit {
			t.Errorf("%s made %.0f lease calls in %v, above one per coordinator node per refresh (%.0f)", p.name, n, window, limit)
		}
	}
	poll.Eventually(t, deadline(60*time.Second), "every row to be delivered", func() (bool, string) {
		n := c.receiver().Distinct()
		return n >= namespaces*perNS, fmt.Sprintf("%d of %d", n, namespaces*perNS)
	})
	for _, r := range c.receiver().Namespaces() {
		if r.MaxInFlight > 2 {
			t.Errorf("%s: %d at once at the target, above its quota 2", r.Namespace, r.MaxInFlight)
		}
	}
}

// TestExactQuotaThroughput runs exact and proportional mode side by side
// in one run (exact's end-to-end throughput should be at least 0.9×
// proportional's): 3 nodes, two namespaces with quota 48 (exact, and
// proportional: ceil(48/3) = 16 per node, 48 in all), 4,000 rows each
// appended at once through every node, the target holding each 20 ms.
// Each namespace's rows/s from its first to its last delivery is logged
// with the ratio (a benchmark figure); the test asserts at least half.
func TestExactQuotaThroughput(t *testing.T) {
	c := newCluster(t, clusterOpts{TargetDelay: 20 * time.Millisecond, Shards: quotaShards, PlainBuild: true}) // a throughput ratio
	for i := range 3 {
		c.startNode(fmt.Sprintf("xr-%d", i))
	}
	c.waitConverged(30 * time.Second)
	const q, rows = 48, 4000
	c.setNamespace("xr-exact", map[string]any{"max_in_flight": q})
	c.setMode("xr-prop", map[string]any{"max_in_flight": q, "mode": "proportional"})
	c.waitLearned("xr-exact")
	ms := c.members()
	table, err := c.shardTable(ms[0])
	if err != nil {
		t.Fatal(err)
	}
	ds := map[string]*drain{}
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, ns := range []string{"xr-exact", "xr-prop"} {
		keys := keysOn(ns, rows, table, func(string) bool { return true })
		wg.Go(func() {
			c.appendKeysVia(ms, ns, keys)
			mu.Lock()
			ds[ns] = &drain{ns: ns, rows: rows, start: time.Now()}
			mu.Unlock()
		})
	}
	wg.Wait()
	c.watchDrains(120*time.Second, ds["xr-exact"], ds["xr-prop"])
	rate := func(d *drain) float64 { return float64(rows) / d.done.Sub(d.first).Seconds() }
	ex, pr := rate(ds["xr-exact"]), rate(ds["xr-prop"])
	t.Logf("quota %d, %d rows each: exact %.0f rows/s (max in flight %d), proportional %.0f rows/s (max in flight %d): ratio %.2f",
		q, rows, ex, ds["xr-exact"].maxInFly, pr, ds["xr-prop"].maxInFly, ex/pr)
	if ds["xr-exact"].maxInFly > q {
		t.Errorf("exact: %d at once at the target, above the quota %d", ds["xr-exact"].maxInFly, q)
	}
	// The ratio is a benchmark figure (0.9 and above, docs/BENCHMARKS.md);
	// what is asserted is a margin noise cannot reach: a lease protocol that
	// lost capacity between nodes would deliver a fraction of
	// proportional's rate.
	if ex < 0.5*pr {
		t.Errorf("exact mode delivered %.0f rows/s, below half of proportional's %.0f in the same run", ex, pr)
	}
}
