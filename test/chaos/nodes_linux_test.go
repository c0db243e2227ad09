//go:build linux

package chaos

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/fairshard/fairshard/internal/testnode"
)

// nodeFlags are the serve flags of every node: the test profile
// (testnode.ServeFlags), as in test/e2e, so a fault's effects play out in
// seconds; and the secrets a node listening beyond loopback needs: a
// cluster secret signing node-to-node calls and a gossip key, fresh per
// run.
var nodeFlags = append([]string{
	"--cluster-secret", randomSecret(32),
	"--gossip-key", base64.StdEncoding.EncodeToString([]byte(randomSecret(16))),
	"--shutdown-grace", shutdownGrace.String(),
}, testnode.ServeFlags()...)

// randomSecret returns n random bytes as hex characters (n of them).
func randomSecret(n int) string {
	b := make([]byte, n/2)
	if _, err := rand.Read(b); err != nil {
		panic(err)
	}
	return hex.EncodeToString(b)
}

// nodeState is what the harness last did to a node.
type nodeState int

const (
	stateNew    nodeState = iota // namespace made, never started
	stateUp                      // process running
	statePaused                  // process stopped by SIGSTOP
	stateDown                    // no process (killed or stopped), coming back
	stateGone                    // left the cluster for good
)

// node is one fairshard node: its fixed identity (name, namespace,
// address, data dir, log) and its current process.
type node struct {
	c       *cluster
	idx     nodeIdx
	name    string
	ns      string
	ip      string
	dataDir string
	logPath string

	mu     sync.Mutex
	state  nodeState
	cur    *testnode.Process // the current (or last) process; nil before the first start
	starts int
	// expectExit is set while the harness is stopping the process, so the
	// exit watcher tells a crash from an exit it caused.
	expectExit bool
}

func (n *node) baseURL() string { return fmt.Sprintf("http://%s:%d", n.ip, apiPort) }
func (n *node) gossipAddr() string {
	return net.JoinHostPort(n.ip, strconv.Itoa(gossipPort))
}

func (n *node) getState() nodeState {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.state
}

func (n *node) setState(s nodeState) {
	n.mu.Lock()
	n.state = s
	n.mu.Unlock()
}

func (n *node) pid() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cur == nil {
		return 0
	}
	return n.cur.Pid()
}

// cluster is a run's node processes, each in its own network namespace of
// the lab, delivering to the run's target.
type cluster struct {
	lab     *netLab
	bin     string
	dir     string
	shards  int
	target  string // --default-target
	tl      *timeline
	client  *http.Client // admin calls (short timeout), from the hub
	onCrash func(n *node, code int)

	mu    sync.Mutex
	nodes []*node // by index-1
}

// newNode makes the namespace and identity of node name (n<i>).
func (c *cluster) newNode(name string) (*node, error) {
	i, err := strconv.Atoi(strings.TrimPrefix(name, "n"))
	if err != nil || !strings.HasPrefix(name, "n") {
		return nil, fmt.Errorf("node name %q is not n<i>", name)
	}
	ns, ip, err := c.lab.addHost(i)
	if err != nil {
		return nil, err
	}
	n := &node{c: c, idx: nodeIdx(i), name: name, ns: ns, ip: ip,
		dataDir: filepath.Join(c.dir, name, "data"), logPath: filepath.Join(c.dir, name+".log")}
	c.mu.Lock()
	for len(c.nodes) < i {
		c.nodes = append(c.nodes, nil)
	}
	c.nodes[i-1] = n
	c.mu.Unlock()
	return n, nil
}

func (c *cluster) byName(name string) *node {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		if n != nil && n.name == name {
			return n
		}
	}
	return nil
}

// all returns every node ever made, by index.
func (c *cluster) all() []*node {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []*node
	for _, n := range c.nodes {
		if n != nil {
			out = append(out, n)
		}
	}
	return out
}

// inState returns the nodes whose state is one of states.
func (c *cluster) inState(states ...nodeState) []*node {
	var out []*node
	for _, n := range c.all() {
		s := n.getState()
		for _, want := range states {
			if s == want {
				out = append(out, n)
				break
			}
		}
	}
	return out
}

func names(ns []*node) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = n.name
	}
	sort.Strings(out)
	return out
}

// start launches n's process joining every other node that is not gone and
// waits up to timeout for /readyz.
func (c *cluster) start(n *node, timeout time.Duration) error {
	var join []string
	for _, m := range c.all() {
		if m != n && m.getState() != stateGone && m.getState() != stateNew {
			join = append(join, m.gossipAddr())
		}
	}
	if err := n.launch(join); err != nil {
		return err
	}
	start := time.Now()
	if err := c.waitReady(n, timeout); err != nil {
		return err
	}
	c.tl.add(evReady, []string{n.name}, "in %v", time.Since(start).Round(time.Millisecond))
	return nil
}

// launch starts the process in n's namespace (ip netns exec execs the
// binary in place: the pid is the node's).
func (n *node) launch(join []string) error {
	c := n.c
	args := []string{"netns", "exec", n.ns, c.bin, "serve",
		"--node-name", n.name,
		"--data-dir", n.dataDir,
		"--http-addr", net.JoinHostPort(n.ip, strconv.Itoa(apiPort)),
		"--gossip-addr", n.gossipAddr(),
		"--shards", strconv.Itoa(c.shards),
		"--default-target", c.target,
	}
	args = append(args, nodeFlags...)
	if len(join) > 0 {
		args = append(args, "--join", strings.Join(join, ","))
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.starts++
	cur, err := testnode.Launch(testnode.Spec{Name: n.name, Path: "ip", Args: args, LogPath: n.logPath, Start: n.starts,
		OnExit: func(code int) {
			// The exit watcher tells a crash from an exit the harness caused.
			n.mu.Lock()
			expected := n.expectExit
			if !expected {
				n.state = stateDown
			}
			n.mu.Unlock()
			if !expected && c.onCrash != nil {
				c.onCrash(n, code)
			}
		}})
	if err != nil {
		return err
	}
	n.cur, n.state, n.expectExit = cur, stateUp, false
	c.tl.add(evStart, []string{n.name}, "start #%d, pid %d", n.starts, cur.Pid())
	return nil
}

// signal sends sig to n's running process; it returns the exit channel and
// whether the process was running.
func (n *node) signal(sig syscall.Signal, expectExit bool) (<-chan struct{}, bool) {
	n.mu.Lock()
	cur := n.cur
	if expectExit {
		n.expectExit = true
	}
	n.mu.Unlock()
	if cur == nil {
		return nil, false
	}
	return cur.Done(), cur.Signal(sig)
}

// kill sends SIGKILL (a crash: no drain, no leave) and waits for the exit.
func (n *node) kill() {
	if n.getState() == statePaused {
		n.signal(syscall.SIGCONT, false)
	}
	if done, ok := n.signal(syscall.SIGKILL, true); ok {
		<-done
	}
	n.mu.Lock()
	if n.state != stateGone {
		n.state = stateDown
	}
	n.mu.Unlock()
}

// waitStopped waits up to timeout until the process is in the stopped
// state (T in /proc/<pid>/stat) after a SIGSTOP.
func (n *node) waitStopped(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", n.pid()))
		if err != nil {
			return
		}
		// pid (comm) state …: the state follows the last ')'.
		if i := strings.LastIndexByte(string(b), ')'); i > 0 && i+2 < len(b) && (b[i+2] == 'T' || b[i+2] == 't') {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// stopOutcome is how a graceful stop ended.
type stopOutcome struct {
	code   int           // exit code; -1: killed
	took   time.Duration // from the SIGTERM to the exit (or the kill)
	second time.Duration // when the second SIGTERM went, after the first (0: not needed)
	why    string        // why the harness stopped waiting for the leave ("" if it did not)
	killed bool          // it outlived the second SIGTERM by leaveCutShort
}

// stop sends SIGTERM and waits for the exit while the leave makes progress
// (leaveWatch, polling /v1/cluster every leavePoll). When the harness stops
// waiting it sends a second SIGTERM, as an operator would, and SIGKILL
// leaveCutShort later. The leave's status when the grace passes, the
// second SIGTERM and the SIGKILL go into the timeline.
func (n *node) stop() (stopOutcome, error) {
	start := time.Now()
	done, running := n.signal(syscall.SIGTERM, true)
	if done == nil {
		return stopOutcome{}, fmt.Errorf("%s never started", n.name)
	}
	var out stopOutcome
	if running {
		w := newLeaveWatch(shutdownGrace, leaveStall, leaveLimit)
		tick := time.NewTicker(leavePoll)
		defer tick.Stop()
		graced := false
	wait:
		for {
			select {
			case <-done:
				break wait
			case <-tick.C:
			}
			st, ok := n.leave(done)
			select {
			case <-done:
				break wait
			default:
			}
			at := time.Since(start)
			w.observe(at, st, ok)
			if !graced && at >= shutdownGrace {
				graced = true
				n.c.tl.add(evNote, []string{n.name}, "grace (%v) passed, still leaving: %s", shutdownGrace, w.status())
			}
			if out.why = w.giveUp(at); out.why == "" {
				continue
			}
			out.second = time.Since(start)
			n.signal(syscall.SIGTERM, true)
			n.c.tl.add(evTerm, []string{n.name}, "second SIGTERM %v after the first: %s", out.second.Round(time.Millisecond), out.why)
			select {
			case <-done:
			case <-time.After(leaveCutShort):
				n.kill()
				out.killed = true
				n.c.tl.add(evKill, []string{n.name}, "SIGKILL: still running %v after the second SIGTERM", leaveCutShort)
			}
			break wait
		}
	}
	out.took = time.Since(start)
	out.code = n.process().ExitCode()
	if out.killed {
		out.code = -1
	}
	return out, nil
}

// leave reads replication.leave of n's GET /v1/cluster; ok is false when n
// did not answer (the call ends early when done closes) or reported no
// leave.
func (n *node) leave(done <-chan struct{}) (leaveStatus, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	go func() {
		select {
		case <-done:
			cancel()
		case <-ctx.Done():
		}
	}()
	code, body, err := n.c.doCtx(ctx, http.MethodGet, n.baseURL()+"/v1/cluster", nil)
	if err != nil || code != http.StatusOK {
		return leaveStatus{}, false
	}
	var v struct {
		Replication struct {
			Leave *leaveStatus `json:"leave"`
		} `json:"replication"`
	}
	if json.Unmarshal(body, &v) != nil || v.Replication.Leave == nil {
		return leaveStatus{}, false
	}
	return *v.Replication.Leave, true
}

// waitReady polls /readyz until it answers 200; it fails at once if the
// process exits, or after timeout.
func (c *cluster) waitReady(n *node, timeout time.Duration) error {
	return n.process().WaitReady(c.client, n.baseURL(), timeout)
}

// process is n's current (or last) process.
func (n *node) process() *testnode.Process {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.cur
}

// get fetches u with the admin client.
func (c *cluster) get(u string) (int, []byte, error) {
	return c.do(http.MethodGet, u, nil)
}

func (c *cluster) do(method, u string, body io.Reader) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return c.doCtx(ctx, method, u, body)
}

func (c *cluster) doCtx(ctx context.Context, method, u string, body io.Reader) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return 0, nil, err
	}
	if body != nil || (method != http.MethodGet && method != http.MethodHead) {
		req.Header.Set("Content-Type", "application/json") // every write, body or not
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	return resp.StatusCode, data, err
}

func (c *cluster) getJSON(u string, out any) error {
	code, body, err := c.get(u)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: HTTP %d %.200s", u, code, body)
	}
	if err := json.Unmarshal(body, out); err != nil {
		return fmt.Errorf("GET %s: decode: %w", u, err)
	}
	return nil
}

// clusterView is the part of GET /v1/cluster the run reads.
type clusterView struct {
	Node             string `json:"node"`
	OwnershipVersion uint64 `json:"ownership_version"`
	Members          []struct {
		Name  string `json:"name"`
		State string `json:"state"`
	} `json:"members"`
	Replication struct {
		// UnderReplicatedShards counts the node's primary shards with
		// fewer than R synced copies (as of its last repair poll).
		UnderReplicatedShards int `json:"under_replicated_shards"`
	} `json:"replication"`
}

func (v clusterView) memberSet() string {
	s := make([]string, 0, len(v.Members))
	for _, m := range v.Members {
		s = append(s, m.Name+":"+m.State)
	}
	sort.Strings(s)
	return strings.Join(s, ",")
}

// shardTable is GET /v1/shards reduced to the owner of each shard.
func (c *cluster) shardTable(n *node) ([]string, error) {
	var v struct {
		Shards []struct {
			Owner string `json:"owner"`
		} `json:"shards"`
	}
	if err := c.getJSON(n.baseURL()+"/v1/shards", &v); err != nil {
		return nil, err
	}
	out := make([]string, len(v.Shards))
	for i, s := range v.Shards {
		out[i] = s.Owner
	}
	return out, nil
}

// agreement checks that every up node lists exactly the up nodes, all
// active, and reports the same shard table in which each owns a shard. It
// returns "" when they agree, else what differs.
func (c *cluster) agreement() string {
	up := c.inState(stateUp)
	want := make([]string, len(up))
	for i, n := range up {
		want[i] = n.name + ":active"
	}
	sort.Strings(want)
	ws := strings.Join(want, ",")
	var table []string
	for _, n := range up {
		var v clusterView
		if err := c.getJSON(n.baseURL()+"/v1/cluster", &v); err != nil {
			return err.Error()
		}
		if got := v.memberSet(); got != ws {
			return fmt.Sprintf("%s sees %s, want %s", n.name, got, ws)
		}
		tb, err := c.shardTable(n)
		if err != nil {
			return err.Error()
		}
		if table == nil {
			table = tb
		} else if strings.Join(table, ",") != strings.Join(tb, ",") {
			return fmt.Sprintf("%s's shard table differs from %s's", n.name, up[0].name)
		}
	}
	owners := map[string]bool{}
	for _, o := range table {
		owners[o] = true
	}
	for _, n := range up {
		if !owners[n.name] {
			return n.name + " owns no shard"
		}
	}
	return ""
}

// ---- resources (leak check) ----

var goroutinesRE = regexp.MustCompile(`(?m)^go_goroutines ([0-9.e+]+)$`)

// resources reads n's goroutine count (/metrics), its fds and its TCP
// sockets (/proc/<pid>/net/tcp is its own namespace's table: every socket
// in it is the node's).
func (c *cluster) resources(n *node) (resources, error) {
	var r resources
	pid := n.pid()
	if pid == 0 {
		return r, fmt.Errorf("%s has no process", n.name)
	}
	code, body, err := c.get(n.baseURL() + "/metrics")
	if err != nil || code != http.StatusOK {
		return r, fmt.Errorf("GET %s/metrics: HTTP %d %v", n.name, code, err)
	}
	m := goroutinesRE.FindSubmatch(body)
	if m == nil {
		return r, fmt.Errorf("%s/metrics has no go_goroutines", n.name)
	}
	g, _ := strconv.ParseFloat(string(m[1]), 64)
	r.Goroutines = int(g)
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return r, err
	}
	r.FDs = len(ents)
	for _, e := range ents {
		if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			r.SocketFDs++
		}
	}
	for _, f := range []string{"tcp", "tcp6"} {
		if err := readTCP(fmt.Sprintf("/proc/%d/net/%s", pid, f), &r); err != nil {
			return r, err
		}
	}
	return r, nil
}

// readTCP counts established and CLOSE_WAIT sockets of a /proc/net/tcp
// table into r. The metrics scrape in progress is one server connection
// in every sample alike.
func readTCP(path string, r *resources) error {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 4 {
			continue
		}
		lport := hexPort(fs[1])
		rport := hexPort(fs[2])
		switch fs[3] {
		case "01": // ESTABLISHED
			switch {
			case lport == apiPort:
				r.Established.Server++
			case lport == gossipPort || rport == gossipPort:
				r.Established.Gossip++
			default:
				r.Established.Client++
			}
		case "08": // CLOSE_WAIT
			r.CloseWait++
		}
	}
	return sc.Err()
}

func hexPort(addr string) int {
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		return -1
	}
	p, err := strconv.ParseInt(addr[i+1:], 16, 32)
	if err != nil {
		return -1
	}
	return int(p)
}
