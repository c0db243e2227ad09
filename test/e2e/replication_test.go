package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/client"
	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/loadgen"
)

// Replicated shards: real processes, real bbolt files, real kills and wiped
// data dirs.

// replicationView is GET /v1/cluster's "replication" object, decoded as
// the Go client does.
type replicationView = client.Replication

func (c *testCluster) replication(p *proc) (replicationView, error) {
	var v struct {
		Replication replicationView `json:"replication"`
	}
	code, body, err := c.do(http.MethodGet, p.baseURL()+"/v1/cluster", nil, &v)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET /v1/cluster on %s: HTTP %d %s", p.name, code, body)
	}
	return v.Replication, err
}

// shardView is GET /v1/shards/{n}, decoded as the Go client does.
type shardView = client.ShardReplicas

func (c *testCluster) shard(p *proc, n uint32) (shardView, error) {
	var v shardView
	code, body, err := c.do(http.MethodGet, p.baseURL()+"/v1/shards/"+strconv.Itoa(int(n)), nil, &v)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET /v1/shards/%d on %s: HTTP %d %s", n, p.name, code, body)
	}
	return v, err
}

// waitReplicated waits until every running member reports no shard it
// replicates still syncing and no under-replicated primary shard, and
// every shard's replicas (as the first member sees them) agree: copies
// replicas each, synced, same digest. It returns the total of the rows
// the replicas hold (each copy counted) and how long the wait took.
func (c *testCluster) waitReplicated(copies int, timeout time.Duration) (int64, time.Duration) {
	c.t.Helper()
	start := time.Now()
	var held int64
	poll.Eventually(c.t, deadline(timeout), "every replica set synced and agreeing", func() (bool, string) {
		for _, p := range c.members() {
			v, err := c.replication(p)
			if err != nil {
				return false, err.Error()
			}
			if v.SyncingShards != 0 || v.UnderReplicatedShards != 0 || v.Copies != copies {
				return false, fmt.Sprintf("%s: %+v", p.name, v)
			}
		}
		held = 0
		p := c.members()[0]
		for s := range c.opts.Shards {
			v, err := c.shard(p, s)
			if err != nil {
				return false, err.Error()
			}
			if !v.InSync || len(v.Replicas) != copies {
				return false, fmt.Sprintf("shard %d: %+v", s, v)
			}
			for _, r := range v.Replicas {
				held += r.Rows
			}
		}
		return true, ""
	})
	return held, time.Since(start)
}

// appendKeys appends rows with the given keys to p (namespace ns) and
// returns the status code, the Retry-After header and the rows' answers.
func (c *testCluster) appendKeys(p *proc, ns string, keys []string) (int, string, []appendAnswer) {
	c.t.Helper()
	var rows []map[string]any
	for _, k := range keys {
		rows = append(rows, map[string]any{"dispatch_key": k, "namespace": ns, "payload": map[string]string{"k": k}})
	}
	var out struct {
		Rows []appendAnswer `json:"rows"`
	}
	req, _ := http.NewRequest(http.MethodPost, p.baseURL()+"/v1/rows", strings.NewReader(mustJSON(map[string]any{"rows": rows})))
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.client.Do(req)
	if err != nil {
		c.t.Fatalf("append to %s: %v", p.name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		if err := jsonDecode(resp.Body, &out); err != nil {
			c.t.Fatal(err)
		}
	}
	return resp.StatusCode, resp.Header.Get("Retry-After"), out.Rows
}

type appendAnswer struct {
	DispatchKey string `json:"dispatch_key"`
	Status      string `json:"status"`
	Node        string `json:"node"`
	Copies      int    `json:"copies"`
}

// replicatedLoad appends rows to the cluster (namespace ns, at most the
// quota in flight at the target) and checks every answer reports at least
// minCopies copies.
func replicatedLoad(t *testing.T, c *testCluster, l *ledger, ns string, rows, minCopies int) {
	t.Helper()
	gen := c.generator(nil, loadgen.Config{
		Rows: rows, BatchSize: 100, Concurrency: 4, KeyPrefix: ns + "-",
		Namespaces: []loadgen.Namespace{{Name: ns, Weight: 1, TaskQueues: 2}},
		OnAppended: l.onAppended, OnFailed: l.onFailed,
	})
	rep := runLoad(t, gen)
	if rep.Appended != int64(rows) || rep.GaveUp != 0 {
		t.Fatalf("appended %d of %d rows (%d given up, last error %s)", rep.Appended, rows, rep.GaveUp, gen.LastError())
	}
	// The generator reports statuses only; check the copies on a sample
	// through the API.
	keys := []string{ns + "-x1", ns + "-x2", ns + "-x3"}
	code, _, ans := c.appendKeys(c.members()[0], ns, keys)
	if code != http.StatusOK {
		t.Fatalf("append of %v: HTTP %d", keys, code)
	}
	for _, a := range ans {
		if a.Copies < minCopies {
			t.Fatalf("row %s acknowledged with %d copies, want ≥ %d", a.DispatchKey, a.Copies, minCopies)
		}
		l.onAppended(a.DispatchKey, ns, a.Status)
	}
}

// A lost disk with replicated shards: 3 nodes, R = 2; 5,000 rows appended
// and held pending by a small quota; one node is SIGKILLed and its data dir
// deleted. Every acknowledged row is delivered; duplicates are at most the
// rows in flight on the killed node plus the state changes it had not
// shipped yet (its settle lag).
func TestReplicationKillAndWipe(t *testing.T) {
	const rows = 5_000
	c := newCluster(t, clusterOpts{Shards: 256, TargetDelay: 20 * time.Millisecond,
		Flags: []string{"--replication-factor", "2"}})
	for i := range 3 {
		c.startNode(fmt.Sprintf("kw-%d", i))
	}
	c.waitConverged(20 * time.Second)
	c.waitReplicated(2, 30*time.Second)
	const quota = 6
	c.setNamespace("kw", map[string]any{"max_in_flight": quota})
	victim := c.members()[2]
	v, err := c.namespace(victim, "kw")
	if err != nil {
		t.Fatal(err)
	}
	if v.Mode != "exact" {
		t.Fatalf("kw is in %q mode; this bound is exact mode's", v.Mode)
	}
	l := newLedger()
	recv := c.receiver()
	replicatedLoad(t, c, l, "kw", rows, 2)
	delivered := recv.Delivered()
	if delivered > rows/2 {
		t.Fatalf("%d of %d rows delivered before the kill: the quota did not hold them", delivered, rows)
	}
	shipped := c.mustMetric(victim, "fairshard_replication_lag_seconds_count", nil)
	// In flight on the victim: at most its grant, which exact mode (the
	// default) keeps within the quota; settle lag: its settles not yet on
	// a backup at the kill.
	lag := c.killCountingSettleLag(victim, quota)
	if err := os.RemoveAll(victim.dataDir); err != nil {
		t.Fatal(err)
	}
	bound := quota + lag.bound()
	t.Logf("SIGKILL %s and wiped its data dir with %d of %d rows delivered (%v state changes shipped before; %s)",
		victim.name, delivered, l.len(), shipped, lag)
	c.waitMembers(2, 20*time.Second)
	took := c.waitDelivered(l, recv, 3*time.Minute)
	dups := checkNoStrays(t, l, recv)
	extra := 0
	for _, n := range dups {
		extra += n - 1
	}
	t.Logf("kill and wipe: every one of %d acknowledged rows delivered %v after the kill; %d extra deliveries (bound %d)",
		l.len(), took.Round(time.Millisecond), extra, bound)
	if extra > bound {
		t.Errorf("%d extra deliveries, bound %d", extra, bound)
	}
	c.waitSettled(time.Minute, "kw")
}

// Scenario 2: 5 nodes, R = 3; two nodes are killed and wiped at once;
// nothing acknowledged is lost.
func TestReplicationTwoWipedAtOnce(t *testing.T) {
	const rows = 3_000
	c := newCluster(t, clusterOpts{Shards: 256, TargetDelay: 20 * time.Millisecond,
		Flags: []string{"--replication-factor", "3"}})
	for i := range 5 {
		c.startNode(fmt.Sprintf("r3-%d", i))
	}
	c.waitConverged(30 * time.Second)
	c.waitReplicated(3, 30*time.Second)
	c.setNamespace("r3", map[string]any{"max_in_flight": 10})
	l := newLedger()
	recv := c.receiver()
	replicatedLoad(t, c, l, "r3", rows, 2)
	ms := c.members()
	for _, p := range ms[3:] {
		p.kill()
	}
	for _, p := range ms[3:] {
		if err := os.RemoveAll(p.dataDir); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("killed and wiped %s and %s with %d of %d rows delivered", ms[3].name, ms[4].name, recv.Delivered(), l.len())
	c.waitMembers(3, 20*time.Second)
	took := c.waitDelivered(l, recv, 3*time.Minute)
	dups := checkNoStrays(t, l, recv)
	t.Logf("two nodes lost at once: all %d rows delivered %v later; %d keys delivered more than once", l.len(), took.Round(time.Millisecond), len(dups))
	c.waitSettled(time.Minute, "r3")
	c.waitReplicated(3, time.Minute)
}

// Scenario 3: append while a replica is down. With --write-copies 2 and
// one of two nodes dead, appends answer 503 with Retry-After and report
// nothing stored; once a replacement joined and synced, they succeed.
func TestReplicationAppendWhileReplicaDown(t *testing.T) {
	c := newCluster(t, clusterOpts{Shards: 64, Flags: []string{"--replication-factor", "2", "--write-copies", "2"}})
	a := c.startNode("down-a")
	b := c.startNode("down-b")
	c.waitConverged(20 * time.Second)
	c.waitReplicated(2, 30*time.Second)
	c.setNamespace("down", map[string]any{"paused": true})
	code, _, ans := c.appendKeys(a, "down", []string{"before-1", "before-2"})
	if code != http.StatusOK || ans[0].Copies != 2 {
		t.Fatalf("append with both replicas up: HTTP %d %+v", code, ans)
	}
	b.kill()
	c.waitMembers(1, 20*time.Second)
	var keys []string
	for i := range 50 {
		keys = append(keys, fmt.Sprintf("down-%d", i))
	}
	code, retryAfter, _ := c.appendKeys(a, "down", keys)
	if code != http.StatusServiceUnavailable || retryAfter == "" {
		t.Fatalf("append with one of two replicas left and write-copies 2: HTTP %d, Retry-After %q; want 503 with Retry-After", code, retryAfter)
	}
	rv, err := c.replication(a)
	if err != nil {
		t.Fatal(err)
	}
	if !rv.UnderReplicated || rv.Copies != 1 || rv.WriteCopies != 2 {
		t.Fatalf("survivor's replication state %+v; want under-replicated, 1 copy, write copies 2", rv)
	}
	// A replacement joins and syncs; then the same append succeeds.
	c.startNode("down-c")
	c.waitConverged(20 * time.Second)
	_, took := c.waitReplicated(2, time.Minute)
	t.Logf("replacement synced %v after it was ready", took.Round(time.Millisecond))
	code, _, ans = c.appendKeys(a, "down", keys)
	if code != http.StatusOK {
		t.Fatalf("append after the replacement synced: HTTP %d", code)
	}
	for _, x := range ans {
		if x.Copies != 2 {
			t.Fatalf("row %s: %d copies, want 2", x.DispatchKey, x.Copies)
		}
	}
}

// R = 1 → 2 on a running 3-node cluster with a backlog: every row ends on
// two nodes (each shard's two replicas agree), none is lost.
func TestReplicationRaiseFactor(t *testing.T) {
	const rows = 4_000
	c := newCluster(t, clusterOpts{Shards: 64, Flags: []string{"--replication-factor", "1"}})
	for i := range 3 {
		c.startNode(fmt.Sprintf("rf-%d", i))
	}
	c.waitConverged(20 * time.Second)
	c.setNamespace("rf", map[string]any{"paused": true})
	l := newLedger()
	replicatedLoad(t, c, l, "rf", rows, 1)
	held, _ := c.waitReplicated(1, 30*time.Second)
	if held != int64(l.len()) {
		t.Fatalf("R = 1: replicas hold %d rows, want %d", held, l.len())
	}
	code, body, err := c.do(http.MethodPut, c.members()[0].baseURL()+"/v1/cluster", map[string]any{"replication_factor": 2}, nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("PUT /v1/cluster: HTTP %d %s %v", code, body, err)
	}
	held, took := c.waitReplicated(2, 2*time.Minute)
	t.Logf("R 1 → 2 with %d pending rows: every replica set synced %v after the change", l.len(), took.Round(time.Millisecond))
	if held != 2*int64(l.len()) {
		t.Fatalf("R = 2: replicas hold %d copies, want %d", held, 2*l.len())
	}
	c.setNamespace("rf", map[string]any{"paused": false})
	c.waitDelivered(l, c.receiver(), time.Minute)
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

func jsonDecode(r io.Reader, v any) error { return json.NewDecoder(r).Decode(v) }
