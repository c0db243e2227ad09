package replication_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/internal/testmetrics"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/replication"
	"github.com/fairshard/fairshard/shards"
	"github.com/fairshard/fairshard/transfer"
)

// A test cluster: real bbolt files, real HTTP between nodes (httptest
// servers serving replication.Handler), views computed by
// shards.ReplicaSets as the cluster package does.

const testSecret = "replication-test-secret"

type tnode struct {
	name  string
	dir   string
	store *boltstore.Store
	repl  *replication.Replicator
	srv   *httptest.Server
	peers *replication.HTTPPeers
	reg   *prometheus.Registry
	now   func() time.Time

	cancel context.CancelFunc
	done   chan struct{}
	up     bool

	scopeMu sync.Mutex
	scope   []uint32

	// refuseMerges makes this node's server answer 503 to merges sent to
	// it (shipping, a leftover's hand-off, a repair's push), refuseKeys to
	// key list reads (a diff's): faults the real parts cannot be made to
	// show on cue.
	refuseMerges, refuseKeys atomic.Bool
	// refuseStates makes it answer 503 to States calls (a member the
	// handover cannot hear from).
	refuseStates atomic.Bool
	// holdReads, when set, holds every shard read (a sync's bulk copy)
	// served by this node until the channel closes; heldReads counts the
	// reads that reached the hold.
	holdReads atomic.Pointer[chan struct{}]
	heldReads atomic.Int32
}

type tcluster struct {
	t       testing.TB
	shards  uint32
	factor  int
	nodes   map[string]*tnode
	version uint64
	opts    func(*replication.Config)
	limits  transfer.Limits
}

func newTCluster(t testing.TB, shardCount uint32, factor int, names ...string) *tcluster {
	t.Helper()
	c := &tcluster{t: t, shards: shardCount, factor: factor, nodes: map[string]*tnode{}, limits: transferLimits()}
	for _, n := range names {
		c.add(n)
	}
	c.apply()
	t.Cleanup(c.close)
	return c
}

// startSynced starts the named nodes, applies a view of them and waits
// until every shard they replicate is synced: the set-up of a test that
// sets c.opts first (newTCluster starts its names before that).
func (c *tcluster) startSynced(names ...string) {
	c.t.Helper()
	for _, n := range names {
		c.add(n)
	}
	c.apply()
	waitSynced(c.t, c)
}

// add starts a node (a fresh data dir unless it existed) without applying
// a new view.
func (c *tcluster) add(name string) *tnode {
	c.t.Helper()
	n := c.nodes[name]
	if n == nil {
		n = &tnode{name: name, dir: c.t.TempDir(), now: time.Now}
		c.nodes[name] = n
	}
	c.start(n)
	return n
}

func (c *tcluster) start(n *tnode) {
	c.t.Helper()
	st, err := boltstore.Open(filepath.Join(n.dir, "fairshard.db"), boltstore.Options{ShardCount: c.shards})
	if err != nil {
		c.t.Fatalf("open store of %s: %v", n.name, err)
	}
	st.SetOwnedShards([]uint32{})
	n.store = st
	n.reg = prometheus.NewRegistry()
	n.peers = replication.NewHTTPPeers(testAuth.Transport)
	cfg := replication.Config{
		Self: n.name, ShardCount: c.shards, Local: st, Peers: n.peers,
		Scope: func(owned []uint32) {
			st.SetOwnedShards(owned)
			n.scopeMu.Lock()
			n.scope = slices.Clone(owned)
			n.scopeMu.Unlock()
		},
		Seeded: true,
		Tunables: replication.Tunables{
			PollInterval: 100 * time.Millisecond, SyncRetry: 50 * time.Millisecond,
			LeftoverInterval: 100 * time.Millisecond, CallTimeout: 5 * time.Second,
			// WriteTimeout stays at its default (10 s): under -race at CI load one
			// fan-out of 3,000 rows to a backup can take longer than 2 s, and the
			// set-up write would fail on the machine, not on the product.
			WriteTimeout: replication.DefaultWriteTimeout,
			Limits:       c.limits,
		},
		Now:        func() time.Time { return n.now() },
		Registerer: n.reg,
	}
	if c.opts != nil {
		c.opts(&cfg)
	}
	r, err := replication.New(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	n.repl = r
	h := replication.Handler(r, nil, nil)
	n.srv = httptest.NewServer(authOnly(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if (n.refuseMerges.Load() && req.URL.Path == replication.PathPrefix+"merge") ||
			(n.refuseKeys.Load() && req.URL.Path == replication.PathPrefix+"keys") ||
			(n.refuseStates.Load() && req.URL.Path == replication.PathPrefix+"states") {
			http.Error(w, "refused by the test", http.StatusServiceUnavailable)
			return
		}
		if hold := n.holdReads.Load(); hold != nil && req.URL.Path == replication.PathPrefix+"read" {
			n.heldReads.Add(1)
			<-*hold
		}
		h.ServeHTTP(w, req)
	})))
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel, n.done, n.up = cancel, make(chan struct{}), true
	go func() {
		defer close(n.done)
		if err := r.Run(ctx); err != nil {
			c.t.Errorf("%s: Run: %v", n.name, err)
		}
	}()
}

// kill stops a node at once (its server, loops and store), as a crash
// would; wipe deletes its data dir too.
func (c *tcluster) kill(name string, wipe bool) {
	c.t.Helper()
	n := c.nodes[name]
	if !n.up {
		return
	}
	n.up = false
	n.srv.CloseClientConnections()
	n.srv.Close()
	n.cancel()
	<-n.done
	n.peers.Close()
	if err := n.store.Close(); err != nil {
		c.t.Errorf("close %s: %v", name, err)
	}
	if wipe {
		n.dir = c.t.TempDir()
	}
}

func (c *tcluster) close() {
	for name := range c.nodes {
		c.kill(name, false)
	}
}

func (c *tcluster) live() []string {
	var out []string
	for name, n := range c.nodes {
		if n.up {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// apply computes the view of the live nodes and applies it on each.
func (c *tcluster) apply() {
	c.applyTo(c.live(), c.live())
}

// applyTo applies the view of members to the nodes named in on.
func (c *tcluster) applyTo(members, on []string) {
	c.applyViews(members, members, on, "")
}

// applyViews applies, on each node named in on, a new view whose replica
// sets are computed over active and whose addresses are those of live;
// leaving, when set, is marked leaving in its own view.
func (c *tcluster) applyViews(active, live, on []string, leaving string) {
	c.version++
	table := shards.ReplicaSets(active, c.shards, c.factor)
	sets := make([][]string, c.shards)
	for s := range c.shards {
		sets[s] = table.Replicas(s)
	}
	addrs := map[string]string{}
	for _, m := range live {
		addrs[m] = strings.TrimPrefix(c.nodes[m].srv.URL, "http://")
	}
	for _, name := range on {
		c.nodes[name].repl.Apply(&replication.View{
			Version: c.version, Self: name, ShardCount: c.shards, Factor: c.factor, Sets: sets, Addrs: addrs,
			Leaving: name == leaving,
		})
	}
}

func (c *tcluster) view(name string) *replication.View { return c.nodes[name].repl.View() }

// leave applies, on the others, the view of members without name (name
// still live, at its address, as a leaving member is), and on name that
// view marked leaving: name drains.
func (c *tcluster) leave(name string, members []string) *replication.Replicator {
	c.t.Helper()
	all := append(slices.Clone(members), name)
	c.applyViews(members, all, all, name)
	return c.nodes[name].repl
}

// rowsFor makes n rows with keys prefix-i.
func rowsFor(prefix string, n int, now time.Time) []outbox.Row {
	rows := make([]outbox.Row, n)
	for i := range rows {
		rows[i] = outbox.Row{
			DispatchKey: fmt.Sprintf("%s-%d", prefix, i), Namespace: "ns", TaskQueue: "q",
			Payload: []byte(fmt.Sprintf(`{"i":%d}`, i)), ContentType: "application/json",
			CreatedAt: now, VisibleAfter: now, Attempt: 1,
		}
	}
	return rows
}

// holders returns the live nodes holding key.
func (c *tcluster) holders(key string) []string {
	c.t.Helper()
	var out []string
	for _, name := range c.live() {
		if _, err := c.nodes[name].store.Get(context.Background(), key); err == nil {
			out = append(out, name)
		}
	}
	return out
}

// converged reports whether every shard's replicas are live, synced and
// agree on the digest, no node holds a copy of a shard it does not
// replicate, and no primary waits for a handover.
func (c *tcluster) converged() (bool, string) {
	ctx := context.Background()
	live := c.live()
	for _, name := range live {
		if h := c.nodes[name].repl.Status().HandoverShards; h > 0 {
			return false, fmt.Sprintf("%s: %d shards wait for a handover", name, h)
		}
	}
	v := c.view(live[0])
	for s := range c.shards {
		set := v.Sets[s]
		var first outbox.ShardDigest
		for i, m := range set {
			n := c.nodes[m]
			if !n.repl.Synced(s) {
				return false, fmt.Sprintf("shard %d: %s not synced", s, m)
			}
			d, err := n.store.ShardDigest(ctx, s)
			if err != nil {
				return false, err.Error()
			}
			if i == 0 {
				first = d
			} else if d.Rows != first.Rows || d.Sum != first.Sum {
				return false, fmt.Sprintf("shard %d: %s holds %d rows (%x), %s %d (%x)", s, set[0], first.Rows, first.Sum, m, d.Rows, d.Sum)
			}
		}
		for _, name := range live {
			if slices.Contains(set, name) {
				continue
			}
			d, _ := c.nodes[name].store.ShardDigest(ctx, s)
			if d.Rows != 0 {
				return false, fmt.Sprintf("shard %d: %s (not a replica of %v) still holds %d rows", s, name, set, d.Rows)
			}
		}
	}
	return true, ""
}

func (n *tnode) scopeNow() []uint32 {
	n.scopeMu.Lock()
	defer n.scopeMu.Unlock()
	return slices.Clone(n.scope)
}

// metric sums the samples of a metric of n's registry that carry every
// one of labels ("label=value").
func metric(t testing.TB, n *tnode, name string, labels ...string) float64 {
	t.Helper()
	return testmetrics.Sum(t, n.reg, name, labels...)
}

type atomicCounter struct {
	mu sync.Mutex
	n  int
}

func (a *atomicCounter) add() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n++
	return a.n
}
