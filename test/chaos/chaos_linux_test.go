//go:build linux

package chaos

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/testnode"
)

// The run's load: namespaces with small and large quotas. Rates are mean
// rows/s (bursts alternate between a fifth and twice them); the target
// holds each delivery targetDelay, so the small quotas sit at their
// ceilings during bursts (a batch of a namespace's rows is claimed up to
// the ceiling at once) and the large one never does.
var loadNamespaces = []nsSpec{
	{Name: "tiny", Quota: 2, Rate: 25},
	{Name: "small", Quota: 8, Rate: 60},
	{Name: "medium", Quota: 32, Rate: 100},
	{Name: "large", Quota: 256, Rate: 120},
}

const (
	targetDelay = 40 * time.Millisecond
	shardCount  = 1024
	// readyTimeout bounds a node's start (join-wait is 10 s).
	readyTimeout = 60 * time.Second
	// monitorEvery is the cluster monitor's poll period.
	monitorEvery = 250 * time.Millisecond
	// The drain after the final heal waits while it makes progress: it
	// gives up once no acknowledged row was delivered for endDrainStall, or
	// after endDrainLimit or the run's duration, whichever is longer, in
	// all (less if the test's deadline is nearer: endReserve is kept for
	// the checks and the stop, so a failing run still reports). A quota-2
	// namespace's backlog grows with the run where the host delivers less
	// of it than is offered (the 2-core soak host: about 10 of tiny's 25
	// rows/s, each delivery holding its slot ~200 ms from claim to settle
	// for a target that answers in 40 ms), and drains slowly but steadily:
	// the liveness checks, not this limit, catch a wedge.
	endDrainStall = 60 * time.Second
	endDrainLimit = 20 * time.Minute
	endReserve    = 3 * time.Minute
	// locateRows is how many missing rows locateMissing looks up (the
	// earliest acknowledged; the violation names the first 8), and
	// nsStateBytes how much of each GET /v1/namespaces/{ns} answer it keeps.
	locateRows   = 64
	nsStateBytes = 2000
)

// TestChaos is the fault-injection soak: a seeded schedule of process and
// network faults against real fairshard processes, each in its own network
// namespace, under a steady multi-tenant load; then checkers over
// everything the target, the load and the monitor recorded. See doc.go.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("chaos: runs real processes for minutes; skipped with -short")
	}
	if why := labPrerequisites(); why != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("chaos: %s; CI must provide it", why)
		}
		t.Skipf("chaos: %s", why)
	}
	rs, err := settings()
	if err != nil {
		t.Fatal(err)
	}
	// Set-up, drain and checks take about a minute past the faults' time.
	if dl, ok := t.Deadline(); ok && time.Until(dl) < rs.Duration+5*time.Minute {
		t.Fatalf("chaos: -timeout leaves %v; a %v run needs %v more: %s",
			time.Until(dl).Round(time.Second), rs.Duration, 5*time.Minute, rs.replayCommand())
	}
	p := makePlan(rs.Seed, planOpts{Duration: rs.Duration, Nodes: rs.Nodes, MinNodes: 3, MaxNodes: rs.Nodes + 2, Wipe: rs.Wipe})
	t.Logf("chaos: seed %d; replay with:\n  %s\nplan: %s", rs.Seed, rs.replayCommand(), p)

	r := newRun(t, rs, p)
	r.execute()
	r.report()
}

// run is one chaos run's state.
type run struct {
	t    *testing.T
	rs   runSettings
	plan plan
	dir  string
	tl   *timeline
	lab  *netLab
	tgt  *target
	c    *cluster
	ld   *loader

	loadClient *http.Client

	topo sync.Mutex // partitions exclude joins and leaves

	mu       sync.Mutex
	samples  []viewSample
	problems []violation
	leaks    []leakSample
	baseline map[string]resources
	baseRuns map[string]int // node → process starts at the baseline

	finalHeal, converged time.Duration
	drain                drainRec
	locateOnce           sync.Once
	locate               map[int]string      // row → where the nodes said it is
	nsState              map[string][]string // namespace with missing rows → each up node's GET /v1/namespaces/{ns}
	cuts                 []cut               // guarded by mu
}

func newRun(t *testing.T, rs runSettings, p plan) *run {
	r := &run{t: t, rs: rs, plan: p, tl: &timeline{start: time.Now()}, baseline: map[string]resources{}, baseRuns: map[string]int{}, locate: map[int]string{}, nsState: map[string][]string{}}
	r.tl.logf = t.Logf
	dir, err := os.MkdirTemp("", "fairshard-chaos-")
	if err != nil {
		t.Fatal(err)
	}
	r.dir = dir
	t.Cleanup(func() {
		if t.Failed() || rs.Keep {
			t.Logf("chaos: work dir kept: %s (node logs n*.log, data dirs)", dir)
			return
		}
		_ = os.RemoveAll(dir)
	})
	// A plain build: the race detector instruments this test process,
	// which runs the target and the load.
	bin, err := testnode.Build(dir, false)
	if err != nil {
		t.Fatal(err)
	}
	lab, err := newNetLab()
	if err != nil {
		t.Fatalf("chaos: network lab: %v", err)
	}
	r.lab = lab
	t.Cleanup(lab.close)

	r.tgt = newTarget(r.tl.start, targetDelay, loadNamespaces)
	ln, err := lab.listen(targetPort)
	if err != nil {
		t.Fatalf("chaos: target listener in the hub: %v", err)
	}
	r.tgt.serve(ln)
	t.Cleanup(r.tgt.shutdown)

	mkClient := func(idle int) *http.Client {
		tr := &http.Transport{DialContext: lab.dialContext, MaxIdleConnsPerHost: idle, IdleConnTimeout: 30 * time.Second, ForceAttemptHTTP2: false}
		return &http.Client{Transport: tr}
	}
	r.c = &cluster{lab: lab, bin: bin, dir: dir, shards: shardCount, tl: r.tl, client: mkClient(4),
		target: fmt.Sprintf("http://%s:%d/deliver/{namespace}/{task_queue}", hubIP, targetPort)}
	r.c.onCrash = func(n *node, code int) {
		r.tl.add(evCrash, []string{n.name}, "exit code %d; log tail:\n%s", code, testnode.TailFile(n.logPath, 20))
	}
	t.Cleanup(func() {
		for _, n := range r.c.all() {
			n.kill()
		}
	})
	r.loadClient = mkClient(16)
	nodeIndex := func(name string) nodeIdx {
		if n := r.c.byName(name); n != nil {
			return n.idx
		}
		return 0
	}
	loadSpecs := make([]nsSpec, len(loadNamespaces))
	for i, ns := range loadNamespaces {
		loadSpecs[i] = ns
		loadSpecs[i].Rate *= rs.Rate
	}
	r.ld = newLoader(r.tl.start, r.loadClient, rs.Seed, loadSpecs, r.loadNodes, nodeIndex)
	return r
}

// loadNodes is every node not gone for good (the load, like a producer with
// a static node list, also tries nodes that are down or paused).
func (r *run) loadNodes() []loadNode {
	var out []loadNode
	for _, n := range r.c.all() {
		if s := n.getState(); s != stateGone && s != stateNew {
			out = append(out, loadNode{Idx: n.idx, URL: n.baseURL()})
		}
	}
	return out
}

func (r *run) problem(inv string, format string, args ...any) {
	v := violation{Invariant: inv, At: r.tl.now(), Summary: fmt.Sprintf(format, args...)}
	r.mu.Lock()
	r.problems = append(r.problems, v)
	r.mu.Unlock()
	r.tl.add(evNote, nil, "PROBLEM [%s] %s", inv, v.Summary)
}

// execute runs the whole scenario: cluster up, warm-up, baseline, faults,
// final heal, drain, leak sample, stop and store check.
func (r *run) execute() {
	t := r.t
	// Cluster up.
	for i, name := range r.plan.Initial {
		n, err := r.c.newNode(name)
		if err != nil {
			t.Fatal(err)
		}
		r.tgt.setNode(n.ip, n.idx)
		if err := r.c.start(n, readyTimeout); err != nil {
			t.Fatalf("chaos: initial node %d: %v", i+1, err)
		}
	}
	if took, why := r.waitAgreement(30 * time.Second); why != "" {
		t.Fatalf("chaos: the initial cluster did not converge: %s", why)
	} else {
		r.tl.add(evNote, nil, "%d nodes agree on one shard table (%v)", len(r.plan.Initial), took.Round(time.Millisecond))
	}
	for _, ns := range loadNamespaces {
		r.setQuota(ns)
	}

	// Warm-up: load without faults fills the connection pools the
	// baseline then sees.
	hard, cancelHard := context.WithCancel(context.Background())
	defer cancelHard()
	r.ld.run(hard)
	r.tl.add(evNote, nil, "load started: %s", describeLoad(r.ld.namespaces))
	time.Sleep(8 * time.Second)
	r.ld.setFactor(0)
	r.waitDrained("warm-up", 2*time.Minute, 0)
	r.sampleResources(true)
	r.ld.setFactor(1)

	// Faults.
	monCtx, stopMonitor := context.WithCancel(context.Background())
	monDone := make(chan struct{})
	go func() { defer close(monDone); r.monitor(monCtx) }()
	chaosStart := time.Now()
	r.tl.add(evNote, nil, "faults begin (%v)", r.rs.Duration)
	var lanes sync.WaitGroup
	lanes.Go(func() { r.processLane(chaosStart) })
	lanes.Go(func() { r.networkLane(chaosStart) })
	lanes.Wait()
	r.healAll()
	r.finalHeal = r.tl.now()
	r.tl.add(evHeal, nil, "final heal: every fault undone; faults ran %v", time.Since(chaosStart).Round(time.Millisecond))

	// Convergence after the last heal.
	if _, why := r.waitAgreement(60 * time.Second); why == "" {
		r.converged = r.tl.now()
		r.tl.add(evNote, nil, "every node agrees on one shard table %v after the final heal", (r.converged - r.finalHeal).Round(time.Millisecond))
	} else {
		r.tl.add(evNote, nil, "no agreement 60 s after the final heal: %s", why)
	}

	// Drain: stop making rows, let the workers finish their retries, then
	// wait, while rows keep arriving, until every acknowledged row is
	// delivered and nothing is left pending or claimed anywhere (a late
	// repeat delivery would come from those). The missing rows are located
	// before anything stops.
	r.ld.stop()
	giveUp := time.AfterFunc(3*time.Minute, cancelHard) // the workers' retries end here
	defer giveUp.Stop()
	r.ld.wait()
	limit := max(endDrainLimit, r.rs.Duration)
	if dl, ok := t.Deadline(); ok && time.Until(dl)-endReserve < limit {
		limit = max(time.Until(dl)-endReserve, time.Minute)
		r.tl.add(evNote, nil, "end: the test's deadline leaves the drain %v", limit.Round(time.Second))
	}
	r.drain = r.waitDrained("end", limit, endDrainStall)
	r.locateMissing()
	r.checkReplicas(90 * time.Second)
	stopMonitor()
	<-monDone

	r.sampleResources(false)
	r.stopAndCheckStores()
}

// checkReplicas waits until every shard's replicas agree (GET
// /v1/shards/{n} on an up node: every replica answered, synced, one
// digest), which repair must reach after the final heal; shards that
// still disagree at the deadline are a violation.
func (r *run) checkReplicas(timeout time.Duration) {
	start := time.Now()
	left := make([]int, shardCount)
	for i := range left {
		left[i] = i
	}
	last := ""
	for {
		up := r.c.inState(stateUp)
		if len(up) == 0 {
			r.problem("replicas-agree", "no node up to ask")
			return
		}
		still := left[:0]
		for _, s := range left {
			var v struct {
				InSync   bool `json:"in_sync"`
				Replicas []struct {
					Node   string `json:"node"`
					Synced bool   `json:"synced"`
					Rows   int64  `json:"rows"`
					Digest uint64 `json:"digest"`
				} `json:"replicas"`
			}
			if err := r.c.getJSON(fmt.Sprintf("%s/v1/shards/%d", up[s%len(up)].baseURL(), s), &v); err != nil || !v.InSync {
				still = append(still, s)
				last = fmt.Sprintf("shard %d: %+v %v", s, v.Replicas, err)
			}
		}
		left = still
		if len(left) == 0 {
			r.tl.add(evNote, nil, "every shard's replicas agree (%v)", time.Since(start).Round(time.Millisecond))
			return
		}
		if time.Since(start) > timeout {
			r.problem("replicas-agree", "%d shards' replicas still disagree %v after the drain; e.g. %s", len(left), timeout, last)
			return
		}
		time.Sleep(time.Second)
	}
}

func describeLoad(nss []nsSpec) string {
	var parts []string
	for _, ns := range nss {
		parts = append(parts, fmt.Sprintf("%s (quota %d, %.0f rows/s)", ns.Name, ns.Quota, ns.Rate))
	}
	return strings.Join(parts, ", ")
}

// setQuota PUTs the namespace's max_in_flight through one node and waits
// until every up node applies it.
func (r *run) setQuota(ns nsSpec) {
	up := r.c.inState(stateUp)
	body := fmt.Sprintf(`{"max_in_flight":%d}`, ns.Quota)
	code, resp, err := r.c.do(http.MethodPut, up[0].baseURL()+"/v1/namespaces/"+ns.Name, strings.NewReader(body))
	if err != nil || code != http.StatusOK {
		r.t.Fatalf("PUT /v1/namespaces/%s %s: HTTP %d %s %v", ns.Name, body, code, resp, err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for _, n := range up {
		for {
			var v struct {
				MaxInFlight int `json:"max_in_flight"`
			}
			err := r.c.getJSON(n.baseURL()+"/v1/namespaces/"+ns.Name, &v)
			if err == nil && v.MaxInFlight == ns.Quota {
				break
			}
			if time.Now().After(deadline) {
				r.t.Fatalf("namespace %s: quota %d not applied on %s after 15 s (%v, %d)", ns.Name, ns.Quota, n.name, err, v.MaxInFlight)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// waitAgreement polls until every up node agrees on one shard table.
func (r *run) waitAgreement(timeout time.Duration) (time.Duration, string) {
	start := time.Now()
	var why string
	for time.Since(start) < timeout {
		if why = r.c.agreement(); why == "" {
			return time.Since(start), ""
		}
		time.Sleep(100 * time.Millisecond)
	}
	return time.Since(start), why
}

// waitDrained waits until every acknowledged row has been delivered and no
// up node holds a pending or claimed row of the load's namespaces. It gives
// up after limit in all or, when stall > 0, once no acknowledged row was
// delivered for the first time in stall.
func (r *run) waitDrained(phase string, limit, stall time.Duration) drainRec {
	start := time.Now()
	rec := drainRec{from: r.tl.now()}
	seen := 0
	var delivered []bool
	lastMissing, progress := -1, start
	for {
		ds, _ := r.tgt.snapshotFrom(seen)
		seen += len(ds)
		for _, d := range ds {
			if d.ok && d.seq >= 0 {
				for len(delivered) <= d.seq {
					delivered = append(delivered, false)
				}
				delivered[d.seq] = true
			}
		}
		rows, _ := r.ld.ledger()
		missing := 0
		for seq, row := range rows {
			if row.ack != ackNone && (seq >= len(delivered) || !delivered[seq]) {
				missing++
			}
		}
		if lastMissing >= 0 && missing < lastMissing {
			progress = time.Now()
		}
		lastMissing = missing
		backlog := ""
		if missing == 0 {
			backlog = r.backlog()
			if backlog == "" {
				rec.to, rec.done = r.tl.now(), true
				r.tl.add(evNote, nil, "%s: every acknowledged row delivered and nothing pending or claimed (%v)", phase, time.Since(start).Round(time.Millisecond))
				return rec
			}
		}
		switch {
		case time.Since(start) >= limit:
			rec.why = fmt.Sprintf("after %v in all", limit.Round(time.Second))
		case stall > 0 && time.Since(progress) >= stall:
			rec.why = fmt.Sprintf("no acknowledged row delivered for %v", stall)
		}
		if rec.why != "" {
			if backlog == "" {
				backlog = r.backlog()
			}
			rec.to, rec.missing = r.tl.now(), missing
			r.tl.add(evNote, nil, "%s: gave up waiting (%s) after %v: %d acknowledged rows undelivered; %s", phase, rec.why, time.Since(start).Round(time.Millisecond), missing, backlog)
			return rec
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// backlog returns "" when no up node holds a pending or claimed row of the
// load's namespaces, else who holds what. Dead letters are a problem: the
// target never refuses.
func (r *run) backlog() string {
	var parts []string
	for _, n := range r.c.inState(stateUp) {
		for _, ns := range loadNamespaces {
			var v struct {
				Pending     int `json:"pending"`
				Claimed     int `json:"claimed"`
				DeadLetters int `json:"dead_letters"`
			}
			if err := r.c.getJSON(n.baseURL()+"/v1/namespaces/"+ns.Name, &v); err != nil {
				parts = append(parts, err.Error())
				continue
			}
			if v.Pending+v.Claimed > 0 {
				parts = append(parts, fmt.Sprintf("%s holds %d pending, %d claimed %s rows", n.name, v.Pending, v.Claimed, ns.Name))
			}
			if v.DeadLetters > 0 {
				parts = append(parts, fmt.Sprintf("%s holds %d dead letters of %s", n.name, v.DeadLetters, ns.Name))
			}
		}
	}
	return strings.Join(parts, "; ")
}

// sampleResources reads every up node's resources on an idle cluster
// (load stopped, pools of the load and of the target's side closed).
// before: the baseline; after: paired with the baseline of processes that
// lived through the whole run.
func (r *run) sampleResources(before bool) {
	r.loadClient.CloseIdleConnections()
	r.c.client.CloseIdleConnections()
	// The target closes idle keep-alive connections after 1 s; the nodes
	// notice (their pool's read loop ends) a moment later.
	time.Sleep(3 * time.Second)
	for _, n := range r.c.inState(stateUp) {
		res, err := r.c.resources(n)
		r.c.client.CloseIdleConnections()
		if err != nil {
			r.problem("no-fd-leak", "reading %s's resources: %v", n.name, err)
			continue
		}
		n.mu.Lock()
		starts := n.starts
		n.mu.Unlock()
		if before {
			r.baseline[n.name], r.baseRuns[n.name] = res, starts
			r.tl.add(evNote, []string{n.name}, "baseline: %d goroutines (%d explained by connections), %d fds (%d sockets)", res.Goroutines, res.explained(), res.FDs, res.SocketFDs)
			continue
		}
		b, ok := r.baseline[n.name]
		if !ok || r.baseRuns[n.name] != starts {
			continue // not the process of the baseline
		}
		r.leaks = append(r.leaks, leakSample{Node: n.name, Before: b, After: res})
		r.tl.add(evNote, []string{n.name}, "after: %d goroutines (%d explained by connections), %d fds (%d sockets), %d CLOSE_WAIT", res.Goroutines, res.explained(), res.FDs, res.SocketFDs, res.CloseWait)
	}
}

// monitor polls every up node's /v1/cluster until ctx ends: membership,
// ownership version and under-replicated shards.
func (r *run) monitor(ctx context.Context) {
	tick := time.NewTicker(monitorEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		up := r.c.inState(stateUp)
		s := viewSample{At: r.tl.now(), Views: map[string]nodeView{}, Expect: names(up)}
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, n := range up {
			wg.Go(func() {
				var v clusterView
				if err := r.c.getJSON(n.baseURL()+"/v1/cluster", &v); err != nil {
					return
				}
				mu.Lock()
				s.Views[n.name] = nodeView{Version: v.OwnershipVersion, Members: v.memberSet(), UnderReplicated: v.Replication.UnderReplicatedShards}
				mu.Unlock()
			})
		}
		wg.Wait()
		r.mu.Lock()
		r.samples = append(r.samples, s)
		r.mu.Unlock()
	}
}

// processLane runs the process faults one after another.
func (r *run) processLane(chaosStart time.Time) {
	for _, s := range r.plan.Process {
		time.Sleep(s.Gap)
		if time.Since(chaosStart) >= r.rs.Duration {
			return
		}
		r.tl.addEpisode(laneProcess, true, strings.TrimPrefix(s.String(), fmt.Sprintf("+%.1fs ", s.Gap.Seconds())))
		r.processStep(s)
		r.tl.addEpisode(laneProcess, false, string(s.Kind)+" "+s.Node)
	}
}

func (r *run) processStep(s planStep) {
	n := r.c.byName(s.Node)
	if s.Kind == faultKillWipe {
		// R copies survive a lost disk, not a second one in the same
		// replica set before shard sync made a new copy (README
		// "Replicated shards"): wipe only a fully replicated cluster.
		if why := r.waitFullyReplicated(60 * time.Second); why != "" {
			r.tl.add(evNote, []string{n.name}, "kill-wipe becomes a plain kill: the cluster is not fully replicated after 60 s (%s)", why)
			s.Kind = faultKill
		}
	}
	switch s.Kind {
	case faultKill, faultKillWipe:
		// Stamped once the process is reaped: an upper bound on its death,
		// so a delivery the target saw start before it may be one the node
		// had not committed (stamping before the signal, a descheduled
		// goroutine made kills look earlier than deliveries they cut).
		n.kill()
		r.tl.add(evKill, []string{n.name}, "SIGKILL (process reaped)")
		time.Sleep(s.Hold)
		if s.Kind == faultKillWipe {
			if err := os.RemoveAll(n.dataDir); err != nil {
				r.problem("harness", "wipe %s: %v", n.dataDir, err)
			}
			r.tl.add(evWipe, []string{n.name}, "data dir deleted")
		}
		r.startNode(n)
	case faultRestart:
		r.stopNode(n)
		r.startNode(n)
	case faultPause:
		n.setState(statePaused)
		n.signal(syscall.SIGSTOP, false)
		n.waitStopped(time.Second)
		r.tl.add(evStop, []string{n.name}, "SIGSTOP for %v (stopped)", s.Hold.Round(time.Millisecond))
		time.Sleep(s.Hold)
		n.signal(syscall.SIGCONT, false)
		if n.getState() == statePaused {
			n.setState(stateUp)
		}
		r.tl.add(evCont, []string{n.name}, "SIGCONT")
	case faultJoin:
		r.topo.Lock()
		defer r.topo.Unlock()
		n, err := r.c.newNode(s.Node)
		if err != nil {
			r.problem("harness", "join %s: %v", s.Node, err)
			return
		}
		r.tgt.setNode(n.ip, n.idx)
		r.startNode(n)
	case faultLeave:
		r.topo.Lock()
		defer r.topo.Unlock()
		code := r.stopNode(n)
		// README "Operations": a drain that could not hand everything off
		// exits non-zero and its rows wait on disk until the node returns.
		// An operator removing a node for good brings it back and stops it
		// again; so does the nemesis, a few times.
		for try := 1; code != 0 && try <= maxLeaveRetries; try++ {
			r.tl.add(evNote, []string{n.name}, "leave incomplete (exit %d): its rows wait on its disk; back with its data dir to hand them off (try %d)", code, try)
			r.startNode(n)
			code = r.stopNode(n)
		}
		if code != 0 {
			r.problem("leave-drained", "%s left for good after %d graceful stops that could not hand off every row; the rows stay on its disk", n.name, maxLeaveRetries+1)
		}
		n.setState(stateGone)
	}
}

// maxLeaveRetries is how often a leave whose drain was incomplete is
// retried (README "Operations": the node returns and hands its rows off).
const maxLeaveRetries = 3

// startNode starts n and waits for it to be ready.
func (r *run) startNode(n *node) {
	if err := r.c.start(n, readyTimeout); err != nil {
		r.problem("node-ready", "%v", err)
	}
}

// stopNode stops n gracefully (SIGTERM, then the wait for its leave) and
// returns the exit code (-1: it was killed).
func (r *run) stopNode(n *node) int {
	out, _ := r.stopGracefully(n, "")
	return out.code
}

// stopGracefully sends n SIGTERM and waits for the exit while its leave
// makes progress (node.stop), and records how it went; phase, if not "",
// says which stop it is. A stop that needed a second SIGTERM is a problem
// (leave-progress) unless a network fault overlapped it: a leave hands off
// every row it holds, however long that takes, as long as it can reach
// the replica sets. One that needed a SIGKILL is a problem (graceful-stop)
// either way, as is a node that could not be stopped (ok false).
func (r *run) stopGracefully(n *node, phase string) (out stopOutcome, ok bool) {
	what := ""
	if phase != "" {
		what = " (" + phase + ")"
	}
	from := r.tl.add(evTerm, []string{n.name}, "SIGTERM%s", what).At
	out, err := n.stop()
	if err != nil {
		r.problem("graceful-stop", "%s: %v", n.name, err)
		return stopOutcome{code: -1}, false
	}
	if out.killed {
		r.problem("graceful-stop", "%s%s: still running %v after a second SIGTERM (%v after the first); killed", n.name, what, leaveCutShort, out.second.Round(time.Millisecond))
	} else {
		second := ""
		if out.second > 0 {
			second = fmt.Sprintf(", a second SIGTERM at %v", out.second.Round(time.Millisecond))
		}
		r.tl.add(evExit, []string{n.name}, "exit code %d after %v%s%s", out.code, out.took.Round(time.Millisecond), second, what)
	}
	if out.second > 0 && !overlaps(networkEpisodes(r.tl.events()), interval{from, r.tl.now()}) {
		r.problem("leave-progress", "%s%s needed a second SIGTERM %v after the first, with no network fault during the stop: %s",
			n.name, what, out.second.Round(time.Millisecond), out.why)
	}
	return out, !out.killed
}

// networkLane runs the network faults one after another.
func (r *run) networkLane(chaosStart time.Time) {
	for _, s := range r.plan.Network {
		time.Sleep(s.Gap)
		if time.Since(chaosStart) >= r.rs.Duration {
			return
		}
		r.networkStep(s)
	}
}

func (r *run) networkStep(s planStep) {
	if s.Kind != faultLoss {
		r.topo.Lock()
		defer r.topo.Unlock()
	}
	nodes := r.c.inState(stateUp, statePaused, stateDown)
	members := names(nodes)
	ipOf := map[string]string{}
	for _, n := range nodes {
		ipOf[n.name] = n.ip
	}
	rules := map[string]*nsRules{}
	for _, n := range nodes {
		rules[n.name] = &nsRules{}
	}
	var desc string
	switch s.Kind {
	case faultLoss:
		for _, n := range nodes {
			rules[n.name].loseFromNodes(s.LossPct)
		}
		desc = fmt.Sprintf("loss %d%% between %s for %v", s.LossPct, strings.Join(members, ","), s.Hold.Round(time.Millisecond))
	default:
		a, b := resolveNetwork(s, members)
		ips := func(ns []string) []string {
			var out []string
			for _, n := range ns {
				out = append(out, ipOf[n])
			}
			return out
		}
		for _, n := range a {
			rules[n].cutFrom(ips(b))
		}
		for _, n := range b {
			rules[n].cutFrom(ips(a))
		}
		desc = fmt.Sprintf("%s %s | %s for %v", s.Kind, strings.Join(a, ","), strings.Join(b, ","), s.Hold.Round(time.Millisecond))
	}
	r.tl.addEpisode(laneNetwork, true, desc)
	for _, n := range nodes {
		if err := r.lab.setRules(n.ns, *rules[n.name]); err != nil {
			r.problem("harness", "%v", err)
		}
	}
	kind := evCut
	if s.Kind == faultLoss {
		kind = evLoss
	}
	cutAt := r.tl.add(kind, members, "%s", desc).At
	time.Sleep(s.Hold)
	for _, n := range nodes {
		if err := r.lab.setRules(n.ns, nsRules{}); err != nil {
			r.problem("harness", "%v", err)
		}
	}
	healAt := r.tl.add(evHeal, members, "rules removed").At
	if s.Kind != faultLoss {
		a, b := resolveNetwork(s, members)
		r.mu.Lock()
		r.cuts = append(r.cuts, cut{from: cutAt, to: healAt, sideA: a, sideB: b})
		r.mu.Unlock()
	}
	r.tl.addEpisode(laneNetwork, false, string(s.Kind))
}

// waitFullyReplicated waits until no node is down or paused and every up
// node reports nothing under-replicated and no shard syncing, twice, a
// repair poll apart (its figures are as of the last poll); it returns ""
// or, after timeout, why not.
func (r *run) waitFullyReplicated(timeout time.Duration) string {
	deadline := time.Now().Add(timeout)
	why, good := "", 0
	for time.Now().Before(deadline) {
		why = r.replicationGap()
		if why == "" {
			good++
			if good == 2 {
				return ""
			}
		} else {
			good = 0
		}
		time.Sleep(2500 * time.Millisecond)
	}
	return why
}

// replicationGap returns "" when the cluster holds every shard in full,
// else what is missing.
func (r *run) replicationGap() string {
	for _, n := range r.c.all() {
		if s := n.getState(); s == stateDown || s == statePaused {
			return n.name + " is down or paused"
		}
	}
	for _, n := range r.c.inState(stateUp) {
		var v struct {
			Replication struct {
				UnderReplicated bool `json:"under_replicated"`
				Syncing         int  `json:"syncing_shards"`
			} `json:"replication"`
		}
		if err := r.c.getJSON(n.baseURL()+"/v1/cluster", &v); err != nil {
			return err.Error()
		}
		if v.Replication.UnderReplicated || v.Replication.Syncing > 0 {
			return fmt.Sprintf("%s: under-replicated %v, %d shards syncing", n.name, v.Replication.UnderReplicated, v.Replication.Syncing)
		}
	}
	return ""
}

// healAll undoes whatever is left: rules, pauses, nodes down.
func (r *run) healAll() {
	for _, n := range r.c.all() {
		if n.getState() == stateNew || n.getState() == stateGone {
			continue
		}
		if err := r.lab.setRules(n.ns, nsRules{}); err != nil {
			r.problem("harness", "%v", err)
		}
		switch n.getState() {
		case statePaused:
			n.signal(syscall.SIGCONT, false)
			n.setState(stateUp)
			r.tl.add(evCont, []string{n.name}, "SIGCONT (final heal)")
		case stateDown:
			r.startNode(n)
		}
	}
}

// stopAndCheckStores stops the whole, drained cluster at once (SIGTERM to
// every node, as `docker compose down` does): every node must exit 0, its
// leave done without a second SIGTERM. The missing rows are located first
// (locateMissing), while every node still answers. Then it runs
// `fairshard check` on each data dir: the store's own consistency check
// after everything the run did to it.
func (r *run) stopAndCheckStores() {
	r.locateMissing() // a no-op if the drain's call ran
	var wg sync.WaitGroup
	for _, n := range r.c.inState(stateUp) {
		wg.Go(func() {
			out, ok := r.stopGracefully(n, "end of run, every node at once")
			if !ok {
				return // a problem already
			}
			n.setState(stateDown)
			if out.code != 0 && out.second == 0 { // after a second SIGTERM, leave-progress says why
				r.problem("graceful-stop", "%s exited %d after SIGTERM on a healed, drained cluster (want 0); log:\n%s", n.name, out.code, testnode.TailFile(n.logPath, 8))
			}
		})
	}
	wg.Wait()
	for _, n := range r.c.all() {
		if n.getState() == stateNew {
			continue
		}
		if _, err := os.Stat(n.dataDir); err != nil {
			continue
		}
		out, err := exec.Command(r.c.bin, "check", "--shards", strconv.Itoa(shardCount), n.dataDir).CombinedOutput()
		if err != nil {
			r.problem("store-consistent", "fairshard check %s (%s): %v\n%s", n.dataDir, n.name, err, strings.TrimSpace(string(out)))
		}
	}
}

// history gathers everything recorded into one history.
func (r *run) history() *history {
	h := &history{namespaces: r.ld.namespaces}
	for _, n := range r.c.all() {
		for len(h.nodes) <= int(n.idx) {
			h.nodes = append(h.nodes, "")
		}
		h.nodes[n.idx] = n.name
	}
	h.rows, h.attempts = r.ld.ledger()
	h.deliveries, h.strays = r.tgt.snapshot()
	h.events = r.tl.events()
	r.mu.Lock()
	h.samples = append([]viewSample(nil), r.samples...)
	h.leaks = append([]leakSample(nil), r.leaks...)
	r.mu.Unlock()
	h.finalHeal, h.converged, h.drain = r.finalHeal, r.converged, r.drain
	r.mu.Lock()
	h.cuts = slices.Clone(r.cuts)
	r.mu.Unlock()
	return h
}

// report runs the checkers and prints the figures; on a violation it prints
// the seed, the timeline and the first violation with its rows, and fails.
func (r *run) report() {
	t := r.t
	h := r.history()
	vs, f := check(h, checkOpts{})
	r.mu.Lock()
	vs = append(append([]violation(nil), r.problems...), vs...)
	r.mu.Unlock()
	sort.SliceStable(vs, func(i, j int) bool {
		ai, aj := vs[i].At, vs[j].At
		if ai < 0 {
			ai = 1 << 62
		}
		if aj < 0 {
			aj = 1 << 62
		}
		return ai < aj
	})
	errs, bad := r.ld.errors()
	for _, b := range bad {
		vs = append(vs, violation{Invariant: "append-accepted", At: -1, Summary: b})
	}
	t.Logf("chaos figures (seed %d, %v of faults):\n%s\nappend failures by kind (all retried): %v", r.rs.Seed, r.rs.Duration, formatFigures(f, h), errs)
	if len(vs) == 0 {
		return
	}
	// Where are the rows an undelivered violation names, and where is
	// their namespaces' capacity?
	var located []int // every located row still undelivered, by acknowledgement
	for _, v := range vs {
		if v.Invariant == "acknowledged-delivered" {
			t.Logf("where the undelivered rows are (asked before any node stopped):\n%s", r.formatLocated(h, v.Seqs))
			delivered := map[int]bool{}
			for _, d := range h.deliveries {
				if d.ok {
					delivered[d.seq] = true
				}
			}
			for seq := range r.locate {
				if !delivered[seq] {
					located = append(located, seq)
				}
			}
			sort.Slice(located, func(i, j int) bool { return h.rows[located[i]].acked < h.rows[located[j]].acked })
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "chaos: %d invariant violations. Seed %d; replay with:\n  %s\n\n", len(vs), r.rs.Seed, r.rs.replayCommand())
	fmt.Fprintf(&b, "fault timeline:\n%s\n", formatTimeline(h.events))
	fmt.Fprintf(&b, "first violated invariant:\n%s\n", formatViolation(h, vs[0]))
	if len(vs) > 1 {
		b.WriteString("\nothers:\n")
		for _, v := range vs[1:] {
			fmt.Fprintf(&b, "  [%s] %s\n", v.Invariant, v.Summary)
		}
	}
	for _, n := range r.c.all() {
		fmt.Fprintf(&b, "\n---- tail of %s's log (%s) ----\n%s\n", n.name, n.logPath, testnode.TailFile(n.logPath, 25))
	}
	// Every violation in full, for the post-mortem, beside the node logs.
	var full strings.Builder
	fmt.Fprintf(&full, "seed %d; replay with:\n  %s\n\nfigures:\n%s\n\n", r.rs.Seed, r.rs.replayCommand(), formatFigures(f, h))
	for _, v := range vs {
		full.WriteString(formatViolation(h, v) + "\n\n")
	}
	if len(located) > 0 {
		fmt.Fprintf(&full, "undelivered rows located before any node stopped (the first %d by acknowledgement):\n%s\n", locateRows, r.formatLocated(h, located))
	}
	fmt.Fprintf(&full, "fault timeline:\n%s", formatTimeline(h.events))
	report := filepath.Join(r.dir, "report.txt")
	if err := os.WriteFile(report, []byte(full.String()), 0o644); err == nil {
		fmt.Fprintf(&b, "\nevery violation with its rows: %s\n", report)
	}
	t.Error(b.String())
}

// locateRow asks the up nodes (before they stop) where a row is; at report
// time the nodes are stopped, so this reads what run.locate kept.
func (r *run) locateRow(h *history, seq int) string {
	if s, ok := r.locate[seq]; ok {
		return s
	}
	return "(not located: nodes stopped)"
}

// locateMissing asks the up nodes where the acknowledged, undelivered rows
// are, once, before any node stops (every path that ends the run calls it
// before its stops): GET /v1/rows/{key} for the first locateRows of them by
// acknowledgement time (the violation names the first 8, so they are among
// them), and for each namespace with missing rows GET /v1/namespaces/{ns}
// on every up node, kept raw (nsStateBytes of each answer): where its
// capacity is.
func (r *run) locateMissing() {
	r.locateOnce.Do(func() {
		rows, _ := r.ld.ledger()
		ds, _ := r.tgt.snapshot()
		got := make([]bool, len(rows))
		for _, d := range ds {
			if d.ok && d.seq >= 0 && d.seq < len(rows) {
				got[d.seq] = true
			}
		}
		var missing []int
		nss := map[uint8]bool{}
		for seq, row := range rows {
			if row.ack != ackNone && !got[seq] {
				missing = append(missing, seq)
				nss[row.ns] = true
			}
		}
		sort.Slice(missing, func(i, j int) bool { return rows[missing[i]].acked < rows[missing[j]].acked })
		up := r.c.inState(stateUp)
		for _, seq := range firstInts(missing, locateRows) {
			row := rows[seq]
			key := rowKey(loadNamespaces[row.ns].Name, seq)
			where := "no node answered"
			for _, nd := range up {
				code, body, err := r.c.get(nd.baseURL() + "/v1/rows/" + url.PathEscape(key))
				if err == nil {
					where = fmt.Sprintf("HTTP %d %s", code, strings.TrimSpace(string(body)))
					break
				}
			}
			r.locate[seq] = where
		}
		for i, ns := range loadNamespaces {
			if !nss[uint8(i)] {
				continue
			}
			for _, nd := range up {
				code, body, err := r.c.get(nd.baseURL() + "/v1/namespaces/" + url.PathEscape(ns.Name))
				var line string
				if err != nil {
					line = fmt.Sprintf("%s: %v", nd.name, err)
				} else {
					b := strings.TrimSpace(string(body))
					if len(b) > nsStateBytes {
						b = b[:nsStateBytes] + "…"
					}
					line = fmt.Sprintf("%s: HTTP %d %s", nd.name, code, b)
				}
				r.nsState[ns.Name] = append(r.nsState[ns.Name], line)
			}
		}
		if len(missing) > 0 {
			r.tl.add(evNote, nil, "located %d of %d acknowledged, undelivered rows; kept the state of %d namespaces on %d nodes",
				min(len(missing), locateRows), len(missing), len(r.nsState), len(up))
		}
	})
}

// formatLocated renders where the nodes said the rows seqs are (before any
// node stopped) and the state of their namespaces on every up node.
func (r *run) formatLocated(h *history, seqs []int) string {
	var b strings.Builder
	nss := map[string]bool{}
	for _, seq := range seqs {
		ns := h.namespaces[h.rows[seq].ns].Name
		nss[ns] = true
		fmt.Fprintf(&b, "  %s (acknowledged at %.3fs): %s\n", rowKey(ns, seq), h.rows[seq].acked.Seconds(), r.locateRow(h, seq))
	}
	for _, ns := range h.namespaces {
		if !nss[ns.Name] {
			continue
		}
		fmt.Fprintf(&b, "  GET /v1/namespaces/%s on every up node:\n", ns.Name)
		lines := r.nsState[ns.Name]
		if len(lines) == 0 {
			lines = []string{"(not read: nodes stopped)"}
		}
		for _, l := range lines {
			fmt.Fprintf(&b, "    %s\n", l)
		}
	}
	return b.String()
}
