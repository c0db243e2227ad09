package dispatch

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/outbox"
)

// DefaultHostIdleExpiry is how long a target host with nothing in flight
// keeps its limit and its metric series before it is forgotten (a host
// used again later starts from the initial limit).
const DefaultHostIdleExpiry = 10 * time.Minute

// maxHostTemplates bounds the cache of parsed target URL templates; past
// it the cache is cleared (templates come from the cluster config, so it
// is only reached if targets churn).
const maxHostTemplates = 10_000

// HostLimitsConfig wires a HostLimits. Targets is required.
type HostLimitsConfig struct {
	// Targets resolves a route's target (the same as the dispatcher's).
	Targets Targets
	// MaxConnsPerHost is the upper bound of each host's limit (rows in
	// flight, ≥ 1). Defaults to DefaultMaxConnsPerHost (512).
	MaxConnsPerHost int
	// InitialConnsPerHost is a new host's limit, in [1, MaxConnsPerHost].
	// Defaults to min(DefaultInitialConnsPerHost, MaxConnsPerHost).
	InitialConnsPerHost int
	// IdleExpiry is how long a host with nothing in flight is remembered.
	// Defaults to DefaultHostIdleExpiry (10 min).
	IdleExpiry time.Duration
	// Registerer receives the per-host metrics (fairshard_target_host_*);
	// nil keeps them unregistered.
	Registerer prometheus.Registerer
}

// HostLimits keeps, for every target host this node delivers to, an
// adaptive concurrency limit and the rows in flight, by namespace. A
// target host is the scheme, host and port of a route's target URL after
// template expansion ("https://hooks.example.com:443"): deliveries to one
// host share its limit whatever their path, namespace or task queue.
//
// It is the backpressure.HostSlots of the node's planner (which claims
// only what a host has slots for) and the dispatcher's record of what is
// on the wire (which feeds each finished attempt to the host's limit).
// Give the same HostLimits to both: PlannerConfig.Hosts and Config.Hosts.
//
// The limit is AIMD between 1 and MaxConnsPerHost (aimdLimit): it grows
// by one per answer while at least half of it is in use and the host
// answers quickly, and halves, at most once per round trip, on timeouts,
// connection errors, 429, 503 and answer times well above the recent
// minimum. Metrics: fairshard_target_host_limit{host},
// fairshard_target_host_in_flight{host},
// fairshard_target_host_limit_cuts_total{host,reason}; a host's series
// exist while it is in use (IdleExpiry). Safe for concurrent use.
type HostLimits struct {
	targets    Targets
	max        int
	initial    int
	idleExpiry time.Duration
	m          *hostMetrics

	tmplMu sync.Mutex
	tmpl   map[string]hostTemplate // target URL template → its host, when static

	mu    sync.Mutex
	hosts map[string]*hostState
}

type hostState struct {
	lim      aimdLimit
	inflight int
	byNS     map[string]int
	lastUsed time.Time
	// The host's series, looked up once (not per delivery).
	limitG, inflightG prometheus.Gauge
}

// hostTemplate is a parsed target URL template: static when its scheme
// and authority hold no placeholder (every route gets the same host).
type hostTemplate struct {
	static bool
	host   string
	ok     bool
}

// NewHostLimits validates cfg (after filling defaults), registers the
// metrics and returns an empty HostLimits. Errors wrap ErrInvalidConfig
// and name the field, or report a metrics registration conflict.
func NewHostLimits(cfg HostLimitsConfig) (*HostLimits, error) {
	cfg.MaxConnsPerHost = cmp.Or(cfg.MaxConnsPerHost, DefaultMaxConnsPerHost)
	cfg.InitialConnsPerHost = cmp.Or(cfg.InitialConnsPerHost, min(DefaultInitialConnsPerHost, cfg.MaxConnsPerHost))
	cfg.IdleExpiry = cmp.Or(cfg.IdleExpiry, DefaultHostIdleExpiry)
	switch {
	case cfg.Targets == nil:
		return nil, fmt.Errorf("%w: HostLimitsConfig.Targets is required", ErrInvalidConfig)
	case cfg.MaxConnsPerHost < 1:
		return nil, fmt.Errorf("%w: MaxConnsPerHost must be ≥ 1, got %d", ErrInvalidConfig, cfg.MaxConnsPerHost)
	case cfg.InitialConnsPerHost < 1 || cfg.InitialConnsPerHost > cfg.MaxConnsPerHost:
		return nil, fmt.Errorf("%w: InitialConnsPerHost must be in [1, MaxConnsPerHost %d], got %d", ErrInvalidConfig, cfg.MaxConnsPerHost, cfg.InitialConnsPerHost)
	case cfg.IdleExpiry < 0:
		return nil, fmt.Errorf("%w: IdleExpiry must be > 0, got %v", ErrInvalidConfig, cfg.IdleExpiry)
	}
	m, err := newHostMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	return &HostLimits{
		targets:    cfg.Targets,
		max:        cfg.MaxConnsPerHost,
		initial:    cfg.InitialConnsPerHost,
		idleExpiry: cfg.IdleExpiry,
		m:          m,
		tmpl:       map[string]hostTemplate{},
		hosts:      map[string]*hostState{},
	}, nil
}

var _ backpressure.HostSlots = (*HostLimits)(nil)

// HostOf implements backpressure.HostSlots: the target host of the
// route's rows, "scheme://host:port" with the host lower-cased and the
// scheme's default port filled in. ok is false when the route has no
// usable target (no target, or not an absolute http(s) URL).
func (h *HostLimits) HostOf(route outbox.ClaimScope) (string, bool) {
	t, ok := h.targets.Target(route)
	if !ok {
		return "", false
	}
	return h.hostOfURL(t.URL, route)
}

// hostOfURL resolves a target URL template for a route, parsing a static
// template once.
func (h *HostLimits) hostOfURL(tmpl string, route outbox.ClaimScope) (string, bool) {
	h.tmplMu.Lock()
	t, cached := h.tmpl[tmpl]
	h.tmplMu.Unlock()
	if cached && t.static {
		return t.host, t.ok
	}
	host, ok := hostKey(expandURL(tmpl, route))
	if !cached {
		t = hostTemplate{static: staticAuthority(tmpl), host: host, ok: ok}
		h.tmplMu.Lock()
		if len(h.tmpl) >= maxHostTemplates {
			clear(h.tmpl)
		}
		h.tmpl[tmpl] = t
		h.tmplMu.Unlock()
	}
	return host, ok
}

// staticAuthority reports whether a URL template's scheme and authority
// hold no placeholder.
func staticAuthority(tmpl string) bool {
	start, end := 0, len(tmpl)
	if i := strings.Index(tmpl, "://"); i >= 0 {
		start = i + 3
	}
	if j := strings.IndexAny(tmpl[start:], "/?#"); j >= 0 {
		end = start + j
	}
	return !strings.Contains(tmpl[:end], "{")
}

// hostKey is the host key of an absolute http(s) URL:
// "scheme://host:port", the host lower-cased, the default port filled in.
func hostKey(raw string) (string, bool) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", false
	}
	port := u.Port()
	if port == "" {
		port = "80"
		if u.Scheme == "https" {
			port = "443"
		}
	}
	return u.Scheme + "://" + net.JoinHostPort(strings.ToLower(u.Hostname()), port), true
}

// HostUsage implements backpressure.HostSlots: the host's current limit
// and rows in flight (a copy). A host never seen has the initial limit.
func (h *HostLimits) HostUsage(host string) backpressure.HostUsage {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.hosts[host]
	if !ok {
		return backpressure.HostUsage{Limit: h.initial}
	}
	return backpressure.HostUsage{Limit: s.lim.current(), InFlight: s.inflight, ByNamespace: maps.Clone(s.byNS)}
}

// HostStatus is one target host as HostLimits sees it now.
type HostStatus struct {
	// Host is "scheme://host:port".
	Host string `json:"host"`
	// Limit is the current concurrency limit (rows, 1 … MaxConnsPerHost).
	Limit int `json:"limit"`
	// InFlight is the rows being delivered to the host now.
	InFlight int `json:"in_flight"`
	// MinRTTMS is the recent minimum answer time (ms; 0 before the first
	// answer).
	MinRTTMS float64 `json:"min_rtt_ms"`
}

// Hosts returns every host in use, sorted by host.
func (h *HostLimits) Hosts() []HostStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]HostStatus, 0, len(h.hosts))
	for name, s := range h.hosts {
		out = append(out, HostStatus{Host: name, Limit: s.lim.current(), InFlight: s.inflight,
			MinRTTMS: float64(s.lim.minRTT().Microseconds()) / 1000})
	}
	slices.SortFunc(out, func(a, b HostStatus) int { return strings.Compare(a.Host, b.Host) })
	return out
}

// acquire records one row of namespace ns going out to host and returns
// the host's rows in flight, this one included.
func (h *HostLimits) acquire(host, ns string, now time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.state(host)
	s.inflight++
	s.byNS[ns]++
	s.lastUsed = now
	s.inflightG.Set(float64(s.inflight))
	return s.inflight
}

// release records the end of a row's attempt to host and feeds the
// attempt to the host's limit.
func (h *HostLimits) release(host, ns string, smp sample) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.state(host)
	s.inflight = max(s.inflight-1, 0)
	if s.byNS[ns]--; s.byNS[ns] <= 0 {
		delete(s.byNS, ns)
	}
	s.lastUsed = smp.at
	if reason := s.lim.observe(smp); reason != "" {
		h.m.cuts.WithLabelValues(host, reason).Inc()
	}
	s.inflightG.Set(float64(s.inflight))
	s.limitG.Set(float64(s.lim.current()))
}

// state returns the host's state, creating it. Called with mu held.
func (h *HostLimits) state(host string) *hostState {
	s, ok := h.hosts[host]
	if !ok {
		s = &hostState{lim: newAIMDLimit(h.initial, h.max), byNS: map[string]int{},
			limitG: h.m.limit.WithLabelValues(host), inflightG: h.m.inflight.WithLabelValues(host)}
		h.hosts[host] = s
		s.limitG.Set(float64(s.lim.current()))
	}
	return s
}

// expire forgets the hosts with nothing in flight since IdleExpiry before
// now, and their metric series. It returns how many it forgot.
func (h *HostLimits) expire(now time.Time) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for name, s := range h.hosts {
		if s.inflight == 0 && now.Sub(s.lastUsed) >= h.idleExpiry {
			delete(h.hosts, name)
			h.m.forget(name)
			n++
		}
	}
	return n
}

// hostMetrics are the per-host series. The host label's values are the
// hosts in use: bounded by the configured targets, and forgotten after
// IdleExpiry without traffic.
type hostMetrics struct {
	limit    *prometheus.GaugeVec   // fairshard_target_host_limit{host}
	inflight *prometheus.GaugeVec   // fairshard_target_host_in_flight{host}
	cuts     *prometheus.CounterVec // fairshard_target_host_limit_cuts_total{host,reason}
}

func newHostMetrics(reg prometheus.Registerer) (*hostMetrics, error) {
	m := &hostMetrics{
		limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fairshard_target_host_limit",
			Help: "Current adaptive concurrency limit of a target host on this node (rows in flight, 1 … --max-conns-per-host).",
		}, []string{"host"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "fairshard_target_host_in_flight",
			Help: "Rows this node is delivering to a target host right now.",
		}, []string{"host"}),
		cuts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "fairshard_target_host_limit_cuts_total",
			Help: "Times a target host's concurrency limit was halved, by reason (timeout, connection, status_429, status_503, latency).",
		}, []string{"host", "reason"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	var done []prometheus.Collector
	for _, c := range []prometheus.Collector{m.limit, m.inflight, m.cuts} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
			continue
		}
		done = append(done, c)
	}
	if err := errors.Join(errs...); err != nil {
		for _, c := range done {
			reg.Unregister(c)
		}
		return nil, fmt.Errorf("dispatch: register host metrics: %w", err)
	}
	return m, nil
}

func (m *hostMetrics) forget(host string) {
	m.limit.DeleteLabelValues(host)
	m.inflight.DeleteLabelValues(host)
	m.cuts.DeletePartialMatch(prometheus.Labels{"host": host})
}
