package node

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/dispatch"
	"github.com/fairshard/fairshard/egress"
	"github.com/fairshard/fairshard/internal/httpapi"
	"github.com/fairshard/fairshard/internal/pause"
	"github.com/fairshard/fairshard/internal/peer"
	"github.com/fairshard/fairshard/internal/router"
	"github.com/fairshard/fairshard/internal/settings"
	"github.com/fairshard/fairshard/lease"
	"github.com/fairshard/fairshard/lifecycle"
	"github.com/fairshard/fairshard/nodeauth"
	"github.com/fairshard/fairshard/nslabel"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/quota"
	"github.com/fairshard/fairshard/replication"
	"github.com/fairshard/fairshard/shards"
)

// DataFileName is the bbolt file inside a node's data dir.
const DataFileName = "fairshard.db"

// Store is what a node needs of its outbox store: the contract
// (outbox.Store, for the dispatcher and the claim planner) plus what each
// part of the node declares it consumes: the API's reads and writes
// (httpapi.Store), replication's (replication.Local: appends and merges
// of copies, shard pages and digests, the marks of a move), persisted
// config entries (settings.ConfigStore), the
// claim scope (SetOwnedShards), the ceilings' held-claims count and the
// backlog metrics' reads. *boltstore.Store (New) and *memstore.Store
// (tests, NewWithStore) implement it; the contract suite in outboxtest
// checks every method for both, ClaimBatch (a sweep's claims in one
// transaction) included. Optional upgrades found by type assertion:
// transfer.ShardsReader (a batch of copies handed to their replica sets
// across shards in one commit) and tombstoneCollector (expiry of finished
// rows).
type Store interface {
	outbox.Store
	backpressure.BatchClaimer
	httpapi.Store
	replication.Local
	settings.ConfigStore
	// SetOwnedShards scopes claims to the shards this node owns.
	SetOwnedShards(owned []uint32)
	// CountClaimedHeld counts claimed rows held here, owned shard or not
	// (the per-node ceiling right after an ownership change).
	CountClaimedHeld(ctx context.Context, namespaces []string) (map[string]int, error)
	// MarkedRows counts rows marked in transfer.
	MarkedRows(ctx context.Context) (int, error)
	// Close closes the store; the node calls it last.
	Close() error
}

// tombstoneCollector is a store that expires finished rows after the
// dedupe window itself (boltstore); the node runs its loop as a service.
type tombstoneCollector interface {
	RunTombstoneGC(ctx context.Context, interval time.Duration) error
}

// writableStore is a store that refuses writes after a failed commit or
// fsync until it has reopened its file (boltstore.Store.Writable); the
// node is not ready and sweeps nothing meanwhile.
type writableStore interface {
	// Writable is nil when the store can commit, else why it cannot.
	Writable() error
}

// writableOf is store's Writable, nil for a store without one.
func writableOf(store Store) error {
	if w, ok := store.(writableStore); ok {
		return w.Writable()
	}
	return nil
}

// storeWritable is nil when the node's store can commit, else why not.
func (n *Node) storeWritable() error { return writableOf(n.store) }

var (
	_ Store              = (*boltstore.Store)(nil)
	_ tombstoneCollector = (*boltstore.Store)(nil)
	_ writableStore      = (*boltstore.Store)(nil)
)

// httpServing is the API's listener and server (addr: the advertised
// host:port) and, with --pprof-addr, the profiling ones (operate.go; nil
// when off).
type httpServing struct {
	ln   net.Listener
	srv  *http.Server
	addr string
	// served is set once the HTTP server serves (else Stop closes ln).
	served   atomic.Bool
	pprofLn  net.Listener
	pprofSrv *http.Server
}

// joinState is the first join of the seeds: awaiting is true from Start
// until a join succeeded or JoinWait passed (the node owns no shard
// meanwhile); attempts counts the join attempts still running
// (memberlist's Join cannot be interrupted): the cluster's stop waits for
// them.
type joinState struct {
	awaiting atomic.Bool
	attempts sync.WaitGroup
}

// ownershipView is the node's one applied ownership view: mu orders
// applySnapshot calls; applied is published after the store's claim scope
// was set from it (ownership()); terms[s] is when this node became
// primary of shard s under it (zero: it is not), the lease coordinator's
// term start. snaps and unsubscribe are the cluster subscription the
// ownership service applies.
type ownershipView struct {
	mu          sync.Mutex
	applied     atomic.Pointer[cluster.OwnershipSnapshot]
	terms       atomic.Pointer[[]time.Time]
	snaps       <-chan *cluster.OwnershipSnapshot
	unsubscribe func()
}

// Node is one fairshard process: store, membership, dispatcher, handoff and
// the HTTP API, wired in dependency order and run as services of one
// lifecycle.Manager (services.go). Build with New, run with Start, stop
// with Shutdown (graceful) or Close (at once). Safe for concurrent use.
type Node struct {
	cfg      Config
	log      *slog.Logger
	reg      *prometheus.Registry
	name     string
	store    Store
	cl       *cluster.Cluster
	settings *settings.Settings
	disp     *dispatch.Dispatcher
	peers    *peer.Client
	router   *router.Router
	repl     *replication.Replicator
	// replPeers is the replicator's node-to-node client (idle
	// connections closed at stop, with the peer client's).
	replPeers *replication.HTTPPeers
	api       *httpapi.API
	stats     *statsMetrics
	leases    *lease.Service
	// auth signs and verifies node-to-node calls: under the cluster
	// secret, or a per-process one (ownSecret) when --api-token is set
	// without one; nil when the node has neither (no credentials at all:
	// loopback or --insecure only).
	auth      *nodeauth.Auth
	ownSecret bool
	nsLabels  *nslabel.Limiter
	reach     *reachability
	// security is what the node says about its own protection
	// (/v1/cluster's "security", fairshard_insecure, the hourly warning).
	security api.Security

	// serving is the API listener and server, and the pprof one.
	serving httpServing

	// svc runs the node's services in their declared order (services.go).
	svc     *lifecycle.Manager
	ready   atomic.Bool
	failed  chan error // Failed; 1-buffered
	slotDir string     // the claimed {slot} dir; "" without slots
	// seeds tracks the first join of the seeds.
	seeds joinState
	// view is the node's applied ownership view and the cluster
	// subscription it is applied from.
	view ownershipView
	// pause notices the process not running for a while and fences its
	// claims and coordinator terms (onPause).
	pause *pause.Watch
	// graceEnd is when a graceful stop's grace ends (Shutdown): the
	// deliveries' drain takes half of what is left of it; a leave still
	// handing off rows after it says so and goes on.
	graceEnd atomic.Pointer[time.Time]
	// releaseErrs collects what failed releasing resources (cluster
	// shutdown, store close): what Close returns.
	releaseErrs errorSet
}

// New opens the node's bbolt store in cfg.DataDir, binds its HTTP listener
// and creates its cluster membership, without joining or serving yet.
// Errors name what failed: a locked data dir ("in use by another
// process"), a corrupt file, a shard count that differs from the data
// file's, a port in use.
func New(cfg Config, log *slog.Logger) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := prometheus.NewRegistry()
	store, dir, err := openStore(cfg, log, reg)
	if err != nil {
		return nil, err
	}
	slotDir := ""
	if strings.Contains(cfg.DataDir, "{slot}") {
		// A slot remembers the name of the node that first used it, so a
		// recreated container (new hostname) rejoins as the same member;
		// its lease tells the next starts that a live member holds it.
		if cfg.NodeName, err = slotNodeName(dir, cfg.NodeName); err != nil {
			_ = store.Close()
			return nil, err
		}
		if err := renewSlotLease(dir); err != nil {
			_ = store.Close()
			return nil, err
		}
		slotDir = dir
	}
	log.Info("data dir opened", "data_dir", dir)
	return build(cfg, store, reg, log, slotDir)
}

// NewWithStore is New with a store the caller built (memstore in tests, a
// replicated store later) instead of the bbolt file in cfg.DataDir, which
// is not used. The node takes the store over: Shutdown and Close close it,
// and so does a failed NewWithStore. The store's shard count must be
// cfg.Shards.
func NewWithStore(cfg Config, store Store, log *slog.Logger) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		_ = store.Close()
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return build(cfg, store, prometheus.NewRegistry(), log, "")
}

// build wires a node around an open store, one build step at a time in
// dependency order: metrics, security, HTTP listener, cluster membership,
// claim path, replicator, dispatcher, API; then declares its services.
// slotDir is the claimed {slot} dir ("" without slots). On error it
// releases what it took, the store included.
func build(cfg Config, store Store, reg *prometheus.Registry, log *slog.Logger, slotDir string) (_ *Node, err error) {
	n := &Node{cfg: cfg, log: log, reg: reg, store: store, svc: lifecycle.NewManager(log),
		failed: make(chan error, 1), slotDir: slotDir}
	var undo []func()
	defer func() {
		if err != nil {
			for i := len(undo) - 1; i >= 0; i-- {
				undo[i]()
			}
			_ = store.Close()
		}
	}()
	if err := n.buildMetrics(); err != nil {
		return nil, err
	}
	egressPolicy, err := n.buildSecurity()
	if err != nil {
		return nil, err
	}
	if err := n.listen(); err != nil {
		return nil, err
	}
	ln := n.serving.ln
	undo = append(undo, func() { _ = ln.Close() })
	if err := n.joinMembership(); err != nil {
		return nil, err
	}
	cl := n.cl
	undo = append(undo, func() { _ = cl.Shutdown() })
	cp, err := n.buildClaimPath()
	if err != nil {
		return nil, err
	}
	if err := n.buildReplication(); err != nil {
		return nil, err
	}
	rows, err := n.buildDispatcher(cp, egressPolicy)
	if err != nil {
		return nil, err
	}
	if err := n.buildAPI(cp, rows); err != nil {
		return nil, err
	}
	for _, s := range n.services() {
		if err := n.svc.Add(s); err != nil {
			return nil, err
		}
	}
	log.Info("node created", "api_addr", n.serving.addr, "gossip_addr", cl.GossipAddr(), "shards", cfg.Shards)
	return n, nil
}

// buildMetrics registers the process-wide series (Go runtime, process,
// node stats, build info) and sets the bound on namespace labels.
func (n *Node) buildMetrics() error {
	reg := n.reg
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var err error
	if n.stats, err = newStatsMetrics(reg); err != nil {
		return err
	}
	if err := registerBuildInfo(reg, n.cfg.Version, n.cfg.Revision); err != nil {
		return err
	}
	n.nsLabels = nslabel.New(n.cfg.MetricsNamespaces)
	return nil
}

// buildSecurity sets up node-to-node authentication (when the node has a
// cluster secret), the security view and peer reachability, and returns
// the delivery targets' egress policy.
func (n *Node) buildSecurity() (*egress.Policy, error) {
	var err error
	if secret := n.nodeSecret(); secret != "" { // security.go
		n.auth, err = nodeauth.New(nodeauth.Config{Secrets: [][]byte{[]byte(secret)}, MaxBodyBytes: MaxHandoffBodyBytes})
		if err != nil {
			return nil, fmt.Errorf("--cluster-secret: %w", err)
		}
	}
	egressPolicy, err := egress.Parse(n.cfg.TargetAllow)
	if err != nil {
		return nil, fmt.Errorf("--target-allow: %w", err)
	}
	if err := n.initSecurity(n.reg); err != nil { // security.go
		return nil, err
	}
	if n.reach, err = newReachability(n.reg); err != nil { // reach.go
		return nil, err
	}
	return egressPolicy, nil
}

// listen binds the HTTP listener on --http-addr; the bound address is the
// one advertised to peers.
func (n *Node) listen() error {
	ln, err := net.Listen("tcp", n.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen on --http-addr %s: %w", n.cfg.HTTPAddr, err)
	}
	n.serving.ln = ln
	return nil
}

// joinMembership creates the node's cluster membership. Until peers are
// joined the node is alone and owns every shard, and that first snapshot
// is also the store's default claim scope.
func (n *Node) joinMembership() error {
	ccfg, err := n.clusterConfig(n.serving.ln.Addr().(*net.TCPAddr))
	if err != nil {
		return err
	}
	cl, err := cluster.New(ccfg)
	if err != nil {
		return fmt.Errorf("create cluster membership: %w", err)
	}
	n.cl = cl
	n.name = cl.Name()
	n.serving.addr = ccfg.APIAddr
	n.view.applied.Store(cl.Snapshot()) // alone, owning every shard: the store's default scope too
	return nil
}

// claimPath is what decides which rows a sweep may claim and where they
// go: the routes' targets and target-host limits, the per-namespace
// ceilings and the planner that applies them.
type claimPath struct {
	targets  dispatch.TargetsFunc
	hosts    *dispatch.HostLimits
	ceilings *quota.ByMode
	planner  *backpressure.Planner
}

// buildClaimPath opens the runtime settings on the gossiped config and
// builds the claim path: target-host limits, the capacity lease service
// and the ceilings the planner enforces.
func (n *Node) buildClaimPath() (claimPath, error) {
	cfg, reg, log, store := n.cfg, n.reg, n.log, n.store
	var cp claimPath
	defaultMode, _ := quota.ParseMode(cfg.DefaultQuotaMode) // validated
	n.settings = settings.New(settings.Config{
		KV: n.cl.KV(), DefaultTarget: cfg.DefaultTarget, NodeRetry: cfg.Dispatch.Retry,
		DefaultMaxInFlight: cfg.DefaultMaxInFlight, DefaultMode: defaultMode, QuotaTTL: cfg.QuotaTTL,
	})
	cp.targets = dispatch.TargetsFunc(n.settings.DispatchTarget)
	// The target hosts' limits are one ceiling of the planner (beside each
	// namespace's) and the dispatcher's record of what is on the wire.
	var err error
	cp.hosts, err = dispatch.NewHostLimits(dispatch.HostLimitsConfig{Targets: cp.targets, MaxConnsPerHost: cfg.Dispatch.MaxConnsPerHost,
		InitialConnsPerHost: cfg.Dispatch.InitialConnsPerHost, Registerer: reg})
	if err != nil {
		return cp, fmt.Errorf("create target host limits: %w", err)
	}
	n.peers = peer.NewClient(n.auth)
	policies := n.settings.Policies()
	n.leases, err = lease.NewService(lease.ServiceConfig{
		Self: n.name, ShardCount: cfg.Shards, Timings: cfg.Lease,
		Drain: cfg.Dispatch.DeliveryTimeout, Policies: policies, Ownership: n.ownership, Terms: n.termStart, LatestTerm: n.latestTerm,
		Store: store, Eligible: func(r outbox.ClaimScope) bool { return n.disp.Eligible(r) }, Call: n.peers.Lease, Handoff: n.peers.LeaseHandoff,
		Wake: func() { n.disp.Wake() }, Claims: n.claims(store),
		Label: n.nsLabels.Label, Registerer: reg, Logger: log,
	})
	if err != nil {
		return cp, fmt.Errorf("create lease service: %w", err)
	}
	// Ceilings have one home (package quota), per namespace by mode: the
	// proportional one reads the same applied view as the claim scope, so
	// the owned fraction and the shards claimed never disagree
	// (docs/adr/0039-one-applied-ownership-view.md); the exact one this
	// node's unexpired lease.
	cp.ceilings = quota.NewByMode(policies,
		quota.NewProportional(policies, func() shards.OwnedShardFraction { return n.ownership().Fraction }),
		quota.NewLeased(policies, n.leases.Grants(), nil))
	cp.planner = backpressure.NewPlanner(backpressure.PlannerConfig{Ceilings: cp.ceilings, Claimed: n.claims(store), Hosts: cp.hosts, Logger: log})
	return cp, nil
}

// buildReplication creates the replicator that keeps every shard on its
// replica set and sets the claim scope from the applied ownership.
func (n *Node) buildReplication() error {
	cfg := n.cfg
	n.replPeers = replication.NewHTTPPeers(n.auth.Transport)
	tunables := cfg.Replication
	// A delivery the old primary started ends within the delivery
	// timeout; its settle is shipped within milliseconds.
	tunables.HandoverTimeout = cfg.Dispatch.DeliveryTimeout + 5*time.Second
	// A leaving last node waits this long for a member that failed to
	// return: the time memberlist still tells a dead member so (it can
	// refute), at least 5 s (the fast profiles' 2 s is shorter than the
	// stalls of a loaded host).
	tunables.FailedPeerWait = max(gossipProfile(cfg.GossipProfile).Config.GossipToTheDeadTime, 5*time.Second)
	var err error
	n.repl, err = replication.New(replication.Config{
		Self: n.name, ShardCount: cfg.Shards, Local: n.store, Peers: n.replPeers,
		Seeded:   len(cfg.Join) > 0,
		Scope:    n.setClaimScope,
		Wake:     func() { n.disp.Wake() },
		Tunables: tunables,
		Logger:   n.log, Registerer: n.reg,
	})
	return err
}

// buildDispatcher creates the pause fence and the dispatcher on the claim
// path. It returns the replicated row store: every row change outside
// replication goes through it, which ships it to the backups (DESIGN.md
// "One write path").
func (n *Node) buildDispatcher(cp claimPath, egressPolicy *egress.Policy) (*replication.Store, error) {
	cfg := n.cfg
	n.pause = pause.New(pauseThreshold(cfg.GossipProfile), n.onPause)
	rows := replication.NewStore(n.store, n.repl)
	var err error
	n.disp, err = dispatch.New(dispatch.Config{
		Store:          rows,
		Planner:        cp.planner,
		Claiming:       n.leases.Claiming,
		AfterSweep:     n.leases.AfterSweep,
		Writable:       n.storeWritable,
		Fence:          n.pause,
		Targets:        cp.targets,
		Hosts:          cp.hosts,
		Held:           n.settings.HeldWorkflows,
		RetryPolicyFor: n.settings.RetryPolicyFor,
		Paused:         n.settings.Paused,
		Logger:         n.log,
		Registerer:     n.reg,
		Tunables:       cfg.Dispatch,
		Egress:         egressPolicy,
		NamespaceLabel: n.nsLabels.Label,
	})
	if err != nil {
		return nil, fmt.Errorf("create dispatcher: %w", err)
	}
	return rows, nil
}

// buildAPI creates the append router, the HTTP API over rows and the
// HTTP server, behind node-to-node authentication.
func (n *Node) buildAPI(cp claimPath, rows *replication.Store) error {
	cfg, reg, log := n.cfg, n.reg, n.log
	var err error
	n.router, err = router.New(router.Config{Placer: n.repl, Logger: log, Registerer: reg})
	if err != nil {
		return err
	}
	n.api, err = httpapi.New(httpapi.Config{
		Self: n.name, ShardCount: cfg.Shards, APIToken: cfg.APIToken, Browser: n.browserPolicy(), Security: n.security, Reachable: n.reach.Reachable,
		DefaultMaxInFlight: cfg.DefaultMaxInFlight,
		MaxNamespaces:      cfg.MaxNamespaces, MaxTargets: cfg.MaxTargets, MaxHolds: cfg.MaxHolds,
		Store: rows, Router: n.router, Settings: n.settings, Ownership: n.ownership, Peers: n.peers,
		Replication: n.repl, SetReplicationFactor: n.setReplicationFactor,
		Hosts:      cp.hosts,
		Dispatcher: n.disp, Ceilings: cp.ceilings, Leases: n.leases, Ready: n.Ready, StoreWritable: n.storeWritable,
		Gatherer: reg, Registerer: reg, Logger: log,
	})
	if err != nil {
		return err
	}
	n.serving.srv = newHTTPServer(n.auth.Middleware(n.api.Handler()), cfg) // security.go
	return nil
}

// Name returns the node's name in the cluster.
func (n *Node) Name() string { return n.name }

// APIAddr returns the host:port other nodes and clients use for this
// node's API.
func (n *Node) APIAddr() string { return n.serving.addr }

// ListenAddr returns the host:port the HTTP listener is bound to. It
// differs from APIAddr when --advertise-http names another address (a
// proxy, a NAT mapping); with --http-addr port 0 it tells the chosen port.
func (n *Node) ListenAddr() string { return n.serving.ln.Addr().String() }

// GossipAddr returns the ip:port peers use to reach this node's gossip
// (what --join takes).
func (n *Node) GossipAddr() string { return n.cl.GossipAddr() }

// NodeAuth returns the signer of node-to-node calls: wrap the transport
// of every client of another node's /internal/ routes with its Transport
// (nil without a cluster secret, which Transport accepts: calls go
// unsigned).
func (n *Node) NodeAuth() *nodeauth.Auth { return n.auth }

// Registry returns the node's metrics registry (served on /metrics).
func (n *Node) Registry() *prometheus.Registry { return n.reg }

// openStore resolves the data dir (claiming a "{slot}" by the rule of
// openSlot when the path has one) and opens the bbolt store with a lock
// timeout, so a second process on the same dir fails clearly instead of
// hanging.
func openStore(cfg Config, log *slog.Logger, reg prometheus.Registerer) (*boltstore.Store, string, error) {
	opts := boltstore.Options{
		ShardCount:         cfg.Shards,
		LockTimeout:        time.Second,
		TombstoneRetention: cfg.TombstoneRetention,
		Logger:             log,
		Registerer:         reg,
	}
	if !strings.Contains(cfg.DataDir, "{slot}") {
		s, err := openIn(cfg.DataDir, opts)
		return s, cfg.DataDir, err
	}
	return openSlot(cfg, opts, time.Now()) // slot.go
}

func openIn(dir string, opts boltstore.Options) (*boltstore.Store, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("create data dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, DataFileName)
	s, err := boltstore.Open(path, opts)
	switch {
	case errors.Is(err, boltstore.ErrLocked):
		return nil, fmt.Errorf("data dir %s is in use by another process (lock on %s): %w", dir, path, err)
	case errors.Is(err, boltstore.ErrCorrupt):
		return nil, fmt.Errorf("data file %s is corrupt; restore it from a backup or move it away: %w", path, err)
	case errors.Is(err, boltstore.ErrShardCountMismatch):
		return nil, fmt.Errorf("data file %s was written with another --shards value: %w", path, err)
	case err != nil:
		return nil, fmt.Errorf("open data file %s: %w", path, err)
	}
	return s, nil
}

// clusterConfig builds the memberlist-backed cluster config from the boot
// config: addresses (advertised ones must be IP literals), the API address
// in node meta, the persisted config entries and their persistence hook.
func (n *Node) clusterConfig(httpBound *net.TCPAddr) (*cluster.Config, error) {
	cfg := n.cfg
	c := gossipProfile(cfg.GossipProfile)
	c.Name = cfg.NodeName
	host, portStr, _ := net.SplitHostPort(cfg.GossipAddr)
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("--gossip-addr %q: bad port", cfg.GossipAddr)
	}
	host = cmp.Or(host, "0.0.0.0")
	c.BindAddr, c.BindPort = host, port
	advIP := ""
	if cfg.AdvertiseGossip != "" {
		h, p, _ := net.SplitHostPort(cfg.AdvertiseGossip)
		ap, _ := strconv.Atoi(p)
		c.AdvertiseAddr, c.AdvertisePort = h, ap
		advIP = h
	} else if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		advIP = host
	} else {
		// Bound to every interface: advertise the default route's address,
		// chosen here so the API address can use the same one, and say so.
		ch, err := cluster.ChooseAdvertiseIP()
		if err != nil {
			return nil, err
		}
		n.logAdvertiseChoice(ch)
		c.AdvertiseAddr, c.AdvertisePort, advIP = ch.IP, port, ch.IP
	}
	if port == 0 {
		c.AdvertisePort = 0
	}
	c.Join = cfg.Join
	c.ShardCount = cfg.Shards
	c.GossipKeys = cfg.GossipKeys
	c.Logger = n.log
	c.Registerer = n.reg
	// The API address peers use: explicit, else the bound HTTP port on the
	// bound host (or the advertised gossip IP when bound to every interface).
	if cfg.AdvertiseHTTP != "" {
		c.APIAddr = cfg.AdvertiseHTTP
	} else {
		h := httpBound.IP.String()
		if httpBound.IP.IsUnspecified() {
			h = advIP
		}
		c.APIAddr = net.JoinHostPort(h, strconv.Itoa(httpBound.Port))
	}
	initial, err := settings.Load(context.Background(), n.store, n.log)
	if err != nil {
		return nil, fmt.Errorf("load persisted cluster config: %w", err)
	}
	c.KV.Initial = initial
	c.KV.Persister = settings.Persister{Store: n.store}
	// Replica sets start with the cluster's replication factor as this
	// node last knew it, else the flag (a new cluster); seedReplicationFactor
	// settles it once the node has joined.
	c.ReplicationFactor = cfg.ReplicationFactor
	for _, e := range initial {
		if e.Key == KeyReplicationFactor && !e.Deleted {
			if r, err := parseFactor(e.Value); err == nil {
				c.ReplicationFactor = r
			}
		}
	}
	return c, nil
}

// logAdvertiseChoice says which address a node bound to every interface
// advertises, why, and which flags set it: a warning when several addresses
// were as good, since peers that cannot reach the chosen one see this node
// as dead while it sees them alive.
func (n *Node) logAdvertiseChoice(ch cluster.AdvertiseChoice) {
	attrs := []any{"ip", ch.IP, "interface", ch.Interface, "reason", ch.Reason,
		"set_with", "--advertise-gossip (and --advertise-http for the API)", "bound", n.cfg.GossipAddr}
	switch {
	case len(ch.Candidates) > 1:
		n.log.Warn("several addresses could be advertised to peers; chose the first: set --advertise-gossip to choose",
			append(attrs, "candidates", strings.Join(ch.Candidates, ","))...)
	case ch.Reason == cluster.ReasonLoopback:
		n.log.Warn("advertising loopback: only peers on this host can reach it; set --advertise-gossip", attrs...)
	default:
		n.log.Info("advertising gossip address", attrs...)
	}
}

// claims is the node's claim rule (quota.Claims): a namespace's claimed
// rows held here on every shard, or the deliveries running if more, less
// the deliveries already answered and settling. The planner, the lease
// demand and the API read it.
func (n *Node) claims(store Store) quota.Claims {
	return quota.Claims{Held: store.CountClaimedHeld, Deliveries: func() quota.Deliveries {
		if n.disp == nil {
			return quota.Deliveries{} // not built yet: nothing runs
		}
		return n.disp.Deliveries()
	}}
}

// updateTerms records, for every shard this node is primary of in s, when
// it became so (kept from the previous view when it already was): the
// lease coordinator's term start (lease.CoordinatorConfig.Coordinates).
// A node alone in its view starts its terms one learning period in the
// past: no other member can hold grants of a previous coordinator, so it
// need not learn (a cluster's first node grants at once). Called by
// applySnapshot under snapMu.
func (n *Node) updateTerms(s *cluster.OwnershipSnapshot) {
	now := time.Now()
	start := now
	if len(s.Members) <= 1 {
		start = now.Add(-2 * n.cfg.Lease.LeaseLength)
	}
	var old []time.Time
	if p := n.view.terms.Load(); p != nil {
		old = *p
	}
	terms := make([]time.Time, s.ShardCount)
	for _, sh := range s.Owned {
		if int(sh) < len(old) && !old[sh].IsZero() {
			terms[sh] = old[sh]
		} else {
			terms[sh] = start
		}
	}
	n.view.terms.Store(&terms)
}

// renewTerms starts a new coordinator term, now, for every shard this node
// is primary of in its applied view: its coordinators drop what they
// recorded and learn again (grant only what nodes report they hold),
// since while the process did not run another node may have coordinated
// and granted (onPause).
func (n *Node) renewTerms() {
	n.view.mu.Lock()
	defer n.view.mu.Unlock()
	s := n.ownership()
	if len(s.Members) <= 1 {
		return // alone: nobody else could have granted
	}
	now := time.Now()
	terms := make([]time.Time, s.ShardCount)
	for _, sh := range s.Owned {
		terms[sh] = now
	}
	n.view.terms.Store(&terms)
}

// onPause is the pause watch's callback (internal/pause): the process did
// not run for gap, longer than the failure detection it was measured
// against, so the others may have declared it dead, taken its shards and
// coordinated its namespaces meanwhile. Its claims are already fenced (the
// dispatcher sends nothing claimed before the pause, and claims nothing
// until the watch has ticked); before it claims again, every shard it is
// primary of waits for a handover (replication.Fence), and its coordinator
// terms start anew, learning before they grant.
func (n *Node) onPause(gap time.Duration) {
	n.log.Warn("this process did not run for a while: its primary shards wait for a handover and its coordinator terms start anew before it claims or grants again",
		"gap", gap.Round(time.Millisecond), "threshold", n.pause.Threshold())
	n.stats.pauses.Inc()
	n.repl.Fence()
	n.renewTerms()
}

// pauseThreshold is the gap in the node's own ticks that counts as a
// pause: four fifths of the shortest time the gossip profile's peers take
// to declare a stopped node dead (cluster.Config.MinFailureDetection), at
// most 2 s. So a pause long enough for the others to take this node's
// shards is always noticed, while a scheduling delay well below failure
// detection (a loaded host) is not taken for one: "lan" 2 s, "shared-host"
// 880 ms, "fast" 304 ms.
func pauseThreshold(profile string) time.Duration {
	return min(2*time.Second, gossipProfile(profile).MinFailureDetection()*4/5)
}

// gossipProfile returns the cluster config of a --gossip-profile
// ("lan", "fast" or "shared-host"; Config.Validate checks the name).
func gossipProfile(name string) *cluster.Config {
	switch name {
	case "fast":
		return cluster.FastConfig()
	case "shared-host":
		return cluster.SharedHostConfig()
	}
	return cluster.DefaultConfig()
}

// latestTerm returns the latest term start among the shards this node is
// primary of (zero: none).
func (n *Node) latestTerm() time.Time {
	p := n.view.terms.Load()
	if p == nil {
		return time.Time{}
	}
	var latest time.Time
	for _, t := range *p {
		if t.After(latest) {
			latest = t
		}
	}
	return latest
}

// termStart returns when this node became primary of shard under its
// applied view; zero when it is not.
func (n *Node) termStart(shard uint32) time.Time {
	p := n.view.terms.Load()
	if p == nil || int(shard) >= len(*p) {
		return time.Time{}
	}
	return (*p)[shard]
}
