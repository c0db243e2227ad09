package dispatch

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/internal/testclock"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/outbox/memstore"
	"github.com/fairshard/fairshard/quota"
)

// TestMain runs the package's tests once per store kind (memstore, then
// boltstore on real files), so every dispatcher test also holds on the
// production store; benchmarks loop over the kinds themselves and run in
// the first pass only.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(perStore{m})
}

// perStore is a goleak.TestingM that runs m once per storeKinds entry with
// newStore pointing at it.
type perStore struct{ m *testing.M }

// storePass is the index in storeKinds of the pass running.
var storePass int

// skipInLaterStorePass skips a test that loops over storeKinds itself
// after the first pass has run it.
func skipInLaterStorePass(t *testing.T) {
	t.Helper()
	if storePass > 0 {
		t.Skip("runs every store kind itself; ran in the first pass")
	}
}

func (p perStore) Run() int {
	if !flag.Parsed() {
		flag.Parse()
	}
	for i, k := range storeKinds {
		storePass = i
		newStore = func(tb testing.TB) outbox.Store {
			s, _ := k.open(tb)
			return s
		}
		if i > 0 {
			for _, name := range []string{"test.bench", "test.fuzz"} {
				if f := flag.Lookup(name); f != nil {
					_ = f.Value.Set("")
				}
			}
		}
		if testing.Verbose() {
			fmt.Printf("=== dispatch tests on %s\n", k.name)
		}
		if code := p.m.Run(); code != 0 {
			fmt.Printf("--- FAIL: dispatch tests on %s\n", k.name)
			return code
		}
	}
	return 0
}

// storeKind is a Store implementation the tests and benchmarks can run on.
type storeKind struct {
	name string
	// open returns a fresh store and a restart function that simulates a
	// node restart: it closes the store and opens it again from its data
	// (memstore has no disk: restart returns the same instance).
	open func(tb testing.TB) (store outbox.Store, restart func() outbox.Store)
}

// storeKinds are the stores end-to-end tests and the benchmark loop over.
var storeKinds = []storeKind{
	{"memstore", func(tb testing.TB) (outbox.Store, func() outbox.Store) {
		s := memstore.New(64)
		tb.Cleanup(func() { _ = s.Close() })
		return s, func() outbox.Store { return s }
	}},
	{"boltstore", func(tb testing.TB) (outbox.Store, func() outbox.Store) {
		path := filepath.Join(tb.TempDir(), "outbox.db")
		open := func() outbox.Store {
			s, err := boltstore.Open(path, boltstore.Options{ShardCount: 64})
			if err != nil {
				tb.Fatalf("boltstore.Open(%s): %v", path, err)
			}
			tb.Cleanup(func() { _ = s.Close() })
			return s
		}
		cur := open()
		return cur, func() outbox.Store {
			if err := cur.(*boltstore.Store).Close(); err != nil {
				tb.Fatalf("boltstore.Close: %v", err)
			}
			cur = open()
			return cur
		}
	}},
}

// newStore is the store most tests use; TestMain points it at each
// storeKind in turn.
var newStore = func(tb testing.TB) outbox.Store {
	s, _ := storeKinds[0].open(tb)
	return s
}

// t0 is the fake clock's start; rows are created relative to it.
var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

// fakeClock is the settable clock of dispatch tests.
type fakeClock = testclock.Clock

func newFakeClock(t time.Time) *fakeClock { return testclock.New(t) }

// bundle is what setup hands a test besides the dispatcher.
type bundle struct {
	store  outbox.Store
	reg    *prometheus.Registry
	now    func() time.Time
	quotas *sync.Map // namespace → uint32
}

// testConfig is a Config with test-friendly tunables; setup fills Store,
// Planner, Now, Registerer and Logger when they are unset.
func testConfig(targets Targets) Config {
	return Config{
		Targets: targets,
		Tunables: Tunables{
			PollInterval:    20 * time.Millisecond,
			DeliveryTimeout: 2 * time.Second,
			RearmInterval:   50 * time.Millisecond,
		},
	}
}

// setup builds a dispatcher over a fresh store (newStore) and a real
// backpressure planner whose quotas come from b.quotas (default:
// backpressure.DefaultQuota) and whose host ceiling is the dispatcher's
// HostLimits, as the node wires them. cfg.Now, if set, is shared by the
// planner.
func setup(t testing.TB, cfg Config) (*Dispatcher, *bundle) {
	t.Helper()
	b := &bundle{quotas: &sync.Map{}}
	if cfg.Store == nil {
		cfg.Store = newStore(t)
	}
	b.store = cfg.Store.(outbox.Store)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	b.now = cfg.Now
	if cfg.Registerer == nil {
		b.reg = prometheus.NewPedanticRegistry()
		cfg.Registerer = b.reg
	}
	if cfg.Hosts == nil {
		cfg.Hosts = testHosts(t, cfg)
	}
	var claims *lateClaims
	if cfg.Planner == nil {
		claims = newLateClaims(cfg.Store)
		src := quota.SettingsSourceFunc(func(_ context.Context, ns string) (quota.Settings, bool, error) {
			q, ok := b.quotas.Load(ns)
			if !ok {
				return quota.Settings{}, false, nil
			}
			v := q.(uint32)
			return quota.Settings{MaxInFlight: &v}, true, nil
		})
		cfg.Planner = backpressure.NewPlanner(backpressure.PlannerConfig{
			Ceilings: quota.NewProportional(quota.NewPolicies(src, quota.Defaults{Quota: quota.DefaultQuota}, 0), nil),
			Claimed:  claims,
			Now:      cfg.Now,
			Hosts:    cfg.Hosts,
		})
	}
	if cfg.Logger == nil && os.Getenv("DISPATCH_TEST_LOG") != "" {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	d, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if claims != nil {
		claims.bind(d)
	}
	if lc, ok := plannerClaims(cfg.Planner); ok {
		lc.bind(d)
	}
	return d, b
}

// plannerClaims finds the lateClaims a test handed its own planner
// (countingPlanner over testPlanner), to bind it too.
func plannerClaims(p Planner) (*lateClaims, bool) {
	if cp, ok := p.(*countingPlanner); ok {
		return cp.claims, cp.claims != nil
	}
	return nil, false
}

// testHosts builds the HostLimits for cfg (its Targets and host limits,
// metrics on its Registerer), as the node does.
func testHosts(t testing.TB, cfg Config) *HostLimits {
	t.Helper()
	h, err := NewHostLimits(HostLimitsConfig{Targets: cfg.Targets, MaxConnsPerHost: cfg.MaxConnsPerHost,
		InitialConnsPerHost: cfg.InitialConnsPerHost, Registerer: cfg.Registerer})
	if err != nil {
		t.Fatalf("NewHostLimits: %v", err)
	}
	return h
}

// testPlanner is a backpressure planner where every namespace has the
// default quota, claiming by hosts' limits (nil: no host ceiling), whose
// claimed counts are claims'.
func testPlanner(hosts backpressure.HostSlots, claims quota.Counter) *backpressure.Planner {
	return backpressure.NewPlanner(backpressure.PlannerConfig{
		Ceilings: quota.NewProportional(quota.NewPolicies(nil, quota.Defaults{Quota: quota.DefaultQuota}, 0), nil),
		Claimed:  claims,
		Hosts:    hosts,
	})
}

// lateClaims is the node's claim rule (quota.Claims) over a store and a
// dispatcher that is built after the planner: bind it once New returned.
type lateClaims struct {
	store outbox.Store
	d     atomic.Pointer[Dispatcher]
}

func newLateClaims(store Store) *lateClaims {
	return &lateClaims{store: store.(outbox.Store)}
}

func (c *lateClaims) bind(d *Dispatcher) { c.d.Store(d) }

// Claimed implements quota.Counter: the store's claims raised to the
// dispatcher's running deliveries.
func (c *lateClaims) Claimed(ctx context.Context, namespaces []string) (map[string]int, error) {
	claims := quota.Claims{Held: c.store.CountClaimedByNamespace}
	if d := c.d.Load(); d != nil {
		claims.Deliveries = d.Deliveries
	}
	return claims.Claimed(ctx, namespaces)
}

// countingPlanner wraps a Planner and numbers its sweeps, recording which
// sweep claimed each row: fairness is then measured in sweeps, whatever
// the store's speed.
type countingPlanner struct {
	Planner
	claims   *lateClaims // bound by setup
	started  atomic.Int64
	mu       sync.Mutex
	claimed  map[string]int64 // dispatch_key → number of the sweep that claimed it
	maxSweep time.Duration    // longest sweep so far
}

func (p *countingPlanner) Sweep(ctx context.Context, s backpressure.ClaimStore, req backpressure.SweepRequest) (backpressure.Sweep, error) {
	n := p.started.Add(1)
	start := time.Now()
	sw, err := p.Planner.Sweep(ctx, s, req)
	took := time.Since(start)
	p.mu.Lock()
	p.maxSweep = max(p.maxSweep, took)
	for _, r := range sw.Rows {
		p.claimed[r.DispatchKey] = n
	}
	p.mu.Unlock()
	return sw, err
}

func (p *countingPlanner) longestSweep() time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.maxSweep
}

func (p *countingPlanner) claimedIn(key string) (int64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.claimed[key]
	return n, ok
}

// run starts d.Run in the background and returns a hard-stop function that
// cancels it and waits for Run to return (also registered as cleanup).
func run(t testing.TB, d *Dispatcher) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Run returned %v, want nil", err)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("Run did not return within 10s of a hard stop")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// waitIdle waits until no delivery is in flight (without stopping claims).
func waitIdle(t testing.TB, d *Dispatcher) {
	t.Helper()
	select {
	case <-d.idleCh():
	case <-time.After(10 * time.Second):
		t.Fatalf("deliveries still in flight after 10s: %d", d.InFlight())
	}
}

// sweep runs one sweep and waits for its deliveries to settle.
func sweep(t testing.TB, d *Dispatcher) backpressure.Sweep {
	t.Helper()
	sw, err := d.SweepOnce(context.Background())
	if err != nil {
		t.Fatalf("SweepOnce: %v", err)
	}
	waitIdle(t, d)
	return sw
}

// drain stops d gracefully at the end of a test that used SweepOnce.
func drain(t testing.TB, d *Dispatcher) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := d.Drain(ctx); err != nil {
		t.Errorf("Drain: %v", err)
	}
}

// mkRow builds a pending row created and visible at `at`.
func mkRow(key, ns, tq string, at time.Time) outbox.Row {
	return outbox.Row{
		DispatchKey:  key,
		WorkflowID:   "wf-" + key,
		Ordinal:      7,
		Namespace:    ns,
		TaskQueue:    tq,
		ActivityType: "charge",
		Payload:      []byte(`{"key":"` + key + `"}`),
		ContentType:  "application/json",
		CreatedAt:    at,
		VisibleAfter: at,
	}
}

func mustAppend(t testing.TB, s outbox.Store, rows ...outbox.Row) {
	t.Helper()
	out, err := s.Append(context.Background(), rows)
	if err != nil {
		t.Fatalf("Append(%d rows): %v", len(rows), err)
	}
	for i, o := range out {
		if o != outbox.AppendCreated {
			t.Fatalf("Append: row %q: %s", rows[i].DispatchKey, o)
		}
	}
}

func mustGet(t testing.TB, s outbox.Store, key string) outbox.Row {
	t.Helper()
	r, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return r
}

func wantStatus(t testing.TB, s outbox.Store, key string, want outbox.Status) outbox.Row {
	t.Helper()
	r := mustGet(t, s, key)
	if r.Status != want {
		t.Fatalf("row %q: status %q (attempt %d, last_error %q), want %q", key, r.Status, r.Attempt, r.LastError, want)
	}
	return r
}

func statusIs(s outbox.Store, key string, want outbox.Status) bool {
	r, err := s.Get(context.Background(), key)
	return err == nil && r.Status == want
}

// received is one request as a target saw it.
type received struct {
	at     time.Time
	header http.Header
	body   []byte
	path   string
}

// target is a real HTTP delivery target (httptest) that records what it
// receives and measures its own concurrency.
type target struct {
	srv     *httptest.Server
	handler func(w http.ResponseWriter, r *http.Request) // nil answers 200
	conns   atomic.Int64                                 // connections opened

	cur, peak atomic.Int64

	mu    sync.Mutex
	reqs  []received
	byKey map[string]int
}

// newTarget starts a target whose requests are answered by handler (nil:
// 200 OK). The server is closed at cleanup.
func newTarget(t testing.TB, handler func(w http.ResponseWriter, r *http.Request)) *target {
	tg := &target{handler: handler, byKey: map[string]int{}}
	tg.srv = httptest.NewUnstartedServer(http.HandlerFunc(tg.serve))
	tg.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			tg.conns.Add(1)
		}
	}
	tg.srv.Start()
	t.Cleanup(tg.srv.Close)
	return tg
}

func (tg *target) serve(w http.ResponseWriter, r *http.Request) {
	n := tg.cur.Add(1)
	defer tg.cur.Add(-1)
	for {
		p := tg.peak.Load()
		if n <= p || tg.peak.CompareAndSwap(p, n) {
			break
		}
	}
	body, _ := io.ReadAll(r.Body)
	tg.mu.Lock()
	tg.reqs = append(tg.reqs, received{at: time.Now(), header: r.Header.Clone(), body: body, path: r.URL.EscapedPath()})
	tg.byKey[r.Header.Get(HeaderDispatchKey)]++
	tg.mu.Unlock()
	if tg.handler != nil {
		tg.handler(w, r)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// URL is the target's base URL.
func (tg *target) URL() string { return tg.srv.URL }

func (tg *target) count(key string) int {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return tg.byKey[key]
}

func (tg *target) total() int {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return len(tg.reqs)
}

func (tg *target) requests() []received {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	return append([]received(nil), tg.reqs...)
}

// static routes every route to one target URL.
func static(url string) Targets {
	return TargetsFunc(func(outbox.ClaimScope) (Target, bool) { return Target{URL: url}, true })
}

// faultStore wraps a Store and fails the next N calls of chosen methods
// with errInjected (a fault the real store cannot show on demand).
type faultStore struct {
	outbox.Store
	mu    sync.Mutex
	fails map[string]int
	hits  map[string]int
}

var errInjected = errors.New("injected store fault")

func newFaultStore(s outbox.Store) *faultStore {
	return &faultStore{Store: s, fails: map[string]int{}, hits: map[string]int{}}
}

// failNext makes the next n calls of method fail.
func (f *faultStore) failNext(method string, n int) {
	f.mu.Lock()
	f.fails[method] += n
	f.mu.Unlock()
}

func (f *faultStore) injected(method string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.hits[method]
}

func (f *faultStore) fault(method string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fails[method] > 0 {
		f.fails[method]--
		f.hits[method]++
		return fmt.Errorf("%s: %w", method, errInjected)
	}
	return nil
}

func (f *faultStore) PendingRoutes(ctx context.Context, now time.Time) ([]outbox.ClaimScope, error) {
	if err := f.fault("PendingRoutes"); err != nil {
		return nil, err
	}
	return f.Store.PendingRoutes(ctx, now)
}

func (f *faultStore) Claim(ctx context.Context, p outbox.ClaimParams) ([]outbox.Row, error) {
	if err := f.fault("Claim"); err != nil {
		return nil, err
	}
	return f.Store.Claim(ctx, p)
}

func (f *faultStore) Complete(ctx context.Context, p outbox.CompleteParams) error {
	if err := f.fault("Complete"); err != nil {
		return err
	}
	return f.Store.Complete(ctx, p)
}

func (f *faultStore) RearmStale(ctx context.Context, p outbox.RearmParams) ([]outbox.Row, error) {
	if err := f.fault("RearmStale"); err != nil {
		return nil, err
	}
	return f.Store.RearmStale(ctx, p)
}
