package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
}

// Config shapes a load run.
type Config struct {
	// Nodes are base URLs of cluster nodes (http://host:port); batches go to
	// them round robin, and a failed batch is retried on another (see
	// package client).
	Nodes []string
	// Token is sent as a bearer token when set.
	Token string
	// Namespaces with weights; defaults to one namespace "default".
	Namespaces []Namespace
	// Rate is the target rows/s across all workers; 0 runs open loop (as
	// fast as the cluster answers).
	Rate float64
	// Rows stops the run after this many rows have been appended (0: no
	// limit; then Duration must be set).
	Rows int
	// Duration stops the run after this long (0: no limit; then Rows must
	// be set).
	Duration time.Duration
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
	// Client is the HTTP client under the API client; defaults to the API
	// client's own.
	Client *http.Client
	// Retry shapes the retries of a failed batch; zero fields take package
	// client's defaults (4 attempts, 100 ms backoff doubling up to 2 s).
	Retry client.RetryConfig
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
	next     atomic.Int64
	appended atomic.Int64
	errs     atomic.Int64
	gaveUp   atomic.Int64
	mu       sync.Mutex
	byStatus map[string]int64
	lat      Latencies
	picks    []int // namespace index per weight unit
	lastErr  atomic.Pointer[string]
}

// NewGenerator validates cfg and fills its defaults.
func NewGenerator(cfg Config) (*Generator, error) {
	if len(cfg.Nodes) == 0 {
		return nil, errors.New("loadgen: no node URLs")
	}
	if cfg.Rows <= 0 && cfg.Duration <= 0 {
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
	if cfg.KeyPrefix == "" {
		cfg.KeyPrefix = fmt.Sprintf("load-%d-", time.Now().UnixNano())
	}
	api, err := client.New(client.Options{Nodes: cfg.Nodes, Token: cfg.Token, HTTPClient: cfg.Client, Retry: cfg.Retry,
		UserAgent: "fairshard-load"})
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	g := &Generator{cfg: cfg, api: api, byStatus: map[string]int64{}}
	for i, ns := range cfg.Namespaces {
		if ns.Name == "" {
			return nil, fmt.Errorf("loadgen: namespace %d has no name", i)
		}
		for range max(ns.Weight, 1) {
			g.picks = append(g.picks, i)
		}
	}
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

// Run appends until Rows or Duration is reached or ctx ends, and reports.
// Each batch is one client.Append: failed attempts are counted
// (Report.Errors, Config.OnFailed) and retried with the same keys (an
// append is idempotent) on another node, so a node that is down or
// draining costs no rows; a batch that fails every attempt is given up
// (Report.GaveUp).
func (g *Generator) Run(ctx context.Context) (Report, error) {
	// Requests run under reqCtx, which only the caller cancels: a batch in
	// flight when Duration ends is finished and counted, so every row the
	// cluster stored is reported as appended.
	reqCtx := ctx
	if g.cfg.Duration > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, g.cfg.Duration)
		defer cancel()
	}
	start := time.Now()
	var tick <-chan time.Time
	if g.cfg.Rate > 0 {
		interval := time.Duration(float64(time.Second) * float64(g.cfg.BatchSize) / g.cfg.Rate)
		t := time.NewTicker(max(interval, time.Microsecond))
		defer t.Stop()
		tick = t.C
	}
	defer g.api.Close()
	var eg errgroup.Group
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
				g.send(reqCtx, rng, first, size)
			}
		})
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

func (g *Generator) send(ctx context.Context, rng *rand.Rand, first int64, size int) {
	rows := make([]client.Row, size)
	pad := ""
	if g.cfg.PayloadBytes > 40 {
		pad = strings.Repeat("x", g.cfg.PayloadBytes-40)
	}
	now := time.Now().UnixNano()
	for i := range rows {
		ns := g.cfg.Namespaces[g.picks[rng.IntN(len(g.picks))]]
		rows[i] = client.Row{
			DispatchKey: fmt.Sprintf("%s%d", g.cfg.KeyPrefix, first+int64(i)),
			Namespace:   ns.Name,
			TaskQueue:   fmt.Sprintf("q%d", rng.IntN(max(ns.TaskQueues, 1))),
			Payload:     json.RawMessage(fmt.Sprintf(`{"t":%d,"pad":%q}`, now, pad)),
		}
	}
	var keys []string
	hooked := client.WithAttemptHook(ctx, func(a client.Attempt) {
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
			if keys == nil {
				keys = make([]string, len(rows))
				for i := range rows {
					keys[i] = rows[i].DispatchKey
				}
			}
			g.cfg.OnFailed(a.Node, keys, a.Err)
		}
	})
	results, err := g.api.Append(hooked, rows...)
	if err != nil {
		if ctx.Err() == nil {
			g.gaveUp.Add(int64(size))
		}
		return
	}
	g.appended.Add(int64(size))
	g.mu.Lock()
	for _, r := range results {
		g.byStatus[string(r.Status)]++
	}
	g.mu.Unlock()
	if g.cfg.OnAppended != nil {
		for i, r := range rows {
			g.cfg.OnAppended(r.DispatchKey, r.Namespace, string(results[i].Status))
		}
	}
}
