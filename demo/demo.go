// Package demo runs `fairshard demo`: a local cluster of real nodes on
// loopback (real gossip, real bbolt files under a temp dir, real HTTP), a
// built-in delivery target and multi-tenant load, with a live view and a
// closing summary. Every row is kept on two nodes (replicated shards,
// R = 2). Part-way through it adds a node, then kills one abruptly and
// deletes its data dir (a lost machine: its rows live on in their other
// copy), and later stops one gracefully, so shards and rows visibly move
// and the summary shows that nothing was lost.
package demo

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/fairshard/fairshard/client"
	"github.com/fairshard/fairshard/internal/webui"
	"github.com/fairshard/fairshard/loadgen"
	"github.com/fairshard/fairshard/node"
)

// Options shape a demo run.
type Options struct {
	// Nodes is the initial cluster size (≥ 2). Defaults to 3.
	Nodes int
	// Duration is how long load runs. Defaults to 36 s (the whole demo,
	// drain included, stays under a minute).
	Duration time.Duration
	// Rate is the offered load in rows/s. Defaults to 1500.
	Rate float64
	// Keep leaves the cluster running after the summary until ctx ends,
	// printing its URLs.
	Keep bool
	// Dir holds the nodes' data dirs; a temp dir (removed after) when empty.
	Dir string
	// Out receives the view and the summary.
	Out io.Writer
	// TTY rewrites one progress line in place each second; otherwise plain periodic
	// lines are printed (for logs and pipes).
	TTY bool
	// Log receives the nodes' logs; nil discards.
	Log *slog.Logger
}

// namespaces of the demo load: a noisy tenant over four task queues, a
// quiet one, and one with a small quota. small's share of the load (1 of
// 14 parts, about 107 rows/s at the default rate) fits its quota of 4 at
// the target's 20 ms with room to spare: in exact mode the cluster runs
// at most 4 of its rows at once, where proportional ceilings would let 6
// to 8 run.
var namespaces = []struct {
	name   string
	weight int
	queues int
	quota  uint32 // 0: the default
}{
	{"noisy", 12, 4, 64},
	{"quiet", 1, 1, 0},
	{"small", 1, 1, 4},
}

// Summary is what the demo measured.
type Summary struct {
	Appended  int64
	Delivered int
	// Pending counts appended rows not delivered when the demo ended that
	// the cluster still holds, pending or in delivery (a namespace held at
	// its quota drains after the demo), or delivered since; Lost counts
	// the ones it does not.
	Pending        int
	Lost           int
	DeliveredTwice int
	// Synced counts rows copied by shard sync (joins, the re-replication
	// after the kill and wipe); Dropped the copies nodes deleted once
	// their new replica sets held them (rebalance, drain).
	Synced, Dropped float64
	// Wiped names the node killed with its data dir deleted ("" if none).
	Wiped string
	// Factor is the replication factor: copies of every row.
	Factor int
	// LostKeys are up to 10 of the lost rows' dispatch_keys.
	LostKeys   []string
	Namespaces []loadgen.NamespaceReport
	Quotas     map[string]uint32
}

type member struct {
	name string
	n    *node.Node
	url  string
	dir  string
	stop bool
}

type demoRun struct {
	opts   Options
	dir    string
	recv   *loadgen.Receiver
	target string
	// view reads the cluster for the live view: one attempt, bounded by
	// viewTimeout, so a stopped node costs one refresh of its numbers.
	view    *client.Client
	mu      sync.Mutex
	members []*member
	// bg holds the graceful stop running beside the view; closeAll waits
	// for it so a node is never hard-closed mid-drain.
	bg sync.WaitGroup
	// wiped is the node killed and wiped (guarded by mu).
	wiped string
	// secret and gossipKey are the run's cluster secret and gossip key
	// (fresh per run): the demo runs secured, as production should.
	secret    string
	gossipKey []byte
}

// Run runs the demo until the load ends and every appended row is delivered
// (or 30 s more pass), then prints the summary. It returns an error when a
// row was lost.
func Run(ctx context.Context, opts Options) (Summary, error) {
	opts = opts.withDefaults()
	d := newDemoRun(opts)
	if d.dir == "" {
		tmp, err := os.MkdirTemp("", "fairshard-demo-")
		if err != nil {
			return Summary{}, err
		}
		defer os.RemoveAll(tmp)
		d.dir = tmp
	}
	stopTarget, err := d.startTarget()
	if err != nil {
		return Summary{}, err
	}
	defer stopTarget()

	defer d.closeAll()
	err = d.startCluster(ctx)
	if d.view != nil {
		defer d.view.Close()
	}
	if err != nil {
		return Summary{}, err
	}
	d.printIntro()

	appended := &sync.Map{}
	gen, err := d.newLoad(appended)
	if err != nil {
		return Summary{}, err
	}
	rep, err := d.watch(ctx, gen, appended)
	if err != nil {
		return Summary{}, err
	}
	sum := d.summarize(rep, appended)
	d.printSummary(sum)
	if opts.Keep {
		d.keepRunning(ctx)
	}
	if sum.Lost > 0 {
		return sum, fmt.Errorf("demo: %d rows lost", sum.Lost)
	}
	return sum, nil
}

// withDefaults fills the options left zero: 3 nodes, 36 s of load at
// 1500 rows/s, no output, no logs. Out is wrapped so that concurrent
// writers (the view and the events of a graceful stop running beside it)
// keep lines whole and the caller's writer race-free.
func (opts Options) withDefaults() Options {
	if opts.Nodes < 2 {
		opts.Nodes = 3
	}
	if opts.Duration <= 0 {
		opts.Duration = 36 * time.Second
	}
	if opts.Rate <= 0 {
		opts.Rate = 1500
	}
	if opts.Out == nil {
		opts.Out = io.Discard
	}
	opts.Out = &lockedWriter{w: opts.Out}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return opts
}

// newDemoRun starts a run of opts with a fresh cluster secret and gossip
// key: the demo runs secured, as production should.
func newDemoRun(opts Options) *demoRun {
	d := &demoRun{opts: opts, dir: opts.Dir, gossipKey: make([]byte, 32)}
	secret := make([]byte, 16)
	_, _ = rand.Read(secret)
	_, _ = rand.Read(d.gossipKey)
	d.secret = hex.EncodeToString(secret)
	return d
}

// startTarget starts the delivery target on a loopback port: it holds
// each request 20 ms, like a real service. It returns the function that
// stops it.
func (d *demoRun) startTarget() (stop func(), err error) {
	d.recv = loadgen.NewReceiver(20 * time.Millisecond)
	tln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo target: %w", err)
	}
	tsrv := &http.Server{Handler: d.recv, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = tsrv.Serve(tln) }()
	d.target = "http://" + tln.Addr().String() + "/deliver/{namespace}/{task_queue}"
	return func() { _ = tsrv.Close() }, nil
}

// startCluster starts the initial nodes, opens the view's client on them
// and configures the demo's namespaces. The caller closes the nodes
// (closeAll) and the view, also on error.
func (d *demoRun) startCluster(ctx context.Context) error {
	for i := range d.opts.Nodes {
		if err := d.addNode(ctx, i+1); err != nil {
			return err
		}
	}
	view, err := client.New(client.Options{Nodes: d.urls(), Timeout: viewTimeout, Retry: client.RetryConfig{MaxAttempts: 1}})
	if err != nil {
		return err
	}
	d.view = view
	return d.configure(ctx)
}

// newLoad builds the load of the demo's namespaces, weighted, over the
// initial nodes; every row a node acknowledges is recorded in appended.
func (d *demoRun) newLoad(appended *sync.Map) (*loadgen.Generator, error) {
	var nsCfg []loadgen.Namespace
	for _, ns := range namespaces {
		nsCfg = append(nsCfg, loadgen.Namespace{Name: ns.name, Weight: ns.weight, TaskQueues: ns.queues})
	}
	return loadgen.NewGenerator(loadgen.Config{
		Nodes: d.urls(), Namespaces: nsCfg, Rate: d.opts.Rate, Duration: d.opts.Duration,
		BatchSize: 50, Concurrency: 4, KeyPrefix: "demo-",
		OnAppended: func(key, _, _ string) { appended.Store(key, true) },
	})
}

// watch runs the load and renders the view once a second while the
// script plays, until the load has ended and every appended row was
// delivered, or 30 s after the load ended. It returns the load's report.
func (d *demoRun) watch(ctx context.Context, gen *loadgen.Generator, appended *sync.Map) (loadgen.Report, error) {
	loadDone := make(chan loadgen.Report, 1)
	go func() {
		rep, _ := gen.Run(ctx)
		loadDone <- rep
	}()

	start := time.Now()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	var script demoScript
	var rep loadgen.Report
	loadRunning := true
	var lastDelivered int64
	drainDeadline := time.Time{}
	for {
		select {
		case <-ctx.Done():
			return rep, ctx.Err()
		case rep = <-loadDone:
			loadRunning = false
			drainDeadline = time.Now().Add(30 * time.Second)
			d.event("load finished: %d rows appended", rep.Appended)
			continue
		case <-tick.C:
		}
		el := time.Since(start)
		script.play(ctx, d, el)
		delivered := d.recv.Delivered()
		d.render(el, delivered-lastDelivered, gen.Appended())
		lastDelivered = delivered
		if !loadRunning {
			n := 0
			appended.Range(func(k, _ any) bool { n++; return true })
			if d.recv.Distinct() >= n || time.Now().After(drainDeadline) {
				return rep, nil
			}
		}
	}
}

// demoScript is the cluster changes the demo plays under load, each once:
// a node joins at a third of the load, node n2 is killed and wiped at
// half, node n1 stops gracefully at two thirds.
type demoScript struct {
	added, wiped, stopped bool
}

// play makes each change whose time has come, el after the load started.
func (s *demoScript) play(ctx context.Context, d *demoRun, el time.Duration) {
	dur := d.opts.Duration
	if !s.added && el >= dur/3 {
		s.added = true
		if err := d.addNode(ctx, d.opts.Nodes+1); err != nil {
			d.event("adding a node failed: %v", err)
		} else {
			d.event("node n%d joined: shards move to it", d.opts.Nodes+1)
		}
	}
	if !s.wiped && el >= dur/2 {
		s.wiped = true
		d.killAndWipe(2)
	}
	if !s.stopped && el >= 2*dur/3 {
		s.stopped = true
		d.bg.Go(func() { d.stopNode(1) })
	}
}

// keepRunning lists the live nodes and the target, then waits for ctx to
// end (--keep).
func (d *demoRun) keepRunning(ctx context.Context) {
	out := d.opts.Out
	fmt.Fprintln(out, "\n--keep: the cluster keeps running; Ctrl-C to stop it.")
	for _, m := range d.live() {
		fmt.Fprintf(out, "  %s  API %s  metrics %s/metrics\n", m.name, m.url, m.url)
	}
	fmt.Fprintf(out, "  target %s\n", strings.TrimSuffix(d.target, "/deliver/{namespace}/{task_queue}"))
	<-ctx.Done()
}

// event prints one line about what the demo did; on a terminal it
// replaces the progress line, which the next tick redraws below it.
func (d *demoRun) event(format string, args ...any) {
	erase := ""
	if d.opts.TTY {
		erase = "\r\033[K"
	}
	fmt.Fprintf(d.opts.Out, "%sevent: %s\n", erase, fmt.Sprintf(format, args...))
}

func (d *demoRun) addNode(ctx context.Context, i int) error {
	cfg := node.DefaultConfig()
	cfg.NodeName = fmt.Sprintf("n%d", i)
	cfg.DataDir = filepath.Join(d.dir, cfg.NodeName)
	cfg.HTTPAddr = fmt.Sprintf("127.0.0.%d:0", i)
	cfg.GossipAddr = fmt.Sprintf("127.0.0.%d:0", i)
	cfg.GossipProfile = "fast"
	cfg.ClusterSecret, cfg.GossipKeys = d.secret, [][]byte{d.gossipKey}
	cfg.DefaultTarget = d.target
	cfg.Replication.LeftoverInterval = time.Second
	cfg.ShutdownGrace = 15 * time.Second
	// Exact quota mode (the default): a 3 s lease, so a coordinator moved
	// by the demo's join and leave learns for 3 s rather than 10 (the fast
	// gossip profile detects changes in about a second).
	cfg.Lease.LeaseLength = 3 * time.Second
	if live := d.live(); len(live) > 0 {
		cfg.Join = []string{live[0].n.GossipAddr()}
	}
	n, err := node.New(cfg, d.opts.Log.With("node", cfg.NodeName))
	if err != nil {
		return fmt.Errorf("demo: create %s: %w", cfg.NodeName, err)
	}
	if err := n.Start(ctx); err != nil {
		_ = n.Close()
		return fmt.Errorf("demo: start %s: %w", cfg.NodeName, err)
	}
	d.mu.Lock()
	d.members = append(d.members, &member{name: cfg.NodeName, n: n, url: "http://" + n.APIAddr(), dir: cfg.DataDir})
	d.mu.Unlock()
	return nil
}

func (d *demoRun) stopNode(idx int) {
	d.mu.Lock()
	if idx >= len(d.members) {
		d.mu.Unlock()
		return
	}
	m := d.members[idx]
	d.mu.Unlock()
	// As an operator would: drain a node only once every shard has its R
	// synced copies again (after the kill and wipe), so no row's only
	// copy leaves with it.
	if !d.waitReplicated(20 * time.Second) {
		d.event("the cluster is still under-replicated after 20 s; stopping %s anyway", m.name)
	}
	d.mu.Lock()
	m.stop = true
	d.mu.Unlock()
	d.event("stopping %s gracefully: it drains and hands its rows off", m.name)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := m.n.Shutdown(ctx); err != nil {
		d.event("%s stopped with: %v", m.name, err)
		return
	}
	d.event("%s left the cluster", m.name)
}

// killAndWipe closes member idx at once (no drain, no leave: a crash)
// and deletes its data dir, as when a machine and its disk are lost.
func (d *demoRun) killAndWipe(idx int) {
	d.mu.Lock()
	if idx >= len(d.members) {
		d.mu.Unlock()
		return
	}
	m := d.members[idx]
	m.stop = true
	d.wiped = m.name
	d.mu.Unlock()
	_ = m.n.Close()
	if err := os.RemoveAll(m.dir); err != nil {
		d.event("killed %s; deleting its data dir failed: %v", m.name, err)
		return
	}
	d.event("killed %s and deleted its data dir: its rows live on in their second copy", m.name)
}

// waitReplicated waits up to timeout until every live node reports no
// under-replicated shard and none syncing.
func (d *demoRun) waitReplicated(timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ok := true
		for _, m := range d.live() {
			ctx, cancel := context.WithTimeout(context.Background(), viewTimeout)
			cv, err := d.on(m.url).Cluster(ctx)
			cancel()
			if err != nil || cv.Replication.UnderReplicated || cv.Replication.SyncingShards > 0 {
				ok = false
				break
			}
		}
		if ok {
			return true
		}
		time.Sleep(200 * time.Millisecond)
	}
	return false
}

func (d *demoRun) live() []*member {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []*member
	for _, m := range d.members {
		if !m.stop {
			out = append(out, m)
		}
	}
	return out
}

func (d *demoRun) urls() []string {
	var out []string
	for _, m := range d.live() {
		out = append(out, m.url)
	}
	return out
}

func (d *demoRun) closeAll() {
	d.bg.Wait()
	d.mu.Lock()
	ms := d.members
	d.mu.Unlock()
	for _, m := range ms {
		_ = m.n.Close()
	}
}

// viewTimeout bounds each read of the live view.
const viewTimeout = 2 * time.Second

// configure sets the demo namespaces' quotas through the API client (with
// its retries: the settings must land).
func (d *demoRun) configure(ctx context.Context) error {
	c, err := client.New(client.Options{Nodes: d.urls()})
	if err != nil {
		return err
	}
	defer c.Close()
	for _, ns := range namespaces {
		if ns.quota == 0 {
			continue
		}
		if _, err := c.SetMaxInFlight(ctx, ns.name, ns.quota); err != nil {
			return fmt.Errorf("demo: set quota of %s: %w", ns.name, err)
		}
	}
	return nil
}

// on returns the view client pinned to one node (namespace counts are per
// node).
func (d *demoRun) on(url string) *client.Client {
	c, err := d.view.WithNodes(url)
	if err != nil {
		panic(err) // the URL came from a node we started
	}
	return c
}

// render writes one progress line (at most progressWidth characters):
// time, rows appended and delivered, live nodes, and per namespace the
// rows in flight (claimed, summed over the live nodes) and pending. On a
// terminal it rewrites one line in place with a bar of the load's
// progress; otherwise it prints a line each second.
func (d *demoRun) render(el time.Duration, deliveredPerSec, appended int64) {
	live := d.live()
	type agg struct{ pending, claimed int }
	sums := map[string]*agg{}
	for _, m := range live {
		ctx, cancel := context.WithTimeout(context.Background(), viewTimeout)
		list, err := d.on(m.url).ListNamespaces(ctx)
		cancel()
		if err != nil {
			continue
		}
		for _, v := range list {
			a := sums[v.Name]
			if a == nil {
				a = &agg{}
				sums[v.Name] = a
			}
			a.pending += v.Pending
			a.claimed += v.Claimed
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "t=%.0fs appended=%d delivered=%d (%d/s) nodes=%d | in flight/pending", el.Seconds(), appended,
		d.recv.Delivered(), deliveredPerSec, len(live))
	for _, ns := range namespaces {
		a := sums[ns.name]
		if a == nil {
			a = &agg{}
		}
		fmt.Fprintf(&b, " %s %d/%d", ns.name, a.claimed, a.pending)
	}
	line := b.String()
	if !d.opts.TTY {
		fmt.Fprintln(d.opts.Out, line)
		return
	}
	const barWidth = 20
	done := min(int(barWidth*el/d.opts.Duration), barWidth)
	bar := "[" + strings.Repeat("#", done) + strings.Repeat(".", barWidth-done) + "] "
	if len(bar)+len(line) > progressWidth {
		line = line[:progressWidth-len(bar)]
	}
	fmt.Fprint(d.opts.Out, "\r\033[K"+bar+line)
}

// progressWidth bounds a progress line (characters), so it does not wrap
// on an ordinary terminal.
const progressWidth = 120

// printIntro states what the demo runs before it starts: the cluster, the
// console's address and the tenants with their share of the load and
// their quota.
func (d *demoRun) printIntro() {
	out := d.opts.Out
	fmt.Fprintf(out, "fairshard demo: %d nodes on loopback, data under %s\n", d.opts.Nodes, d.dir)
	if live := d.live(); len(live) > 0 {
		fmt.Fprintf(out, "console: %s%s (on every node)\n", live[0].url, webui.Prefix)
	}
	fmt.Fprintf(out, "load: %.0f rows/s for %v; a node joins at 1/3, one is killed and wiped at 1/2, one stops at 2/3\n\n",
		d.opts.Rate, d.opts.Duration)
	total := 0
	for _, ns := range namespaces {
		total += ns.weight
	}
	fmt.Fprintf(out, "%-9s %8s %7s  %s\n", "TENANT", "LOAD", "QUEUES", "QUOTA (rows delivered at once, cluster-wide)")
	for _, ns := range namespaces {
		q := "the default (--default-max-in-flight)"
		if ns.quota > 0 {
			q = fmt.Sprint(ns.quota)
		}
		fmt.Fprintf(out, "%-9s %6.0f/s %7d  %s\n", ns.name, d.opts.Rate*float64(ns.weight)/float64(total), ns.queues, q)
	}
	fmt.Fprintln(out)
}

func (d *demoRun) summarize(rep loadgen.Report, appended *sync.Map) Summary {
	sum := Summary{Appended: rep.Appended, Delivered: d.recv.Distinct(), Quotas: map[string]uint32{}}
	keys := d.recv.Keys()
	var undelivered []string
	appended.Range(func(k, _ any) bool {
		if keys[k.(string)] == 0 {
			undelivered = append(undelivered, k.(string))
		}
		return true
	})
	sum.Pending, sum.Lost, sum.LostKeys = d.classify(undelivered)
	for _, n := range keys {
		if n > 1 {
			sum.DeliveredTwice++
		}
	}
	sum.Namespaces = d.recv.Namespaces()
	for _, ns := range namespaces {
		sum.Quotas[ns.name] = ns.quota
	}
	d.mu.Lock()
	ms := d.members
	d.mu.Unlock()
	for _, m := range ms {
		sum.Synced += counterValue(m.n, "fairshard_replication_sync_rows_total")
		sum.Dropped += counterValue(m.n, "fairshard_replication_dropped_rows_total")
		if f := int(counterValue(m.n, "fairshard_replication_factor")); f > sum.Factor {
			sum.Factor = f
		}
	}
	d.mu.Lock()
	sum.Wiped = d.wiped
	d.mu.Unlock()
	return sum
}

// classify looks the undelivered keys up through a live node (16 at a
// time, each lookup tried up to 3 times with a 10 s timeout): a row the
// cluster holds pending or claimed, or that was delivered since the tally
// (done), is still pending; anything else (not found, a dead letter, or no
// answer) is lost, and the first few are printed with what the cluster
// said; lostKeys are up to 10 of the lost.
func (d *demoRun) classify(keys []string) (pending, lost int, lostKeys []string) {
	live := d.live()
	if len(live) == 0 {
		return 0, len(keys), keys[:min(len(keys), 10)]
	}
	c := d.on(live[0].url)
	var mu sync.Mutex
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for _, k := range keys {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			var r *client.RowInfo
			var err error
			for try := 0; try < 3; try++ {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				r, err = c.Get(ctx, k)
				cancel()
				if err == nil || errors.Is(err, client.ErrNotFound) {
					break
				}
			}
			mu.Lock()
			defer mu.Unlock()
			// done: delivered (a 2xx) after the receiver's tally was read.
			if err == nil && (r.Status == client.StatusPending || r.Status == client.StatusClaimed || r.Status == client.StatusDone) {
				pending++
				return
			}
			lost++
			if len(lostKeys) < 10 {
				lostKeys = append(lostKeys, k)
			}
			if lost <= 5 {
				what := fmt.Sprint(err)
				if err == nil {
					what = fmt.Sprintf("status %s, attempt %d", r.Status, r.Attempt)
				}
				d.event("not delivered: %s: %s", k, what)
			}
		}()
	}
	wg.Wait()
	return pending, lost, lostKeys
}

func counterValue(n *node.Node, name string) float64 {
	mfs, err := n.Registry().Gather()
	if err != nil {
		return 0
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			total += metricValue(m)
		}
	}
	return total
}

func metricValue(m *dto.Metric) float64 {
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	return 0
}

func (d *demoRun) printSummary(s Summary) {
	out := d.opts.Out
	fmt.Fprintf(out, "\n== fairshard demo summary ==\n")
	fmt.Fprintf(out, "appended        %d\n", s.Appended)
	fmt.Fprintf(out, "delivered       %d (distinct dispatch_keys)\n", s.Delivered)
	if s.Pending > 0 {
		fmt.Fprintf(out, "still pending   %d (held in the cluster at their quota: delivered after the demo's end)\n", s.Pending)
	}
	fmt.Fprintf(out, "lost            %d\n", s.Lost)
	if s.Lost > 0 {
		fmt.Fprintf(out, "lost rows, e.g. %s\n", strings.Join(s.LostKeys, " "))
	}
	fmt.Fprintf(out, "delivered twice %d\n", s.DeliveredTwice)
	fmt.Fprintf(out, "copies per row  %d\n", s.Factor)
	if s.Wiped != "" {
		fmt.Fprintf(out, "kill and wipe   %s (data dir deleted): lost = %d\n", s.Wiped, s.Lost)
	}
	fmt.Fprintf(out, "rows synced     %.0f (copies made by shard sync)\n", s.Synced)
	fmt.Fprintf(out, "copies dropped  %.0f (rebalance, drain)\n\n", s.Dropped)
	fmt.Fprintf(out, "%-8s %9s %14s %8s %8s %8s %8s\n", "NAMESPACE", "DELIVERED", "MAX CONC/QUOTA", "P50 MS", "P90 MS", "P99 MS", "MAX MS")
	for _, r := range s.Namespaces {
		q := "default"
		if s.Quotas[r.Namespace] > 0 {
			q = fmt.Sprint(s.Quotas[r.Namespace])
		}
		fmt.Fprintf(out, "%-8s %9d %14s %8.1f %8.1f %8.1f %8.1f\n", r.Namespace, r.Delivered,
			fmt.Sprintf("%d/%s", r.MaxInFlight, q), r.Latency.P50, r.Latency.P90, r.Latency.P99, r.Latency.Max)
	}
	fmt.Fprintln(out, "\nverdict:")
	for _, v := range s.Verdict() {
		fmt.Fprintln(out, "  "+v)
	}
}

// Verdict is what held and what did not, one line each, "held: …" or
// "NOT HELD: …": no acknowledged row lost, each row delivered once, and
// every quota kept at the target.
func (s Summary) Verdict() []string {
	say := func(ok bool, format string, args ...any) string {
		if ok {
			return "held: " + fmt.Sprintf(format, args...)
		}
		return "NOT HELD: " + fmt.Sprintf(format, args...)
	}
	out := []string{say(s.Lost == 0, "no acknowledged row lost (%d lost of %d appended)", s.Lost, s.Appended)}
	if s.Pending > 0 {
		out = append(out, fmt.Sprintf("note: %d rows still pending at the end, held at their quota; delivered after the demo", s.Pending))
	}
	out = append(out, say(s.DeliveredTwice == 0, "each row delivered once (%d delivered twice)", s.DeliveredTwice))
	for _, r := range s.Namespaces {
		if q := s.Quotas[r.Namespace]; q > 0 {
			out = append(out, say(r.MaxInFlight <= int(q), "%s's quota: at most %d of its rows at the target at once, quota %d",
				r.Namespace, r.MaxInFlight, q))
		}
	}
	return out
}

// lockedWriter serialises Writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}
