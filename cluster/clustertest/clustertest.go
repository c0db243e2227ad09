// Package clustertest runs in-process fairshard clusters for tests: real
// memberlist nodes with cluster.FastConfig timing, each on its own loopback
// address (127.0.x.y) and a free port, with a persisted-config store per
// node so a restarted node keeps its entries.
//
// It is test support: production code must not import it.
//
//	h := clustertest.Start(t, 5)
//	snap := h.WaitConverged(5 * time.Second)
//	h.Kill(2)
//	h.WaitConverged(10 * time.Second)
//	h.Restart(2)
//
// A Harness is meant for one test goroutine; its nodes' Clusters are safe
// for concurrent use as usual. Every running node is shut down at cleanup;
// node logs are printed only when the test failed.
package clustertest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/kv"
	"github.com/fairshard/fairshard/shards"
	"github.com/prometheus/client_golang/prometheus"
)

// nextIP hands out loopback addresses 127.0.<a>.<b>, one per node, across
// every harness of the test binary.
var nextIP atomic.Uint32

// TakeIP returns a fresh loopback IP for a node.
func TakeIP() string {
	n := nextIP.Add(1)
	return fmt.Sprintf("127.0.%d.%d", 10+(n/250)%200, 1+n%250)
}

// Options tune Start.
type Options struct {
	// ShardCount of every node; 0 means cluster.DefaultShardCount.
	ShardCount uint32
	// Configure, if set, edits node i's config before New (called again
	// on every Restart of the node).
	Configure func(i int, cfg *cluster.Config)
	// LogLevel of the captured node logs; defaults to slog.LevelInfo.
	LogLevel slog.Level
}

// Harness is a set of in-process cluster nodes.
type Harness struct {
	t    testing.TB
	opts Options
	logs *logBuffer

	nodes []*Node
}

// Node is one node of a Harness. Cluster is nil while the node is down.
type Node struct {
	// Index is the node's position in the harness, from 0.
	Index int
	// Name is the node name, "node-<Index>".
	Name string
	// IP is the node's own loopback address.
	IP string
	// Port is the gossip port; fixed after the first start so a restarted
	// node comes back on the same address.
	Port int
	// Cluster is the running node, nil after Kill or Stop.
	Cluster *cluster.Cluster
	// Registry holds the running node's metrics (a new one per start).
	Registry *prometheus.Registry

	configure func(cfg *cluster.Config)
	persisted *Persisted
}

// Addr returns the node's gossip address ip:port.
func (n *Node) Addr() string { return net.JoinHostPort(n.IP, strconv.Itoa(n.Port)) }

// Persisted is a node's durable config store as its kv.Persister: the
// latest entry per key, tombstones included, collected tombstones
// forgotten. It survives Kill and Restart, like a bbolt file would.
type Persisted struct {
	mu      sync.Mutex
	entries map[string]kv.Entry
	calls   int
	fail    error
}

var _ kv.Persister = (*Persisted)(nil)

func newPersisted() *Persisted { return &Persisted{entries: map[string]kv.Entry{}} }

// Save implements kv.Persister; it refuses to store an older version over
// a newer one (a bug it makes visible) and fails while SetFail is on.
func (p *Persisted) Save(_ context.Context, e kv.Entry) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.fail != nil {
		return p.fail
	}
	if cur, ok := p.entries[e.Key]; ok && cur.Version.Compare(e.Version) > 0 {
		return fmt.Errorf("persist of key %q went backwards: stored %s, got %s", e.Key, cur.Version, e.Version)
	}
	p.entries[e.Key] = e
	return nil
}

// Forget implements kv.Persister.
func (p *Persisted) Forget(_ context.Context, key string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.fail != nil {
		return p.fail
	}
	delete(p.entries, key)
	return nil
}

// SetFail makes every Save and Forget fail with err until SetFail(nil):
// a disk error the in-memory copy cannot show on its own.
func (p *Persisted) SetFail(err error) {
	p.mu.Lock()
	p.fail = err
	p.mu.Unlock()
}

// Entries returns the persisted entries sorted by key.
func (p *Persisted) Entries() []kv.Entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]kv.Entry, 0, len(p.entries))
	for _, e := range p.entries {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b kv.Entry) int { return cmpString(a.Key, b.Key) })
	return out
}

// Get returns the persisted entry of key.
func (p *Persisted) Get(key string) (kv.Entry, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.entries[key]
	return e, ok
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Start brings up n nodes; node i joins the nodes before it. It does not
// wait for convergence: call WaitConverged.
func Start(t testing.TB, n int, opts ...Options) *Harness {
	t.Helper()
	h := &Harness{t: t, logs: &logBuffer{}}
	if len(opts) > 0 {
		h.opts = opts[0]
	}
	t.Cleanup(func() {
		for _, nd := range h.nodes {
			if nd.Cluster != nil {
				_ = nd.Cluster.Shutdown()
				nd.Cluster = nil
			}
		}
		if t.Failed() {
			t.Logf("node logs:\n%s", h.logs.String())
		}
	})
	for i := 0; i < n; i++ {
		h.add(nil)
	}
	return h
}

// Add starts one more node, joined to the running ones; configure (may be
// nil) edits its config after Options.Configure.
func (h *Harness) Add(configure func(cfg *cluster.Config)) *Node {
	h.t.Helper()
	return h.add(configure)
}

func (h *Harness) add(configure func(cfg *cluster.Config)) *Node {
	h.t.Helper()
	i := len(h.nodes)
	nd := &Node{
		Index:     i,
		Name:      fmt.Sprintf("node-%d", i),
		IP:        TakeIP(),
		configure: configure,
		persisted: newPersisted(),
	}
	h.nodes = append(h.nodes, nd)
	h.startNode(nd)
	return nd
}

// Config returns the config node i starts with: FastConfig on the node's
// address, joined to every other node ever started, with the harness's
// persistence hook and initial config.
func (h *Harness) config(nd *Node) *cluster.Config {
	cfg := cluster.FastConfig()
	cfg.Name = nd.Name
	cfg.BindAddr = nd.IP
	cfg.BindPort = nd.Port
	cfg.AdvertisePort = nd.Port
	cfg.APIAddr = net.JoinHostPort(nd.IP, "8080")
	if h.opts.ShardCount != 0 {
		cfg.ShardCount = h.opts.ShardCount
	}
	for _, o := range h.nodes {
		if o != nd && o.Port != 0 {
			cfg.Join = append(cfg.Join, o.Addr())
		}
	}
	cfg.Logger = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: h.opts.LogLevel}))
	cfg.KV.Persister = nd.persisted
	cfg.KV.Initial = nd.persisted.Entries()
	if h.opts.Configure != nil {
		h.opts.Configure(nd.Index, cfg)
	}
	if nd.configure != nil {
		nd.configure(cfg)
	}
	return cfg
}

func (h *Harness) startNode(nd *Node) {
	h.t.Helper()
	cfg := h.config(nd)
	nd.Registry = prometheus.NewPedanticRegistry()
	cfg.Registerer = nd.Registry
	c, err := cluster.New(cfg)
	if err != nil {
		h.t.Fatalf("start %s on %s:%d: %v", nd.Name, nd.IP, nd.Port, err)
	}
	_, port, _ := net.SplitHostPort(c.GossipAddr())
	nd.Port, _ = strconv.Atoi(port)
	if err := c.Start(context.Background()); err != nil {
		_ = c.Shutdown()
		h.t.Fatalf("start %s join loop: %v", nd.Name, err)
	}
	nd.Cluster = c
}

// Node returns node i.
func (h *Harness) Node(i int) *Node { return h.nodes[i] }

// Nodes returns every node, running or not.
func (h *Harness) Nodes() []*Node { return slices.Clone(h.nodes) }

// Running returns the nodes that are up.
func (h *Harness) Running() []*Node {
	var out []*Node
	for _, nd := range h.nodes {
		if nd.Cluster != nil {
			out = append(out, nd)
		}
	}
	return out
}

// Persisted returns node i's durable config store.
func (h *Harness) Persisted(i int) *Persisted { return h.nodes[i].persisted }

// Kill shuts node i down without leaving: a crash, as its peers see it.
func (h *Harness) Kill(i int) {
	h.t.Helper()
	nd := h.nodes[i]
	if err := nd.Cluster.Shutdown(); err != nil {
		h.t.Fatalf("kill %s: %v", nd.Name, err)
	}
	nd.Cluster = nil
}

// Stop takes node i out gracefully: SetLeaving, Leave, Shutdown.
func (h *Harness) Stop(i int) {
	h.t.Helper()
	nd := h.nodes[i]
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := nd.Cluster.SetLeaving(ctx); err != nil {
		h.t.Fatalf("%s SetLeaving: %v", nd.Name, err)
	}
	if err := nd.Cluster.Leave(ctx); err != nil {
		h.t.Fatalf("%s Leave: %v", nd.Name, err)
	}
	if err := nd.Cluster.Shutdown(); err != nil {
		h.t.Fatalf("%s Shutdown: %v", nd.Name, err)
	}
	nd.Cluster = nil
}

// Restart starts node i again with the same name and address and its
// persisted config.
func (h *Harness) Restart(i int) {
	h.t.Helper()
	nd := h.nodes[i]
	if nd.Cluster != nil {
		h.t.Fatalf("restart %s: it is running", nd.Name)
	}
	h.startNode(nd)
}

// RestartOnNewAddress starts node i again with the same name and
// persisted config but on a fresh loopback IP and port, as a container
// that comes back with a new IP does, and returns the new address. Its
// peers hold the name at the old address until they have declared it dead
// and DeadNodeReclaimTime has passed.
func (h *Harness) RestartOnNewAddress(i int) string {
	h.t.Helper()
	nd := h.nodes[i]
	if nd.Cluster != nil {
		h.t.Fatalf("restart %s: it is running", nd.Name)
	}
	nd.IP, nd.Port = TakeIP(), 0
	h.startNode(nd)
	return nd.Addr()
}

// WaitConverged waits until every running node sees exactly the running
// nodes as members (names and states alike) and computed the same table,
// and returns the snapshot of the first running node. It fails the test
// after timeout.
func (h *Harness) WaitConverged(timeout time.Duration) *cluster.OwnershipSnapshot {
	h.t.Helper()
	poll.Eventually(h.t, timeout, "cluster did not converge", h.converged)
	return h.Running()[0].Cluster.Snapshot()
}

func (h *Harness) converged() (bool, string) {
	running := h.Running()
	if len(running) == 0 {
		return true, ""
	}
	want := make([]string, 0, len(running))
	for _, nd := range running {
		want = append(want, nd.Name)
	}
	var first *cluster.OwnershipSnapshot
	for _, nd := range running {
		s := nd.Cluster.Snapshot()
		names := make([]string, 0, len(s.Members))
		for _, m := range s.Members {
			names = append(names, m.Name)
		}
		if !slices.Equal(names, want) {
			return false, fmt.Sprintf("%s sees members %v, want %v", nd.Name, names, want)
		}
		if first == nil {
			first = s
			continue
		}
		if !slices.Equal(first.Members, s.Members) {
			return false, fmt.Sprintf("%s sees %v, %s sees %v", running[0].Name, first.Members, nd.Name, s.Members)
		}
		if !first.Table.Equal(s.Table) {
			return false, fmt.Sprintf("%s and %s disagree on %d shards", running[0].Name, nd.Name, len(first.Table.Diff(s.Table)))
		}
	}
	return true, ""
}

// CheckOwnership asserts that the running nodes' owned shards partition the
// shard space (fractions sum to exactly 1) and match the table. Right after
// a membership change the nodes apply their new snapshots one after the
// other (and a loaded machine may make one miss a probe), so it polls
// until that holds, for up to 10 s, and fails the test with the last
// discrepancy otherwise.
func (h *Harness) CheckOwnership() {
	h.t.Helper()
	poll.Eventually(h.t, 10*time.Second, "owned shards do not partition the shard space", h.ownershipPartitioned)
}

func (h *Harness) ownershipPartitioned() (bool, string) {
	var total int
	var seen []bool
	var table *shards.Table
	for _, nd := range h.Running() {
		s := nd.Cluster.Snapshot()
		if seen == nil {
			seen = make([]bool, s.ShardCount)
			table = s.Table
		}
		for _, sh := range s.Owned {
			if seen[sh] {
				return false, fmt.Sprintf("shard %d owned by two nodes", sh)
			}
			seen[sh] = true
			if o := table.Owner(sh); o != nd.Name {
				return false, fmt.Sprintf("%s lists shard %d as owned, table says %q", nd.Name, sh, o)
			}
		}
		total += len(s.Owned)
	}
	if seen != nil && total != len(seen) {
		return false, fmt.Sprintf("running nodes own %d of %d shards", total, len(seen))
	}
	return true, ""
}

// logBuffer collects node logs for a failure dump.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	const limit = 4 << 20 // keep the last ~4 MiB
	if l.buf.Len() > limit {
		rest := l.buf.Bytes()[l.buf.Len()-limit/2:]
		l.buf = *bytes.NewBuffer(slices.Clone(rest))
	}
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
