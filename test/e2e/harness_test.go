package e2e

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/fairshard/fairshard/client"
	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/internal/testnode"
	"github.com/fairshard/fairshard/loadgen"
)

// baseNodeFlags are every node's serve flags: the test profile
// (testnode.ServeFlags), so a scenario takes seconds (DESIGN: tests use
// shorter timings than the LAN profile); and a cluster secret, so every
// node-to-node call of the suite is signed both ways (loopback nodes could
// run without).
var baseNodeFlags = append([]string{
	"--cluster-secret", e2eClusterSecret,
	"--shutdown-grace", "20s",
	// Exact quota mode (the default): a 2 s lease, so a coordinator that
	// moves with a join or a crash learns for 2 s, not 10 (the test gossip
	// profile detects a crash in a second or two).
	"--lease-length", "2s",
	"--lease-refresh", "100ms",
}, testnode.ServeFlags()...)

// e2eClusterSecret is the suite's cluster secret, fresh per run.
var e2eClusterSecret = func() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}()

// ---- addresses ----

// nextIP numbers the loopback addresses of the nodes: 127.0.0.N, N ≥ 2
// (127.0.0.1 is the delivery target's). Every node of the whole run gets
// its own address; a restarted node keeps its address and ports.
var nextIP atomic.Int32

func init() { nextIP.Store(1) }

func allocIP(t *testing.T) string {
	n := nextIP.Add(1)
	if n > 254 {
		t.Fatal("e2e: out of 127.0.0.N addresses")
	}
	return fmt.Sprintf("127.0.0.%d", n)
}

// freeTCPPort returns a port free on ip now; with udpToo it is free for UDP
// as well (memberlist binds both on the gossip port).
func freeTCPPort(t *testing.T, ip string, udpToo bool) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", net.JoinHostPort(ip, "0"))
		if err != nil {
			t.Fatalf("e2e: listen on %s: %v", ip, err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if udpToo {
			u, err := net.ListenPacket("udp", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				_ = l.Close()
				continue
			}
			_ = u.Close()
		}
		_ = l.Close()
		return port
	}
	t.Fatalf("e2e: no free port on %s", ip)
	return 0
}

// ---- processes ----

// proc is one fairshard node: its fixed identity (name, addresses, data
// dir, log) and its current process, if running.
type proc struct {
	c          *testCluster
	name       string
	ip         string
	httpAddr   string
	gossipAddr string
	dataDir    string
	logPath    string
	extra      []string // flags of this node only
	// outsider nodes are not expected to be members (another shard count).
	outsider bool
	// refused nodes are expected to exit at start-up (see expectRefusal).
	refused bool

	mu     sync.Mutex
	cur    *testnode.Process // the current (or last) process; nil before the first start
	starts int
}

// baseURL is the node's API root, e.g. http://127.0.0.3:41234.
func (p *proc) baseURL() string { return "http://" + p.httpAddr }

func (p *proc) process() *testnode.Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cur
}

func (p *proc) running() bool {
	cur := p.process()
	return cur != nil && cur.Running()
}

// exitStatus returns the last process's exit code (-1: killed by a
// signal or still running).
func (p *proc) exitStatus() int {
	if cur := p.process(); cur != nil {
		return cur.ExitCode()
	}
	return -1
}

// launch starts the process, joining the gossip addresses in join.
func (p *proc) launch(join []string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	args := []string{"serve",
		"--node-name", p.name,
		"--data-dir", p.dataDir,
		"--http-addr", p.httpAddr,
		"--gossip-addr", p.gossipAddr,
		"--shards", strconv.Itoa(int(p.c.opts.Shards)),
		"--default-target", p.c.targetURL,
		"--default-max-in-flight", strconv.Itoa(p.c.opts.DefaultMaxInFlight),
	}
	args = append(args, baseNodeFlags...)
	args = append(args, p.c.opts.Flags...)
	args = append(args, p.extra...)
	if len(join) > 0 {
		args = append(args, "--join", strings.Join(join, ","))
	}
	bin := fairshardBin
	if p.c.opts.PlainBuild {
		bin = fairshardPlainBin
	}
	p.starts++
	cur, err := testnode.Launch(testnode.Spec{Name: p.name, Path: bin, Args: args, LogPath: p.logPath, Start: p.starts})
	if err != nil {
		return err
	}
	p.cur = cur
	return nil
}

// signal sends sig to the running process; it returns the exit channel
// (nil before the first start) and whether the process was running.
func (p *proc) signal(sig syscall.Signal) (<-chan struct{}, bool) {
	cur := p.process()
	if cur == nil {
		return nil, false
	}
	return cur.Done(), cur.Signal(sig)
}

// kill sends SIGKILL (a crash: no drain, no leave) and waits for the exit.
func (p *proc) kill() {
	if cur := p.process(); cur != nil {
		cur.Kill()
	}
}

// stop sends SIGTERM (a graceful stop: drain, hand off, leave) and waits up
// to timeout for the exit; it returns the exit code (-1: killed by signal).
func (p *proc) stop(t *testing.T, timeout time.Duration) int {
	t.Helper()
	timeout = deadline(timeout)
	cur := p.process()
	if cur == nil {
		t.Fatalf("stop %s: never started", p.name)
	}
	if !cur.Stop(timeout) {
		t.Fatalf("stop %s: still running %v after SIGTERM; killed", p.name, timeout)
	}
	return cur.ExitCode()
}

// ---- cluster ----

// clusterOpts are the settings every node of a testCluster shares.
type clusterOpts struct {
	// Shards is --shards. Defaults to 1024.
	Shards uint32
	// DefaultMaxInFlight is --default-max-in-flight. Defaults to 1024.
	DefaultMaxInFlight int
	// TargetDelay is how long the delivery target holds each request.
	// Defaults to 20 ms.
	TargetDelay time.Duration
	// Flags are extra serve flags for every node.
	Flags []string
	// PlainBuild runs the nodes from the build without -race even when the
	// tests run under -race: for scenarios that assert time, throughput or
	// memory bounds (a race-built node is 4-8× slower and its RSS carries
	// the detector's shadow memory, so such bounds would measure the
	// detector) or move volume (10⁵-10⁶ rows, hundreds of MiB) that
	// race-built nodes take many minutes over. Races are the other
	// scenarios' business: they run race-built nodes through the same code
	// paths with less data.
	PlainBuild bool
}

// testCluster is a set of node processes and the delivery target they all
// use (--default-target). Build with newCluster; everything it starts is
// stopped in t.Cleanup.
type testCluster struct {
	t      *testing.T
	dir    string
	opts   clusterOpts
	client *http.Client

	target    *httptest.Server
	targetURL string
	recv      atomic.Pointer[loadgen.Receiver]

	mu    sync.Mutex
	procs []*proc
}

// newCluster starts the delivery target (a loadgen.Receiver behind a
// swappable pointer, see resetReceiver) and returns an empty cluster.
func newCluster(t *testing.T, opts clusterOpts) *testCluster {
	t.Helper()
	if testing.Short() {
		t.Skip("e2e: runs real processes; skipped with -short")
	}
	if fairshardBin == "" {
		t.Fatal("e2e: binary not built (TestMain)")
	}
	opts.Shards = cmp.Or(opts.Shards, 1024)
	opts.DefaultMaxInFlight = cmp.Or(opts.DefaultMaxInFlight, 1024)
	opts.TargetDelay = cmp.Or(opts.TargetDelay, 20*time.Millisecond)
	c := &testCluster{t: t, dir: t.TempDir(), opts: opts}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	c.client = &http.Client{Timeout: 30 * time.Second, Transport: tr}
	c.recv.Store(loadgen.NewReceiver(opts.TargetDelay))
	c.target = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.recv.Load().ServeHTTP(w, r)
	}))
	c.target.Config.ReadHeaderTimeout = 10 * time.Second
	c.target.Start()
	c.targetURL = c.target.URL + "/deliver/{namespace}/{task_queue}"
	t.Cleanup(c.cleanup)
	return c
}

// cleanup kills every node still running, prints the tail of each node's
// log when the test failed, and stops the target.
func (c *testCluster) cleanup() {
	c.mu.Lock()
	procs := slices.Clone(c.procs)
	c.mu.Unlock()
	for _, p := range procs {
		p.kill()
	}
	// A node falsely suspected or declared dead (CPU starvation on a busy
	// machine) changes ownership mid-scenario: say so, it explains odd
	// figures.
	for _, p := range procs {
		if b, err := os.ReadFile(p.logPath); err == nil {
			if n := strings.Count(string(b), "Suspect "); n > 0 {
				c.t.Logf("note: %s's log has %d memberlist suspicion lines", p.name, n)
			}
			// A race-built node prints the report and goes on (exit code 66
			// only at its exit, which a SIGKILL never reaches): read the log.
			if i := strings.Index(string(b), raceReport); i >= 0 {
				c.t.Errorf("%s reported a data race (%s):\n%s", p.name, p.logPath, excerpt(b[i:], 60))
			}
		}
	}
	if c.t.Failed() {
		for _, p := range procs {
			c.t.Logf("---- tail of %s's log (%s) ----\n%s", p.name, p.logPath, testnode.TailFile(p.logPath, 60))
		}
	}
	c.target.CloseClientConnections()
	c.target.Close()
	c.client.CloseIdleConnections()
}

// raceReport opens every report of a -race build.
const raceReport = "WARNING: DATA RACE"

// excerpt returns the first n lines of b.
func excerpt(b []byte, n int) string {
	lines := strings.SplitN(string(b), "\n", n+1)
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// receiver is the delivery target's current recorder.
func (c *testCluster) receiver() *loadgen.Receiver { return c.recv.Load() }

// resetReceiver swaps in a fresh recorder (same delay) and returns it:
// deliveries from then on are counted from zero.
func (c *testCluster) resetReceiver() *loadgen.Receiver {
	r := loadgen.NewReceiver(c.opts.TargetDelay)
	c.recv.Store(r)
	return r
}

// nodeOpt adjusts one node before it starts.
type nodeOpt func(*proc)

// withFlags adds serve flags for this node only.
func withFlags(flags ...string) nodeOpt { return func(p *proc) { p.extra = append(p.extra, flags...) } }

// asOutsider marks a node that must not become a member (e.g. another
// shard count): convergence checks ignore it.
func asOutsider() nodeOpt { return func(p *proc) { p.outsider = true } }

// expectRefusal marks an outsider the cluster refuses at start-up: startNode
// waits for its process to exit instead of for /readyz.
func expectRefusal() nodeOpt { return func(p *proc) { p.outsider, p.refused = true, true } }

// startNode starts a node named name on its own 127.0.0.N with free API and
// gossip ports and its own data dir, joining every running member, and
// waits until it answers /readyz. A port taken by another process between
// the harness's check and the node's bind gets the node new ports (up to
// three tries).
func (c *testCluster) startNode(name string, opts ...nodeOpt) *proc {
	c.t.Helper()
	ip := allocIP(c.t)
	p := &proc{
		c:       c,
		name:    name,
		ip:      ip,
		dataDir: filepath.Join(c.dir, name, "data"),
		logPath: filepath.Join(c.dir, name+".log"),
	}
	for _, o := range opts {
		o(p)
	}
	c.mu.Lock()
	c.procs = append(c.procs, p)
	c.mu.Unlock()
	for try := 1; ; try++ {
		p.httpAddr = net.JoinHostPort(ip, strconv.Itoa(freeTCPPort(c.t, ip, false)))
		p.gossipAddr = net.JoinHostPort(ip, strconv.Itoa(freeTCPPort(c.t, ip, true)))
		err := c.launch(p)
		if err == nil {
			return p
		}
		if try == 3 || !strings.Contains(testnode.TailFile(p.logPath, 20), "address already in use") {
			c.t.Fatal(err)
		}
		c.t.Logf("e2e: %s lost a port race; retrying with new ports", name)
	}
}

// restart starts a stopped or killed node again with the same name,
// addresses and data dir, and waits for /readyz.
func (c *testCluster) restart(p *proc) {
	c.t.Helper()
	if p.running() {
		c.t.Fatalf("restart %s: still running", p.name)
	}
	if err := c.launch(p); err != nil {
		c.t.Fatal(err)
	}
}

// launch starts p joining every running member and waits for /readyz.
func (c *testCluster) launch(p *proc) error {
	var join []string
	for _, q := range c.members() {
		if q != p {
			join = append(join, q.gossipAddr)
		}
	}
	if err := p.launch(join); err != nil {
		return fmt.Errorf("e2e: %w", err)
	}
	if p.refused {
		if !p.process().WaitExit(20 * time.Second) {
			return fmt.Errorf("%s still running 20s after start; it should have been refused; log:\n%s", p.name, testnode.TailFile(p.logPath, 40))
		}
		return nil
	}
	return p.process().WaitReady(c.client, p.baseURL(), deadline(20*time.Second))
}

// members returns the running nodes expected to be members (outsiders
// excluded), in start order.
func (c *testCluster) members() []*proc {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*proc
	for _, p := range c.procs {
		if !p.outsider && p.running() {
			out = append(out, p)
		}
	}
	return out
}

// urls returns the API base URLs of the running members.
func (c *testCluster) urls() []string {
	var out []string
	for _, p := range c.members() {
		out = append(out, p.baseURL())
	}
	return out
}

// ---- HTTP ----

// do sends body (a []byte as is, anything else as JSON; nil: none) and
// decodes a JSON answer into out when out is non-nil and the status is
// 2xx. It returns the status and the raw answer.
func (c *testCluster) do(method, u string, body, out any) (int, []byte, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		js, err := json.Marshal(b)
		if err != nil {
			return 0, nil, err
		}
		rd = bytes.NewReader(js)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return 0, nil, err
	}
	if rd != nil || (method != http.MethodGet && method != http.MethodHead) {
		req.Header.Set("Content-Type", "application/json") // every write, body or not
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, data, err
	}
	if out != nil && resp.StatusCode/100 == 2 {
		if err := json.Unmarshal(data, out); err != nil {
			return resp.StatusCode, data, fmt.Errorf("%s %s: decode %q: %w", method, u, data, err)
		}
	}
	return resp.StatusCode, data, nil
}

// clusterView is GET /v1/cluster, decoded as the Go client does.
type clusterView = client.Cluster

// memberSet is v's members as "name:state,…", sorted.
func memberSet(v clusterView) string {
	var s []string
	for _, m := range v.Members {
		s = append(s, m.Name+":"+m.State)
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}

func (c *testCluster) clusterView(p *proc) (clusterView, error) {
	var v clusterView
	code, body, err := c.do(http.MethodGet, p.baseURL()+"/v1/cluster", nil, &v)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET /v1/cluster on %s: HTTP %d %s", p.name, code, body)
	}
	return v, err
}

// shardTable is GET /v1/shards reduced to the owner of each shard.
func (c *testCluster) shardTable(p *proc) ([]string, error) {
	var v struct {
		Shards []struct {
			Shard uint32 `json:"shard"`
			Owner string `json:"owner"`
		} `json:"shards"`
	}
	code, body, err := c.do(http.MethodGet, p.baseURL()+"/v1/shards", nil, &v)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET /v1/shards on %s: HTTP %d %s", p.name, code, body)
	}
	out := make([]string, len(v.Shards))
	for i, s := range v.Shards {
		out[i] = s.Owner
	}
	return out, err
}

// waitConverged waits until every running member reports exactly the
// running members, all active, and the same shard table, in which every
// member owns shards. It returns how long that took. Then (not counted in
// the answer) it waits until no member is learning as a new lease
// coordinator (GET /v1/cluster's leases_learning; at most --lease-length
// after the last ownership change), so a scenario's first rows of an
// exact-mode namespace are not held by the cluster's own start-up.
func (c *testCluster) waitConverged(timeout time.Duration) time.Duration {
	took := c.waitOwnership(timeout)
	poll.Eventually(c.t, deadline(timeout), "lease coordinators to finish learning", func() (bool, string) {
		for _, p := range c.members() {
			v, err := c.clusterView(p)
			if err != nil {
				return false, err.Error()
			}
			if v.LeasesLearning {
				return false, p.name + " is learning as a new lease coordinator"
			}
		}
		return true, ""
	})
	return took
}

// waitOwnership is waitConverged without the wait for lease coordinators.
func (c *testCluster) waitOwnership(timeout time.Duration) time.Duration {
	c.t.Helper()
	start := time.Now()
	poll.Eventually(c.t, deadline(timeout), "membership and ownership converge", func() (bool, string) {
		ms := c.members()
		var want []string
		for _, p := range ms {
			want = append(want, p.name+":active")
		}
		sort.Strings(want)
		wantSet := strings.Join(want, ",")
		var table []string
		for _, p := range ms {
			v, err := c.clusterView(p)
			if err != nil {
				return false, err.Error()
			}
			if got := memberSet(v); got != wantSet {
				return false, fmt.Sprintf("%s sees members %s, want %s", p.name, got, wantSet)
			}
			tb, err := c.shardTable(p)
			if err != nil {
				return false, err.Error()
			}
			if table == nil {
				table = tb
			} else if !slices.Equal(table, tb) {
				return false, fmt.Sprintf("%s's shard table differs from %s's", p.name, ms[0].name)
			}
		}
		for _, p := range ms {
			if !slices.Contains(table, p.name) {
				return false, p.name + " owns no shard"
			}
		}
		return true, ""
	})
	return time.Since(start)
}

// waitMembers waits until every running member lists exactly n members
// (any state) and returns how long that took.
func (c *testCluster) waitMembers(n int, timeout time.Duration) time.Duration {
	c.t.Helper()
	start := time.Now()
	poll.Eventually(c.t, deadline(timeout), fmt.Sprintf("every member sees %d members", n), func() (bool, string) {
		for _, p := range c.members() {
			v, err := c.clusterView(p)
			if err != nil {
				return false, err.Error()
			}
			if len(v.Members) != n {
				return false, fmt.Sprintf("%s sees %s", p.name, memberSet(v))
			}
		}
		return true, ""
	})
	return time.Since(start)
}

// clusterViews returns each running member's GET /v1/cluster, by name.
func (c *testCluster) clusterViews() map[string]clusterView {
	c.t.Helper()
	out := map[string]clusterView{}
	for _, p := range c.members() {
		v, err := c.clusterView(p)
		if err != nil {
			c.t.Fatal(err)
		}
		out[p.name] = v
	}
	return out
}

// ownershipVersions returns each running member's ownership_version (a
// per-node counter: it moves when that node's view of the members does).
func (c *testCluster) ownershipVersions() map[string]uint64 {
	c.t.Helper()
	out := map[string]uint64{}
	for name, v := range c.clusterViews() {
		out[name] = v.OwnershipVersion
	}
	return out
}

// fractions returns each member's owned shard fraction as node p sees it.
func (c *testCluster) fractions(p *proc) map[string]float64 {
	c.t.Helper()
	v, err := c.clusterView(p)
	if err != nil {
		c.t.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range v.Members {
		out[m.Name] = m.OwnedShardFraction
	}
	return out
}

// ---- namespaces ----

// namespaceView is GET /v1/namespaces/{ns}: one node's counts, decoded as
// the Go client does.
type namespaceView = client.Namespace

func (c *testCluster) namespace(p *proc, ns string) (namespaceView, error) {
	var v namespaceView
	code, body, err := c.do(http.MethodGet, p.baseURL()+"/v1/namespaces/"+ns, nil, &v)
	if err == nil && code != http.StatusOK {
		err = fmt.Errorf("GET /v1/namespaces/%s on %s: HTTP %d %s", ns, p.name, code, body)
	}
	return v, err
}

// setNamespace PUTs settings (e.g. {"max_in_flight": 8} or {"paused":
// true}) through the first member and waits until every member applies
// them (the config travels by gossip).
func (c *testCluster) setNamespace(ns string, settings map[string]any) {
	c.t.Helper()
	ms := c.members()
	code, body, err := c.do(http.MethodPut, ms[0].baseURL()+"/v1/namespaces/"+ns, settings, nil)
	if err != nil || code != http.StatusOK {
		c.t.Fatalf("PUT /v1/namespaces/%s %v: HTTP %d %s: %v", ns, settings, code, body, err)
	}
	poll.Eventually(c.t, deadline(10*time.Second), "namespace "+ns+" settings reach every node", func() (bool, string) {
		for _, p := range c.members() {
			v, err := c.namespace(p, ns)
			if err != nil {
				return false, err.Error()
			}
			if q, ok := settings["max_in_flight"]; ok && fmt.Sprint(v.MaxInFlight) != fmt.Sprint(q) {
				return false, fmt.Sprintf("%s: max_in_flight %d, want %v", p.name, v.MaxInFlight, q)
			}
			if pz, ok := settings["paused"]; ok && v.Paused != pz.(bool) {
				return false, fmt.Sprintf("%s: paused %v, want %v", p.name, v.Paused, pz)
			}
		}
		return true, ""
	})
}

// backlog sums a namespace's pending, claimed and dead-letter rows over
// every running member.
func (c *testCluster) backlog(ns string) (pending, claimed, dead int, err error) {
	for _, p := range c.members() {
		v, e := c.namespace(p, ns)
		if e != nil {
			return 0, 0, 0, e
		}
		pending += v.Pending
		claimed += v.Claimed
		dead += v.DeadLetters
	}
	return pending, claimed, dead, nil
}

// waitSettled waits until no member holds a pending or claimed row of the
// namespaces (every row is done or a dead letter) and asserts there is no
// dead letter.
func (c *testCluster) waitSettled(timeout time.Duration, namespaces ...string) {
	c.t.Helper()
	poll.Eventually(c.t, deadline(timeout), "every row settled", func() (bool, string) {
		for _, ns := range namespaces {
			pending, claimed, dead, err := c.backlog(ns)
			if err != nil {
				return false, err.Error()
			}
			if dead != 0 {
				c.t.Fatalf("namespace %s: %d dead letters", ns, dead)
			}
			if pending+claimed != 0 {
				return false, fmt.Sprintf("namespace %s: %d pending, %d claimed", ns, pending, claimed)
			}
		}
		return true, ""
	})
}

// ---- metrics ----

var labelRE = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"`)

// metric sums the samples of the metric name on p whose labels include
// every label of match (nil: all samples).
func (c *testCluster) metric(p *proc, name string, match map[string]string) (float64, error) {
	code, body, err := c.do(http.MethodGet, p.baseURL()+"/metrics", nil, nil)
	if err != nil {
		return 0, err
	}
	if code != http.StatusOK {
		return 0, fmt.Errorf("GET /metrics on %s: HTTP %d", p.name, code)
	}
	return sumMetric(string(body), name, match), nil
}

func sumMetric(text, name string, match map[string]string) float64 {
	sum := 0.0
	for _, line := range strings.Split(text, "\n") {
		if line == "" || line[0] == '#' || !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		labels := map[string]string{}
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				continue
			}
			for _, m := range labelRE.FindAllStringSubmatch(rest[1:end], -1) {
				labels[m[1]] = m[2]
			}
			rest = rest[end+1:]
		} else if !strings.HasPrefix(rest, " ") {
			continue // a longer name with this prefix
		}
		ok := true
		for k, v := range match {
			if labels[k] != v {
				ok = false
			}
		}
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.Fields(rest)[0], 64)
		if err == nil {
			sum += f
		}
	}
	return sum
}

// settleLag is what a node killed by killCountingSettleLag may have
// settled that its backups had not acknowledged: with replicated shards a
// new primary delivers those rows again.
type settleLag struct {
	// Unshipped is the node's state changes not yet acknowledged by its
	// backups (GET /v1/cluster replication.pending_changes, which counts a
	// batch in flight until it is acknowledged; rows × backups, so rows at
	// R = 2), read just before the kill.
	Unshipped int
	// Late bounds what it settled between that read and the signal: at
	// most its ceilings' sum of rows at once, each taking at least the
	// target's delay (rounded up).
	Late int
	// Window is the time from the read to the signal.
	Window time.Duration
}

func (l settleLag) bound() int { return l.Unshipped + l.Late }

func (l settleLag) String() string {
	return fmt.Sprintf("%d settles not yet acknowledged by its backups (+ at most %d in the %v between that read and the kill)",
		l.Unshipped, l.Late, l.Window.Round(time.Microsecond))
}

// killCountingSettleLag reads p's unacknowledged state changes, SIGKILLs
// it at once and waits for the exit; ceilings is the most rows p could
// have had claimed (the sum of its namespaces' quotas in exact mode). It
// reads /v1/cluster rather than /metrics: a race-built node takes 200 ms
// and more to render its metrics, a window the bound must cover.
func (c *testCluster) killCountingSettleLag(p *proc, ceilings int) settleLag {
	c.t.Helper()
	readAt := time.Now()
	var cv struct {
		Replication struct {
			PendingChanges int `json:"pending_changes"`
		} `json:"replication"`
	}
	if code, body, err := c.do(http.MethodGet, p.baseURL()+"/v1/cluster", nil, &cv); err != nil || code != http.StatusOK {
		c.t.Fatalf("GET /v1/cluster of %s: HTTP %d %s: %v", p.name, code, body, err)
	}
	done, ok := p.signal(syscall.SIGKILL)
	window := time.Since(readAt) // it ends at the signal, not at the exit
	if !ok {
		c.t.Fatalf("SIGKILL %s: not running", p.name)
	}
	<-done
	late := int(math.Ceil(float64(ceilings) * window.Seconds() / c.opts.TargetDelay.Seconds()))
	return settleLag{Unshipped: cv.Replication.PendingChanges, Late: late, Window: window}
}

// mustMetric is metric that fails the test on error.
func (c *testCluster) mustMetric(p *proc, name string, match map[string]string) float64 {
	c.t.Helper()
	v, err := c.metric(p, name, match)
	if err != nil {
		c.t.Fatal(err)
	}
	return v
}

// logNodeTimings logs the mean of p's sweep, delivery, commit and
// enqueue-to-delivery histograms (diagnostics for the report).
// It returns the means (ms) by name ("sweep_duration", …).
func logNodeTimings(t *testing.T, c *testCluster, p *proc) map[string]float64 {
	t.Helper()
	var parts []string
	means := map[string]float64{}
	for _, name := range []string{"sweep_duration", "delivery_duration", "store_commit_duration", "enqueue_to_delivery"} {
		full := "fairshard_" + name + "_seconds"
		sum := c.mustMetric(p, full+"_sum", nil)
		cnt := c.mustMetric(p, full+"_count", nil)
		means[name] = 1000 * sum / max(cnt, 1)
		parts = append(parts, fmt.Sprintf("%s mean %.1f ms (n=%.0f)", name, means[name], cnt))
	}
	t.Logf("%s: %s", p.name, strings.Join(parts, "; "))
	return means
}

// ---- load ----

// ledger records every row the cluster acknowledged (key → namespace),
// and the keys of append requests that failed (and were retried).
type ledger struct {
	mu   sync.Mutex
	keys map[string]string
	// byStatus counts acknowledgements by append status.
	byStatus map[string]int
	// failed holds keys whose append request failed at least once.
	failed map[string]bool
}

func newLedger() *ledger {
	return &ledger{keys: map[string]string{}, byStatus: map[string]int{}, failed: map[string]bool{}}
}

// onFailed is a loadgen.Config.OnFailed callback.
func (l *ledger) onFailed(_ string, keys []string, _ error) {
	l.mu.Lock()
	for _, k := range keys {
		l.failed[k] = true
	}
	l.mu.Unlock()
}

// wasRetried reports whether key's append request failed at least once.
func (l *ledger) wasRetried(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failed[key]
}

// onAppended is a loadgen.Config.OnAppended callback.
func (l *ledger) onAppended(key, ns, status string) {
	l.mu.Lock()
	l.keys[key] = ns
	l.byStatus[status]++
	l.mu.Unlock()
}

func (l *ledger) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.keys)
}

func (l *ledger) snapshot() map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[string]string, len(l.keys))
	for k, v := range l.keys {
		out[k] = v
	}
	return out
}

// generator builds a loadgen.Generator over the running members that
// records acknowledged rows in l; cfg.Nodes defaults to every member.
func (c *testCluster) generator(l *ledger, cfg loadgen.Config) *loadgen.Generator {
	c.t.Helper()
	if len(cfg.Nodes) == 0 {
		cfg.Nodes = c.urls()
	}
	cfg.Client = c.client
	if l != nil {
		cfg.OnAppended, cfg.OnFailed = l.onAppended, l.onFailed
	}
	g, err := loadgen.NewGenerator(cfg)
	if err != nil {
		c.t.Fatal(err)
	}
	return g
}

// runLoad runs g to completion and returns its report.
func runLoad(t *testing.T, g *loadgen.Generator) loadgen.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := g.Run(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// startLoad runs g in the background; the returned func waits for it.
func startLoad(t *testing.T, g *loadgen.Generator) func() loadgen.Report {
	t.Helper()
	ch := make(chan loadgen.Report, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	go func() {
		rep, _ := g.Run(ctx)
		ch <- rep
	}()
	var once sync.Once
	var rep loadgen.Report
	wait := func() loadgen.Report {
		once.Do(func() { rep = <-ch; cancel() })
		return rep
	}
	// A test that ends early stops the load before its nodes are killed.
	t.Cleanup(func() { cancel(); wait() })
	return wait
}

// waitDelivered waits until the receiver has seen every key of l at least
// once and returns how long that took. On timeout it reports how many are
// missing and where a few of them are.
func (c *testCluster) waitDelivered(l *ledger, recv *loadgen.Receiver, timeout time.Duration) time.Duration {
	c.t.Helper()
	timeout = deadline(timeout)
	start := time.Now()
	want := l.snapshot()
	deadline := time.Now().Add(timeout)
	// Cheap polls first, then one full scan, then only the keys still
	// missing (the receiver's lock is shared with the deliveries being
	// measured).
	for recv.Distinct() < len(want) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	got := recv.Keys()
	var missing []string
	for k := range want {
		if got[k] == 0 {
			missing = append(missing, k)
		}
	}
	for {
		still := missing[:0]
		for _, k := range missing {
			if recv.Count(k) == 0 {
				still = append(still, k)
			}
		}
		missing = still
		if len(missing) == 0 {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			sort.Strings(missing)
			var where []string
			for _, k := range missing[:min(len(missing), 5)] {
				where = append(where, k+" → "+c.locate(k))
			}
			c.t.Fatalf("after %v, %d of %d acknowledged rows were never delivered; e.g.\n  %s",
				timeout, len(missing), len(want), strings.Join(where, "\n  "))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// locate describes where key is (GET /v1/rows/{key} through any member).
func (c *testCluster) locate(key string) string {
	for _, p := range c.members() {
		code, body, err := c.do(http.MethodGet, p.baseURL()+"/v1/rows/"+url.PathEscape(key), nil, nil)
		if err == nil {
			var v struct {
				Status  string `json:"status"`
				Node    string `json:"node"`
				Attempt int    `json:"attempt"`
				Shard   int    `json:"shard"`
			}
			if code == http.StatusOK && json.Unmarshal(body, &v) == nil {
				return fmt.Sprintf("%s on %s (shard %d, attempt %d)", v.Status, v.Node, v.Shard, v.Attempt)
			}
			return fmt.Sprintf("HTTP %d %s", code, bytes.TrimSpace(body))
		}
	}
	return "no member answered"
}

// rowView is the part of GET /v1/rows/{key} the scenarios check.
type rowView struct {
	DispatchKey string `json:"dispatch_key"`
	Namespace   string `json:"namespace"`
	Status      string `json:"status"`
	Attempt     int    `json:"attempt"`
	Shard       uint32 `json:"shard"`
	Node        string `json:"node"`
}

// checkNoStrays asserts that the receiver saw only keys of l (no
// stray delivery) and returns the keys delivered more than once.
func checkNoStrays(t *testing.T, l *ledger, recv *loadgen.Receiver) map[string]int {
	t.Helper()
	want := l.snapshot()
	strays := 0
	for k := range recv.Keys() {
		if _, ok := want[k]; !ok {
			strays++
		}
	}
	if strays > 0 {
		t.Errorf("%d delivered dispatch_keys were never acknowledged by an append", strays)
	}
	return recv.Duplicates()
}

// ---- polling ----

// deadline scales a wait's timeout by slowdown: with race-built nodes
// (under -race) every state a scenario waits for takes several times
// longer to reach. Only how long a test waits for a correct state is
// scaled; what that state must be is not, and a bound on a latency that is
// itself asserted says which build it holds for (fairness_test.go).
func deadline(timeout time.Duration) time.Duration { return timeout * slowdown }
