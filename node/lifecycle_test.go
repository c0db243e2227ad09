package node_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/node"
	"github.com/fairshard/fairshard/outbox"
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
	eventually(t, 5*time.Second, func() bool { return n.namespace("drain").Claimed == 1 }, "drain-1 to be claimed")

	done := make(chan error, 1)
	start := time.Now()
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		done <- n.Shutdown(ctx)
	}()
	eventually(t, 2*time.Second, func() bool {
		st, _ := n.do("GET", "/readyz", nil)
		return st == http.StatusServiceUnavailable
	}, "/readyz to answer 503 while draining")
	st, b := n.do("GET", "/readyz", nil)
	if st == http.StatusServiceUnavailable {
		wantError(t, st, b, http.StatusServiceUnavailable, node.CodeUnavailable, "")
	}
	st, b = n.do("POST", "/v1/rows", map[string]any{"rows": []rowIn{{"dispatch_key": "drain-2"}}})
	if st == http.StatusServiceUnavailable {
		wantError(t, st, b, http.StatusServiceUnavailable, node.CodeUnavailable, "")
	} else {
		t.Errorf("append while draining: status %d, want 503: %s", st, b)
	}
	if err := <-done; err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if el := time.Since(start); el > 5*time.Second {
		t.Errorf("Shutdown of a lone node took %v", el)
	}
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
	if el := time.Since(start); el > 3*time.Second {
		t.Errorf("Shutdown of a lone node with pending rows took %v; nobody can take them, it should not wait", el)
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
	eventually(t, 5*time.Second, func() bool { return n.namespace("crash").Claimed == 1 }, "crash-1 to be claimed")
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
		{"visibility below delivery timeout", func(c *node.Config) { c.VisibilityTimeout = time.Second }, "--visibility-timeout"},
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
