package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fairshard/fairshard/client"
)

// Namespace is one tenant of the load with its relative weight.
type Namespace struct {
	Name string
	// Weight is the namespace's share of rows relative to the others (≥ 1).
	Weight int
	// TaskQueues spreads the namespace's rows over this many task queues
	// named q0…q{n-1}. Defaults to 1.
	TaskQueues int
	// Rate is this namespace's own rate in rows/s. When any namespace has
	// one the load is paced per namespace (see Config.Bursts): Config.Rate
	// and the weights are not used.
	Rate float64
}

// Bursts make a paced load uneven: each namespace's rate is multiplied by
// Low or High (drawn evenly) for Min to Max (drawn evenly), then drawn
// again, so small quotas sit at their ceiling some of the time and drain
// some of the time. The zero value multiplies by 1.
type Bursts struct {
	Low, High float64
	Min, Max  time.Duration
}

// Config shapes a load run.
type Config struct {
	// Nodes are base URLs of cluster nodes (http://host:port); batches go to
	// them round robin, and a failed batch is retried on another (see
	// package client).
	Nodes []string
	// NodesNow, if set, returns the base URLs batches may go to now,
	// instead of Nodes: for a cluster whose members come and go. Each
	// append tries them in a random order.
	NodesNow func() []string
	// Token is sent as a bearer token when set.
	Token string
	// Namespaces with weights; defaults to one namespace "default".
	Namespaces []Namespace
	// Rate is the target rows/s across all workers; 0 runs open loop (as
	// fast as the cluster answers).
	Rate float64
	// Rows stops the run after this many rows have been appended (0: no
	// limit; then Duration must be set, or the load paced and ended by
	// Stop).
	Rows int
	// Duration stops the run after this long (0: no limit; then Rows must
	// be set, or the load paced and ended by Stop).
	Duration time.Duration
	// Bursts shape a paced load's rates; Seed seeds their draws (0: the
	// time).
	Bursts Bursts
	Seed   uint64
	// QueueRows bounds a paced load's rows made and not yet sent. A row made
	// while the queue is full is never sent (its Ledger entry has no
	// tries) and its namespace's pace starts over: the senders are stuck
	// (a paused node holds their calls). Defaults to 20000.
	QueueRows int
	// BatchSize is rows per request. Defaults to 100.
	BatchSize int
	// PayloadBytes pads each JSON payload to about this size. Defaults to 0
	// (a small payload carrying the append time).
	PayloadBytes int
	// Concurrency is the number of concurrent appenders. Defaults to 4.
	Concurrency int
	// KeyPrefix starts every dispatch_key; keys are "{prefix}{n}". Defaults
	// to "load-<unix nanos>-".
	KeyPrefix string
	// Key, if set, names row n of namespace ns instead of KeyPrefix.
	Key func(ns string, n int64) string
	// Client is the HTTP client under the API client; defaults to the API
	// client's own.
	Client *http.Client
	// Timeout bounds one attempt; defaults to package client's (30 s).
	Timeout time.Duration
	// Retry shapes the retries of a failed batch; zero fields take package
	// client's defaults (4 attempts, 100 ms backoff doubling up to 2 s).
	Retry client.RetryConfig
	// KeepTrying sends a batch whose attempts all failed again, after a
	// pause doubling from 50 ms to 1 s, until it is acknowledged, refused
	// (an answer other than 429 and 5xx: bad input) or Run's context
	// ends, instead of giving it up.
	KeepTrying bool
	// Ledger, if set, records every row's fate.
	Ledger *Ledger
	// OnAppended, if set, is called with each acknowledged row's key,
	// namespace and status ("created", "duplicate", "accepted").
	OnAppended func(key, namespace, status string)
	// OnFailed, if set, is called for each failed attempt with the node it
	// went to, the keys of its batch and the error. A failed attempt may
	// still have stored its rows (e.g. the node died before answering), so
	// a key that failed and was then retried elsewhere may exist twice
	// across a crash: at-least-once.
	OnFailed func(node string, keys []string, err error)
}

// paced reports whether the namespaces carry their own rates.
func (c *Config) paced() bool {
	for _, ns := range c.Namespaces {
		if ns.Rate > 0 {
			return true
		}
	}
	return false
}

// Report is a finished run's outcome.
type Report struct {
	Appended int64            `json:"appended"`
	ByStatus map[string]int64 `json:"by_status"`
	// Errors counts failed attempts (each retried, on another node when
	// there is one, up to Config.Retry's attempts).
	Errors int64 `json:"errors"`
	// GaveUp counts rows whose batch failed on every attempt: they were not
	// acknowledged (though a timed-out attempt may still have stored them).
	GaveUp     int64         `json:"gave_up"`
	Elapsed    time.Duration `json:"elapsed_ns"`
	RowsPerSec float64       `json:"appended_per_sec"`
	// AppendLatency is the latency of successful POST /v1/rows requests.
	AppendLatency Summary `json:"append_latency"`
}

// Generator appends rows to a cluster. Build with NewGenerator; Run once.
type Generator struct {
	cfg      Config
	api      *client.Client
	opts     client.Options // of api, for NodesNow's clients
	next     atomic.Int64
	appended atomic.Int64
	errs     atomic.Int64
	gaveUp   atomic.Int64
	mu       sync.Mutex
	byStatus map[string]int64
	lat      Latencies
	picks    []int // namespace index per weight unit
	lastErr  atomic.Pointer[string]
	factor   atomic.Uint64 // math.Float64bits of the paced rates' multiplier
	making   context.Context
	stop     context.CancelFunc
}

// NewGenerator validates cfg and fills its defaults.
func NewGenerator(cfg Config) (*Generator, error) {
	if len(cfg.Nodes) == 0 && cfg.NodesNow == nil {
		return nil, errors.New("loadgen: no node URLs")
	}
	if cfg.Rows <= 0 && cfg.Duration <= 0 && !cfg.paced() {
		return nil, errors.New("loadgen: set Rows or Duration")
	}
	if len(cfg.Namespaces) == 0 {
		cfg.Namespaces = []Namespace{{Name: "default", Weight: 1}}
	}
	if cfg.BatchSize <= 0 {
		cfg.BatchSize = 100
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.QueueRows <= 0 {
		cfg.QueueRows = 20_000
	}
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = fmt.Sprintf("load-%d-", time.Now().UnixNano())
	}
	if cfg.Seed == 0 {
		cfg.Seed = uint64(time.Now().UnixNano())
	}
	if cfg.NodesNow != nil && cfg.Client == nil {
		cfg.Client = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	opts := client.Options{Nodes: cfg.Nodes, Token: cfg.Token, HTTPClient: cfg.Client, Timeout: cfg.Timeout, Retry: cfg.Retry,
		UserAgent: "fairshard-load"}
	g := &Generator{cfg: cfg, opts: opts, byStatus: map[string]int64{}}
	if cfg.NodesNow == nil {
		api, err := client.New(opts)
		if err != nil {
			return nil, fmt.Errorf("loadgen: %w", err)
		}
		g.api = api
	}
	for i, ns := range cfg.Namespaces {
		if ns.Name == "" {
			return nil, fmt.Errorf("loadgen: namespace %d has no name", i)
		}
		for range max(ns.Weight, 1) {
			g.picks = append(g.picks, i)
		}
	}
	g.factor.Store(math.Float64bits(1))
	g.making, g.stop = context.WithCancel(context.Background())
	return g, nil
}

// Appended returns rows acknowledged so far.
func (g *Generator) Appended() int64 { return g.appended.Load() }

// Errors returns failed requests so far.
func (g *Generator) Errors() int64 { return g.errs.Load() }

// GaveUp returns rows given up so far (their request failed twice).
func (g *Generator) GaveUp() int64 { return g.gaveUp.Load() }

// LastError returns the most recent request error, or "".
func (g *Generator) LastError() string {
	if p := g.lastErr.Load(); p != nil {
		return *p
	}
	return ""
}

// SetRateFactor multiplies a paced load's rates by f from now on (0 stops
// making rows; the senders go on with what is queued).
func (g *Generator) SetRateFactor(f float64) { g.factor.Store(math.Float64bits(f)) }

// Stop ends the making of rows: Run returns once the rows made so far are
// acknowledged or given up.
func (g *Generator) Stop() { g.stop() }

// Run appends until Rows or Duration is reached, Stop is called or ctx
// ends, and reports. Each batch is one client.Append: failed attempts are
// counted (Report.Errors, Config.OnFailed) and retried with the same keys
// (an append is idempotent) on another node, so a node that is down or
// draining costs no rows; a batch that fails every attempt is given up
// (Report.GaveUp) unless Config.KeepTrying.
func (g *Generator) Run(ctx context.Context) (Report, error) {
	// Requests run under reqCtx, which only the caller cancels: a batch in
	// flight when Duration ends is finished and counted, so every row the
	// cluster stored is reported as appended.
	reqCtx := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stopped := context.AfterFunc(g.making, cancel)
	defer stopped()
	if g.cfg.Duration > 0 {
		ctx, cancel = context.WithTimeout(ctx, g.cfg.Duration)
		defer cancel()
	}
	start := time.Now()
	if g.api != nil {
		defer g.api.Close()
	}
	var eg errgroup.Group
	if g.cfg.paced() {
		queue := make(chan rowSpec, g.cfg.QueueRows)
		eg.Go(func() error {
			defer close(queue)
			g.pace(ctx, queue)
			return nil
		})
		for w := range g.cfg.Concurrency {
			eg.Go(func() error {
				g.drain(reqCtx, rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano()))), queue)
				return nil
			})
		}
	} else {
		defer g.loop(ctx, reqCtx, start, &eg)()
	}
	_ = eg.Wait()
	elapsed := time.Since(start)
	rep := Report{Appended: g.appended.Load(), Errors: g.errs.Load(), GaveUp: g.gaveUp.Load(), Elapsed: elapsed, ByStatus: map[string]int64{}, AppendLatency: g.lat.Summary()}
	g.mu.Lock()
	for k, v := range g.byStatus {
		rep.ByStatus[k] = v
	}
	g.mu.Unlock()
	if s := elapsed.Seconds(); s > 0 {
		rep.RowsPerSec = float64(rep.Appended) / s
	}
	return rep, nil
}

// rowSpec is one row to send: its sequence number and namespace index.
type rowSpec struct {
	seq int64
	ns  int
}

// loop starts the workers of a load at Config.Rate (or open loop): each
// sends batches of BatchSize rows whose namespaces are drawn by weight. The
// returned func stops its ticker.
func (g *Generator) loop(ctx, reqCtx context.Context, start time.Time, eg *errgroup.Group) func() {
	var tick <-chan time.Time
	stop := func() {}
	if g.cfg.Rate > 0 {
		interval := time.Duration(float64(time.Second) * float64(g.cfg.BatchSize) / g.cfg.Rate)
		t := time.NewTicker(max(interval, time.Microsecond))
		stop, tick = t.Stop, t.C
	}
	for w := range g.cfg.Concurrency {
		eg.Go(func() error {
			rng := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			for {
				if tick != nil {
					select {
					case <-ctx.Done():
						return nil
					case <-tick:
					}
				} else if ctx.Err() != nil {
					return nil
				}
				size := g.cfg.BatchSize
				first := g.next.Add(int64(size)) - int64(size)
				if g.cfg.Rows > 0 {
					if first >= int64(g.cfg.Rows) {
						return nil
					}
					size = int(min(int64(size), int64(g.cfg.Rows)-first))
				}
				batch := make([]rowSpec, size)
				for i := range batch {
					batch[i] = rowSpec{seq: first + int64(i), ns: g.picks[rng.IntN(len(g.picks))]}
					if g.cfg.Ledger != nil {
						g.cfg.Ledger.made(batch[i].seq, batch[i].ns)
					}
				}
				g.send(reqCtx, rng, batch)
			}
		})
	}
	return stop
}

// pace makes rows of each namespace at its Rate times its burst factor
// times SetRateFactor's, into queue, until ctx ends or Rows are made.
func (g *Generator) pace(ctx context.Context, queue chan<- rowSpec) {
	type state struct {
		factor float64
		until  time.Time
		owed   float64
	}
	b := g.cfg.Bursts
	rng := rand.New(rand.NewPCG(g.cfg.Seed, 0x6c6f6164)) // "load"
	st := make([]state, len(g.cfg.Namespaces))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			dt := now.Sub(last).Seconds()
			last = now
			for i, ns := range g.cfg.Namespaces {
				s := &st[i]
				if s.factor == 0 || now.After(s.until) {
					s.factor = 1
					if b.Low > 0 || b.High > 0 {
						s.factor = b.Low
						if rng.IntN(2) == 0 {
							s.factor = b.High
						}
						s.until = now.Add(b.Min + time.Duration(rng.Int64N(int64(max(b.Max-b.Min, 1)))))
					} else {
						s.until = now.Add(time.Hour)
					}
				}
				s.owed += ns.Rate * s.factor * dt * math.Float64frombits(g.factor.Load())
				for ; s.owed >= 1; s.owed-- {
					seq := g.next.Add(1) - 1
					if g.cfg.Rows > 0 && seq >= int64(g.cfg.Rows) {
						return
					}
					if g.cfg.Ledger != nil {
						g.cfg.Ledger.made(seq, i)
					}
					select {
					case queue <- rowSpec{seq: seq, ns: i}:
					default:
						s.owed = 0
					}
				}
			}
		}
	}
}

// drain sends batches of up to BatchSize queued rows until queue closes.
func (g *Generator) drain(ctx context.Context, rng *rand.Rand, queue <-chan rowSpec) {
	batch := make([]rowSpec, 0, g.cfg.BatchSize)
	for {
		s, ok := <-queue
		if !ok {
			return
		}
		batch = append(batch[:0], s)
	fill:
		for len(batch) < g.cfg.BatchSize {
			select {
			case s, ok := <-queue:
				if !ok {
					break fill
				}
				batch = append(batch, s)
			default:
				break fill
			}
		}
		g.send(ctx, rng, batch)
	}
}

// key names row seq of namespace ns.
func (g *Generator) key(ns string, seq int64) string {
	if g.cfg.Key != nil {
		return g.cfg.Key(ns, seq)
	}
	return fmt.Sprintf("%s%d", g.cfg.KeyPrefix, seq)
}

// client returns the API client for one append: the generator's, or one
// over NodesNow's nodes in a random order (nil when there is none).
func (g *Generator) client(rng *rand.Rand) *client.Client {
	if g.api != nil {
		return g.api
	}
	nodes := g.cfg.NodesNow()
	if len(nodes) == 0 {
		return nil
	}
	nodes = append([]string(nil), nodes...)
	rng.Shuffle(len(nodes), func(i, j int) { nodes[i], nodes[j] = nodes[j], nodes[i] })
	opts := g.opts
	opts.Nodes = nodes
	api, err := client.New(opts)
	if err != nil {
		return nil
	}
	return api
}

// refused reports whether err is an answer no retry can change: bad input.
func refused(err error) bool {
	var ae *client.Error
	return errors.As(err, &ae) && ae.StatusCode != http.StatusTooManyRequests && ae.StatusCode < 500
}

func (g *Generator) send(ctx context.Context, rng *rand.Rand, batch []rowSpec) {
	rows := make([]client.Row, len(batch))
	seqs := make([]int64, len(batch))
	pad := ""
	if g.cfg.PayloadBytes > 40 {
		pad = strings.Repeat("x", g.cfg.PayloadBytes-40)
	}
	now := time.Now().UnixNano()
	for i, s := range batch {
		ns := g.cfg.Namespaces[s.ns]
		seqs[i] = s.seq
		rows[i] = client.Row{
			DispatchKey: g.key(ns.Name, s.seq),
			Namespace:   ns.Name,
			TaskQueue:   fmt.Sprintf("q%d", rng.IntN(max(ns.TaskQueues, 1))),
			Payload:     json.RawMessage(fmt.Sprintf(`{"t":%d,"pad":%q}`, now, pad)),
		}
	}
	var keys []string
	keyList := func() []string {
		if keys == nil {
			keys = make([]string, len(rows))
			for i := range rows {
				keys[i] = rows[i].DispatchKey
			}
		}
		return keys
	}
	hooked := client.WithAttemptHook(ctx, func(a client.Attempt) {
		if g.cfg.Ledger != nil {
			g.cfg.Ledger.attempt(seqs, a.Node, a.Err)
		}
		if a.Err == nil {
			g.lat.Add(a.Duration)
			return
		}
		if ctx.Err() != nil {
			return // the caller stopped the run: not the cluster's failure
		}
		g.errs.Add(1)
		msg := a.Err.Error()
		g.lastErr.Store(&msg)
		if g.cfg.OnFailed != nil {
			g.cfg.OnFailed(a.Node, keyList(), a.Err)
		}
	})
	var results []client.AppendResult
	pause := 50 * time.Millisecond
	for {
		api := g.client(rng)
		err := errors.New("loadgen: no node to append through")
		if api != nil {
			results, err = api.Append(hooked, rows...)
		}
		if err == nil {
			break
		}
		if refused(err) && g.cfg.Ledger != nil {
			g.cfg.Ledger.refusal(keyList(), err)
		}
		if !g.cfg.KeepTrying || refused(err) || api == nil || ctx.Err() != nil {
			if ctx.Err() == nil {
				g.gaveUp.Add(int64(len(rows)))
			}
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
	g.appended.Add(int64(len(rows)))
	g.mu.Lock()
	for _, r := range results {
		g.byStatus[string(r.Status)]++
	}
	g.mu.Unlock()
	if g.cfg.Ledger != nil {
		g.cfg.Ledger.acked(seqs, keyList(), results)
	}
	if g.cfg.OnAppended != nil {
		for i, r := range rows {
			g.cfg.OnAppended(r.DispatchKey, r.Namespace, string(results[i].Status))
		}
	}
}
