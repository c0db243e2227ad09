package node_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/node"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// openStore opens a stopped node's data file for inspection; it is closed
// at cleanup.
func openStore(t *testing.T, dataDir string) *boltstore.Store {
	t.Helper()
	s, err := boltstore.Open(filepath.Join(dataDir, node.DataFileName), boltstore.Options{ShardCount: 1024})
	if err != nil {
		t.Fatalf("reopen the store of a stopped node: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// TestShutdownDrainsInFlight: while a graceful stop waits for an in-flight
// delivery, /readyz answers 503 and appends are refused with 503; the
// delivery finishes and is recorded; afterwards the API is gone.
func TestShutdownDrainsInFlight(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	tg := newTarget(t)
	tg.SetDelay(time.Second)
	n.setTarget("drain", "default", tg.URL())
	n.appendRows(rowIn{"dispatch_key": "drain-1", "namespace": "drain"})
	poll.Eventually(t, 5*time.Second, "drain-1 to be claimed", func() (bool, string) { return n.namespace("drain").Claimed == 1, "" })

	done := make(chan error, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- n.Shutdown(ctx)
	}()
	poll.Eventually(t, 2*time.Second, "/readyz to answer 503 while draining", func() (bool, string) {
		st, _ := n.do("GET", "/readyz", nil)
		return st == http.StatusServiceUnavailable, ""
	})
	st, b := n.do("GET", "/readyz", nil)
	if st == http.StatusServiceUnavailable {
		wantError(t, st, b, http.StatusServiceUnavailable, api.CodeUnavailable, "")
	}
	st, b = n.do("POST", "/v1/rows", map[string]any{"rows": []rowIn{{"dispatch_key": "drain-2"}}})
	if st == http.StatusServiceUnavailable {
		wantError(t, st, b, http.StatusServiceUnavailable, api.CodeUnavailable, "")
	} else {
		t.Errorf("append while draining: status %d, want 503: %s", st, b)
	}
	// Shutdown's context (10 s) bounds the stop: past it Shutdown fails.
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	t.Logf("Shutdown of a lone node with a 1 s delivery in flight took %v", time.Since(start).Round(time.Millisecond))
	if tg.Count("drain-1") != 1 {
		t.Errorf("drain-1 delivered %d times, want 1 (the in-flight delivery finishes)", tg.Count("drain-1"))
	}
	if _, err := net.DialTimeout("tcp", n.ListenAddr(), time.Second); err == nil {
		t.Error("the API still accepts connections after Shutdown")
	}
	s := openStore(t, n.cfg.DataDir)
	row, err := s.Get(context.Background(), "drain-1")
	if err != nil || row.Status != outbox.StatusDone {
		t.Errorf("drain-1 on disk after Shutdown: %v, status %s; want done", err, row.Status)
	}
	if _, err := s.Get(context.Background(), "drain-2"); !errors.Is(err, outbox.ErrNotFound) {
		t.Errorf("drain-2 (refused while draining) on disk: %v, want not found", err)
	}
}

// TestShutdownLoneNodeKeepsRows: the last node of a cluster has nobody to
// hand its rows to; a graceful stop must not wait out the grace for that,
// and the rows stay on disk for the next start.
func TestShutdownLoneNodeKeepsRows(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	var rows []rowIn
	for i := range 20 {
		rows = append(rows, rowIn{"workflow_id": "lone", "ordinal": i, "namespace": "lone"})
	}
	n.appendRows(rows...)
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := n.Shutdown(ctx); err != nil {
		t.Errorf("Shutdown of a lone node with pending rows: %v", err)
	}
	t.Logf("Shutdown of a lone node with pending rows took %v", time.Since(start).Round(time.Millisecond))
	// Nobody can take the rows: the node says so and stops, instead of
	// waiting for a hand-off until its grace ends.
	logs := n.logs.String()
	if !strings.Contains(logs, "they stay on disk") || strings.Contains(logs, "leave incomplete after --shutdown-grace") {
		t.Errorf("the lone node's stop did not say its rows stay on disk, or waited out its grace:\n%s", logs)
	}
	// Restarted on the same dir, it owns every shard again and holds them.
	cfg := n.cfg
	cfg.HTTPAddr, cfg.GossipAddr = hostZero(n.ListenAddr()), hostZero(n.GossipAddr())
	again := startConfig(t, cfg)
	if v := again.namespace("lone"); v.Pending != 20 {
		t.Errorf("after restart: %d pending rows, want 20", v.Pending)
	}
}

// hostZero turns host:port into host:0.
func hostZero(addr string) string {
	h, _, _ := net.SplitHostPort(addr)
	return net.JoinHostPort(h, "0")
}

// TestRestartKeepsConfigAndRearmsClaims: a hard Close abandons an
// in-flight delivery; the restarted node (same name and data dir) still
// has the gossiped config it persisted, re-arms the claim and delivers.
func TestRestartKeepsConfigAndRearmsClaims(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	tg := newTarget(t)
	tg.SetDelay(3 * time.Second)
	n.setTarget("crash", "default", tg.URL())
	n.mustDo("PUT", "/v1/namespaces/crash", map[string]any{"max_in_flight": 3}, http.StatusOK, nil)
	n.appendRows(rowIn{"dispatch_key": "crash-1", "namespace": "crash"})
	poll.Eventually(t, 5*time.Second, "crash-1 to be claimed", func() (bool, string) { return n.namespace("crash").Claimed == 1, "" })
	if err := n.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	tg.SetDelay(0)

	cfg := n.cfg
	cfg.HTTPAddr, cfg.GossipAddr = hostZero(n.ListenAddr()), hostZero(n.GossipAddr())
	again := startConfig(t, cfg)
	if v := again.namespace("crash"); v.MaxInFlight != 3 || v.MaxInFlightDefault {
		t.Errorf("after restart namespace crash = %+v, want the persisted max_in_flight 3", v)
	}
	again.waitStatus("crash-1", "done", 10*time.Second)
}

// TestNewRefusesBadStarts: New fails with a message naming the cause and
// leaves nothing held (lock, ports) behind.
func TestNewRefusesBadStarts(t *testing.T) {
	t.Parallel()
	running := startNode(t, nil)

	newErr := func(mutate func(*node.Config)) error {
		t.Helper()
		cfg := testConfig(t)
		mutate(&cfg)
		n, err := node.New(cfg, nil)
		if err == nil {
			_ = n.Close()
			t.Fatalf("New(%+v) succeeded", cfg)
		}
		return err
	}
	for _, c := range []struct {
		name   string
		mutate func(*node.Config)
		want   string
	}{
		{"zero shards", func(c *node.Config) { c.Shards = 0 }, "--shards"},
		{"bad log level", func(c *node.Config) { c.LogLevel = "loud" }, "--log-level"},
		{"visibility below delivery timeout", func(c *node.Config) { c.Dispatch.VisibilityTimeout = time.Second }, "--visibility-timeout"},
		{"advertise gossip not an IP", func(c *node.Config) { c.AdvertiseGossip = "example.com:7946" }, "--advertise-gossip"},
		{"bad default target", func(c *node.Config) { c.DefaultTarget = "ftp://x" }, "--default-target"},
		{"locked data dir", func(c *node.Config) { c.DataDir = running.cfg.DataDir }, "in use by another process"},
		{"http port in use", func(c *node.Config) { c.HTTPAddr = running.ListenAddr() }, "--http-addr"},
		{"gossip port in use", func(c *node.Config) { c.GossipAddr = running.GossipAddr() }, "cluster"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if err := newErr(c.mutate); !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not mention %q", err, c.want)
			}
		})
	}

	// A failed New releases the data dir: the same dir opens right after.
	dir := t.TempDir()
	newErr(func(c *node.Config) { c.DataDir, c.HTTPAddr = dir, running.ListenAddr() })
	newErr(func(c *node.Config) { c.DataDir, c.GossipAddr = dir, running.GossipAddr() })
	ok := startNode(t, func(c *node.Config) { c.DataDir = dir })
	if err := ok.Close(); err != nil {
		t.Fatal(err)
	}

	// The shard count is fixed per data file.
	err := newErr(func(c *node.Config) { c.DataDir, c.Shards = dir, 16 })
	if !strings.Contains(err.Error(), "--shards") {
		t.Errorf("shard count mismatch: %q does not mention --shards", err)
	}

	// A corrupt file is reported as such, not as a panic.
	bad := t.TempDir()
	if err := os.WriteFile(filepath.Join(bad, node.DataFileName), []byte(strings.Repeat("not a bbolt file ", 1000)), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := newErr(func(c *node.Config) { c.DataDir = bad }); !strings.Contains(err.Error(), "corrupt") {
		t.Errorf("corrupt data file: %q does not say corrupt", err)
	}

	// Close without Start is fine and idempotent.
	cfg := testConfig(t)
	n, err := node.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Close(); err != nil {
		t.Errorf("Close without Start: %v", err)
	}
	if err := n.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestShutdownAnnouncesLeavingBeforeDraining: a node stopping gracefully
// while slow deliveries are in flight announces that it is leaving first,
// so its shards are owned and claimed by the other node after a gossip
// round, not after the drain. Under load (appends and deliveries keep
// flowing through the other node), b holds deliveries that take drainDelay,
// then stops. The timeline is measured from the Shutdown call (what SIGTERM
// does): when a first stores a row of one of b's shards itself (it owns the
// shard: routing and claim scope read the same applied view) and when that
// row is delivered, i.e. was claimed on a. Both must come well before the
// drain could end; before the fix they came after it.
func TestShutdownAnnouncesLeavingBeforeDraining(t *testing.T) {
	t.Parallel()
	const drainDelay = 4 * time.Second
	nodes := startCluster(t, 2, nil)
	a, b := nodes[0], nodes[1]
	table := waitConverged(t, nodes)
	slow, probe, bg := newTarget(t), newTarget(t), newTarget(t)
	slow.SetDelay(drainDelay)
	a.setTarget("slow", "default", slow.URL())
	a.setTarget("probe", "default", probe.URL())
	a.setTarget("bg", "default", bg.URL())

	// Keys of b's shards: slow rows and probe rows.
	var bKeys []string
	for i := 0; len(bKeys) < 400; i++ {
		if k := fmt.Sprintf("b-%d", i); table[shards.ShardOf(k, 1024)] == b.Name() {
			bKeys = append(bKeys, k)
		}
	}
	// Probes avoid the slow rows' shards: a new primary claims from a
	// shard only once the old one settled its in-flight rows of it
	// (replication's handover), so those shards wait for the slow rows.
	slowKeys := bKeys[:4]
	slowShard := map[uint32]bool{}
	for _, k := range slowKeys {
		slowShard[shards.ShardOf(k, 1024)] = true
	}
	var probeKeys []string
	for _, k := range bKeys[4:] {
		if !slowShard[shards.ShardOf(k, 1024)] {
			probeKeys = append(probeKeys, k)
		}
	}

	// Load: rows of every shard through a, delivered at once, until the
	// test ends.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(stop); wg.Wait() }()
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(50 * time.Millisecond):
			}
			var rows []rowIn
			for j := range 10 {
				rows = append(rows, rowIn{"dispatch_key": fmt.Sprintf("bg-%d-%d", i, j), "namespace": "bg"})
			}
			_, _, _ = tryRequest("POST", a.base+"/v1/rows", map[string]any{"rows": rows})
		}
	})
	poll.Eventually(t, 10*time.Second, "background deliveries to flow", func() (bool, string) { return bg.Distinct() > 100, "" })
	var rows []rowIn
	for _, k := range slowKeys {
		rows = append(rows, rowIn{"dispatch_key": k, "namespace": "slow"})
	}
	a.appendRows(rows...)
	poll.Eventually(t, 10*time.Second, fmt.Sprintf("%s to have its %d slow deliveries in flight", b.Name(), len(slowKeys)), func() (bool, string) { return b.namespace("slow").Claimed == len(slowKeys), "" })

	start := time.Now()
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		done <- b.Shutdown(ctx)
	}()
	// Every 20 ms a probe row of one of b's shards is appended through a;
	// the first one a keeps (answer "node": a) marks the takeover.
	var owned time.Duration
	var probeKey string
	for i := 0; probeKey == ""; i++ {
		if i == len(probeKeys) {
			t.Fatalf("a never stored a row of %s's shards itself during the stop", b.Name())
		}
		st, body, err := tryRequest("POST", a.base+"/v1/rows", map[string]any{"rows": []rowIn{{"dispatch_key": probeKeys[i], "namespace": "probe"}}})
		if err != nil || st != http.StatusOK {
			t.Fatalf("probe append through %s: %d %s %v", a.Name(), st, body, err)
		}
		var out appendOut
		mustUnmarshal(t, body, &out)
		if out.Rows[0].Node == a.Name() {
			owned, probeKey = time.Since(start), probeKeys[i]
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	poll.Eventually(t, 10*time.Second, fmt.Sprintf("probe row %s to be delivered by %s", probeKey, a.Name()), func() (bool, string) { return probe.Count(probeKey) > 0, "" })
	claimed := time.Since(start)
	err := <-done
	stopped := time.Since(start)
	t.Logf("SIGTERM → %s owns %s's shards: %v; → it delivered a row of one: %v; %s's Shutdown took %v (its in-flight deliveries take %v)",
		a.Name(), b.Name(), owned.Round(time.Millisecond), claimed.Round(time.Millisecond), b.Name(), stopped.Round(time.Millisecond), drainDelay)
	if err != nil {
		t.Fatalf("Shutdown of %s: %v", b.Name(), err)
	}
	// The drain really happened: b waited for its slow deliveries.
	if stopped < drainDelay/2 {
		t.Errorf("Shutdown took %v: %s did not wait for its in-flight deliveries (%v each)", stopped, b.Name(), drainDelay)
	}
	for _, k := range slowKeys {
		if c := slow.Count(k); c != 1 {
			t.Errorf("in-flight row %s delivered %d times, want 1 (the drain lets it finish)", k, c)
		}
	}
	// Claimed elsewhere after a gossip round or a few, not after the drain
	// (which ended drainDelay/2 or more after the stop began).
	if claimed >= drainDelay/2 {
		t.Errorf("a row of %s's shards was first claimed on %s %v after the stop began; want well under the drain (%v): the node must announce leaving before it drains",
			b.Name(), a.Name(), claimed, drainDelay)
	}
}
