package httpapi

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/internal/httperr"
	"github.com/fairshard/fairshard/internal/peer"
	"github.com/fairshard/fairshard/internal/router"
	"github.com/fairshard/fairshard/internal/settings"
	"github.com/fairshard/fairshard/internal/webui"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/quota"
	"github.com/fairshard/fairshard/replication"
)

// Store is what the API reads and writes in the node's store directly
// (appends go through the Router).
type Store interface {
	Get(ctx context.Context, dispatchKey string) (outbox.Row, error)
	// ListDeadLetterPage reads one page of a namespace's dead letters,
	// bounded in rows and bytes, with or without payloads
	// (outbox.DeadLetterQuery).
	ListDeadLetterPage(ctx context.Context, namespace string, q outbox.DeadLetterQuery) (outbox.DeadLetterPage, error)
	Redrive(ctx context.Context, namespace string, keys []string, now time.Time) (int, error)
	NamespaceStats(ctx context.Context) (map[string]outbox.NamespaceStats, error)
	// CountClaimedHeld counts claimed rows held here per namespace, every
	// shard (the dispatcher's ceiling count; a row's `waiting`).
	CountClaimedHeld(ctx context.Context, namespaces []string) (map[string]int, error)
	// ConsoleStore is the read-back's (console.go).
	ConsoleStore
}

// Replication is what the API needs of the node's replicator
// (*replication.Replicator).
type Replication interface {
	replication.Server
	// Status is this node's replication state.
	Status() api.ReplicationStatus
	// ShardStatus asks every replica of a shard for its state.
	ShardStatus(ctx context.Context, shard uint32) (api.ShardStatus, error)
	// Leftovers lists the shards holding rows here that this node does
	// not replicate (still to hand to their replica sets).
	Leftovers(ctx context.Context) ([]uint32, error)
}

// Appender places the rows of a public append (*router.Router).
type Appender interface {
	Append(ctx context.Context, rows []outbox.Row) ([]router.Result, error)
}

// Dispatcher is what the API tells and asks the node's dispatcher
// (*dispatch.Dispatcher).
type Dispatcher interface {
	// Wake asks for a sweep soon (rows or settings changed).
	Wake()
	// RoutesWithoutTarget lists the routes whose rows wait for a target.
	RoutesWithoutTarget() []outbox.ClaimScope
	// Eligible reports whether a route may be claimed now (namespace not
	// paused, usable target): the dispatcher's own route filter.
	Eligible(route outbox.ClaimScope) bool
}

// Config wires an API. Every field but Logger, Registerer, Leases and the tokens
// is required.
type Config struct {
	// Self is this node's name (answers name it).
	Self string
	// ShardCount is the cluster's shard count.
	ShardCount uint32
	// APIToken, when set, is required as a bearer token on /v1. It never
	// opens /internal/v1: those routes are authenticated by package
	// nodeauth's middleware, which the node wraps around Handler.
	APIToken string
	// Browser keeps out requests a web page makes a browser send (Host,
	// Origin, Sec-Fetch-Site and Content-Type checks; browser.go).
	Browser BrowserPolicy
	// Security is /v1/cluster's "security": what protects this node.
	Security api.Security
	// Reachable reports whether a member's API answers health checks
	// (/v1/cluster's "reachable"; nil: every member is).
	Reachable func(member string) bool
	// DefaultMaxInFlight is the quota shown for namespaces without one.
	DefaultMaxInFlight uint32
	// MaxNamespaces, MaxTargets and MaxHolds cap the gossiped config
	// (409 limit_exceeded past them).
	MaxNamespaces, MaxTargets, MaxHolds int

	Store  Store
	Router Appender
	// Replication is the node's replicator: its node-to-node routes
	// (mounted under replication.PathPrefix, behind the cluster secret and
	// the intake gate) and its state for GET /v1/cluster and
	// GET /v1/shards/{n}.
	Replication Replication
	// SetReplicationFactor changes the cluster's replication factor (PUT
	// /v1/cluster): it writes the gossiped config and applies it here.
	SetReplicationFactor func(ctx context.Context, r int) error
	Settings             *settings.Settings
	Ownership            func() *cluster.OwnershipSnapshot
	Peers                *peer.Client
	Dispatcher           Dispatcher
	// Ceilings gives this node's ceiling per namespace, the planner's own
	// source (quota.ByMode): the namespace view shows it.
	Ceilings quota.Source
	// Leases is the node's lease service (exact quota mode): its internal
	// routes and the namespace view's "lease". nil: the lease route
	// answers 503 and views have no "lease".
	Leases Leases
	// Ready reports whether the node serves (GET /readyz answers 200);
	// the API adds "not draining".
	Ready func() bool
	// StoreWritable, when set, is nil while the store can commit, else
	// why it cannot (a failed commit or fsync, a full disk); /readyz
	// names that cause while it is not ready.
	StoreWritable func() error
	// Gatherer is served on /metrics.
	Gatherer prometheus.Gatherer
	// Hosts is the planner's target host ceiling (*dispatch.HostLimits),
	// read by a row's explanation; nil: no host reason is given.
	Hosts backpressure.HostSlots
	// Registerer receives the API's own metrics (nil: none).
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// API is the node's HTTP API: the public /v1 routes, the node-to-node
// /internal/v1 routes, /metrics, /healthz and /readyz. It decodes and
// validates requests (a bad one is answered 4xx naming the field and
// changes nothing), calls the node's parts and answers JSON. Safe for
// concurrent use.
type API struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics
	handler http.Handler
	// routePatterns are the HTTP routes (see Routes), set by routes().
	routePatterns []string
	intake        intakeGate
	draining      atomic.Bool
	// statsMu guards the delivery figures the namespace views reuse for
	// a second (console.go).
	statsMu  sync.Mutex
	statsAt  time.Time
	statsMFs []*dto.MetricFamily
}

// New builds the API and registers its metrics.
func New(cfg Config) (*API, error) {
	if cfg.Store == nil || cfg.Router == nil || cfg.Replication == nil || cfg.SetReplicationFactor == nil ||
		cfg.Settings == nil || cfg.Ownership == nil || cfg.Peers == nil || cfg.Dispatcher == nil || cfg.Ceilings == nil || cfg.Ready == nil || cfg.Gatherer == nil {
		return nil, errors.New("httpapi: Store, Router, Replication, SetReplicationFactor, Settings, Ownership, Peers, Dispatcher, Ceilings, Ready and Gatherer are required")
	}
	a := &API{cfg: cfg, log: cfg.Logger}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	var err error
	if a.m, err = newMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	a.handler = a.routes()
	return a, nil
}

// Handler returns the API's HTTP handler.
func (a *API) Handler() http.Handler { return a.handler }

// RefuseAppends makes public appends answer 503 (append through another
// node) and readiness false: the first step of a graceful stop.
func (a *API) RefuseAppends() { a.draining.Store(true) }

// Draining reports whether RefuseAppends was called.
func (a *API) Draining() bool { return a.draining.Load() }

// CloseIntake refuses every later request that would store rows here
// (public and forwarded appends, handoff batches: answered 503, the sender
// keeps the rows) and waits until those admitted have finished, or ctx
// ends (the error then says how many are still running). A stopping node
// calls it once it is marked leaving, so its final handoff sees every row
// it ever acknowledged.
func (a *API) CloseIntake(ctx context.Context) error { return a.intake.close(ctx) }

// routes builds the HTTP API: public /v1 (bearer token when configured),
// node-to-node /internal/v1 (cluster secret), and open /metrics, /healthz,
// /readyz, behind the browser checks (browserGuard). Unknown paths and
// methods get JSON errors too.
//
// In GET /v1/rows/{dispatch_key} the key is best sent as one escaped path
// segment (url.PathEscape: '/' as %2F): plain slashes work, except where
// they form empty or dot segments ("a//b", "x/./y"), which the router
// cleans before matching.
func (a *API) routes() http.Handler {
	mux := &routeMux{ServeMux: http.NewServeMux()}
	defer func() { a.routePatterns = mux.patterns }()
	pub := func(pattern string, h http.HandlerFunc) { mux.Handle(pattern, auth(a.cfg.APIToken, h)) }
	// Node-to-node routes: authenticated by the node's nodeauth middleware
	// on the /internal/ prefix (signed both ways), never by the API token.
	internal := func(pattern string, h http.HandlerFunc) { mux.Handle(pattern, h) }

	pub("POST /v1/rows", a.handleAppend)
	pub("GET /v1/rows/{key...}", a.handleGetRow)
	pub("GET /v1/rows", func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, &httperr.Error{Status: http.StatusNotFound, Code: api.CodeNotFound, Field: "dispatch_key",
			Message: "dispatch_key: missing; GET /v1/rows/{dispatch_key}"})
	})
	pub("GET /v1/namespaces", a.handleListNamespacesCluster)
	pub("GET /v1/namespaces/{ns}", a.handleGetNamespaceCluster)
	pub("PUT /v1/namespaces/{ns}", a.handlePutNamespace)
	pub("PUT /v1/namespaces/{ns}/task-queues/{tq}/target", a.handlePutTarget)
	pub("DELETE /v1/namespaces/{ns}/task-queues/{tq}/target", a.handleDeleteTarget)
	pub("GET /v1/namespaces/{ns}/dead-letters", a.handleDeadLetters)
	pub("POST /v1/namespaces/{ns}/dead-letters/redrive", a.handleRedrive)
	pub("PUT /v1/workflows/{wf}/hold", a.handleHold)
	pub("DELETE /v1/workflows/{wf}/hold", a.handleRelease)
	pub("GET /v1/cluster", a.handleCluster)
	pub("PUT /v1/cluster", a.handlePutCluster)
	pub("GET /v1/shards", a.handleShards)
	pub("GET /v1/shards/{shard}", a.handleShard)
	pub("GET /v1/openapi.yaml", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", api.ContentType)
		_, _ = io.WriteString(w, api.OpenAPIYAML())
	})

	a.consoleRoutes(pub, internal)

	repl := replication.Handler(a.cfg.Replication, gate{&a.intake}, a.checkRemoteRows)
	for _, pattern := range replication.Routes() {
		internal(pattern, repl.ServeHTTP)
	}
	var leases peer.Leases
	if a.cfg.Leases != nil {
		leases = a.cfg.Leases // a nil Leases must stay a nil interface
	}
	node := peer.NewServer(peer.ServerConfig{Local: peerLocal{a}, Leases: leases})
	for _, pattern := range peer.Routes() {
		internal(pattern, node.ServeHTTP)
	}

	mux.Handle("GET "+webui.Prefix, webui.Handler())
	mux.Handle("GET /ui", http.RedirectHandler(webui.Prefix, http.StatusMovedPermanently))
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.cfg.Gatherer, promhttp.HandlerOpts{Registry: a.cfg.Registerer}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		httperr.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !a.cfg.Ready() || a.Draining() {
			msg := "not ready: starting, draining, not joined or not accepted by the cluster yet"
			if a.cfg.StoreWritable != nil {
				if err := a.cfg.StoreWritable(); err != nil {
					msg = "not ready: the store cannot write: " + err.Error()
				}
			}
			writeError(w, &httperr.Error{Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable, Message: msg})
			return
		}
		httperr.WriteJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	return browserGuard(a.cfg.Browser, jsonMuxErrors(mux.ServeMux))
}

// routeMux is a ServeMux that remembers the patterns registered on it, so
// Routes can list them (the OpenAPI test in api/ compares them with
// api/openapi.yaml).
type routeMux struct {
	*http.ServeMux
	patterns []string
}

func (m *routeMux) Handle(pattern string, h http.Handler) {
	m.ServeMux.Handle(pattern, h)
	m.patterns = append(m.patterns, pattern)
}

func (m *routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// Routes returns the patterns of every route the node serves, in
// net/http.ServeMux syntax ("GET /v1/rows/{key...}"), node-to-node routes
// included, sorted. Every public one must be described in api/openapi.yaml.
func (a *API) Routes() []string {
	out := slices.Clone(a.routePatterns)
	slices.Sort(out)
	return out
}

// jsonMuxErrors turns the mux's own plain-text 404 and 405 answers into the
// API's JSON errors.
func jsonMuxErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(&muxErrorWriter{ResponseWriter: w, r: r}, r)
	})
}

type muxErrorWriter struct {
	http.ResponseWriter
	r       *http.Request
	skipped bool
}

func (m *muxErrorWriter) WriteHeader(status int) {
	switch status {
	case http.StatusNotFound:
		m.skipped = true
		writeError(m.ResponseWriter, &httperr.Error{Status: status, Code: api.CodeNotFound, Message: "no such endpoint: " + m.r.URL.Path})
	case http.StatusMethodNotAllowed:
		m.skipped = true
		m.ResponseWriter.Header().Del("Content-Type")
		writeError(m.ResponseWriter, &httperr.Error{Status: status, Code: api.CodeMethodNotAllowed,
			Message: fmt.Sprintf("method %s not allowed on %s (allowed: %s)", m.r.Method, m.r.URL.Path, m.ResponseWriter.Header().Get("Allow"))})
	default:
		m.ResponseWriter.WriteHeader(status)
	}
}

func (m *muxErrorWriter) Write(b []byte) (int, error) {
	if m.skipped {
		return len(b), nil
	}
	return m.ResponseWriter.Write(b)
}

// auth requires "Authorization: Bearer <token>" when token is set. The
// scheme name is case-insensitive (RFC 9110 §11.1), the token is not.
func auth(token string, h http.HandlerFunc) http.Handler {
	if token == "" {
		return h
	}
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, cred, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(strings.TrimLeft(cred, " ")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="fairshard"`)
			writeError(w, &httperr.Error{Status: http.StatusUnauthorized, Code: api.CodeUnauthorized, Message: "missing or wrong bearer token"})
			return
		}
		h(w, r)
	})
}

func pathName(r *http.Request, param string) (string, error) {
	v := r.PathValue(param)
	if !ValidName(v) {
		field := map[string]string{"ns": "namespace", "tq": "task_queue"}[param]
		return "", httperr.Field(field, "%q must be 1-64 letters, digits, '-', '_' or '.'", v)
	}
	return v, nil
}
