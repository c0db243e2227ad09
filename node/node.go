package node

import (
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

	"github.com/hashicorp/go-sockaddr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/dispatch"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
	"github.com/fairshard/fairshard/transfer"
)

// DataFileName is the bbolt file inside a node's data dir.
const DataFileName = "fairshard.db"

// Node is one fairshard process: store, membership, dispatcher, handoff and
// the HTTP API, wired in dependency order. Build with New, run with Start,
// stop with Shutdown (graceful) or Close (at once). Safe for concurrent use.
type Node struct {
	cfg   Config
	log   *slog.Logger
	reg   *prometheus.Registry
	name  string
	store *boltstore.Store
	cl    *cluster.Cluster
	rc    *runtimeConfig
	quota *backpressure.QuotaCache
	disp  *dispatch.Dispatcher
	peers *peerClient
	m     *nodeMetrics

	ln      net.Listener
	srv     *http.Server
	apiAddr string
	// routePatterns are the HTTP routes (see Routes), set by routes().
	routePatterns []string

	handoffWake chan struct{}
	intake      intakeGate
	draining    atomic.Bool
	ready       atomic.Bool
	// awaitingJoin is true from Start until the first join of the seeds
	// succeeded or JoinWait passed; the node owns no shard meanwhile.
	awaitingJoin atomic.Bool
	// snapMu orders applySnapshot calls; applied is the node's one applied
	// ownership view (ownership()), published after the store's claim
	// scope was set from it.
	snapMu  sync.Mutex
	applied atomic.Pointer[cluster.OwnershipSnapshot]
	// handoffSem serialises handoff passes (the loop's and Shutdown's); a
	// pass holds its one slot. handoffStop ends the loop's passes when
	// Shutdown takes over the handoff.
	handoffSem  chan struct{}
	handoffStop context.CancelFunc
	// mover moves rows of shards this node does not own (handoff, drain)
	// and keeps their resume tokens and failed releases across passes.
	mover *transfer.Mover

	runCancel context.CancelFunc
	dispCtx   context.Context
	dispStop  context.CancelFunc
	wg        sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New opens the node's store, binds its HTTP listener and creates its
// cluster membership, without joining or serving yet. Errors name what
// failed: a locked data dir ("in use by another process"), a corrupt file,
// a shard count that differs from the data file's, a port in use.
func New(cfg Config, log *slog.Logger) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	n := &Node{cfg: cfg, log: log, reg: prometheus.NewRegistry(), handoffWake: make(chan struct{}, 1), handoffSem: make(chan struct{}, 1)}
	n.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	n.m = newNodeMetrics(n.reg)

	store, dir, err := openStore(cfg, log, n.reg)
	if err != nil {
		return nil, err
	}
	n.store = store
	if strings.Contains(cfg.DataDir, "{slot}") {
		// A slot remembers the name of the node that first used it, so a
		// recreated container (new hostname) rejoins as the same member.
		if cfg.NodeName, err = slotNodeName(dir, cfg.NodeName); err != nil {
			_ = store.Close()
			return nil, err
		}
		n.cfg.NodeName = cfg.NodeName
	}

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		_ = store.Close()
		return nil, fmt.Errorf("listen on --http-addr %s: %w", cfg.HTTPAddr, err)
	}
	n.ln = ln

	ccfg, err := n.clusterConfig(ln.Addr().(*net.TCPAddr))
	if err != nil {
		_ = ln.Close()
		_ = store.Close()
		return nil, err
	}
	cl, err := cluster.New(ccfg)
	if err != nil {
		_ = ln.Close()
		_ = store.Close()
		return nil, fmt.Errorf("create cluster membership: %w", err)
	}
	n.cl = cl
	n.name = cl.Name()
	n.apiAddr = ccfg.APIAddr
	n.applied.Store(cl.Snapshot()) // alone, owning every shard: the store's default scope too
	n.rc = newRuntimeConfig(cl.KV(), cfg.DefaultTarget)
	n.rc.nodeRetry = dispatch.RetryPolicy{Base: cfg.RetryBase, Factor: cfg.RetryFactor, Cap: cfg.RetryCap, MaxAttempts: uint32(cfg.MaxAttempts)}
	n.quota = backpressure.NewQuotaCache(n.rc, cfg.DefaultMaxInFlight, cfg.QuotaTTL)
	targets := dispatch.TargetsFunc(func(r outbox.ClaimScope) (dispatch.Target, bool) {
		t, ok := n.rc.target(r)
		return dispatch.Target{URL: t.URL, Timeout: durationMS(t.TimeoutMS)}, ok
	})
	// The target hosts' limits are one ceiling of the planner (beside each
	// namespace's) and the dispatcher's record of what is on the wire.
	hosts, err := dispatch.NewHostLimits(dispatch.HostLimitsConfig{Targets: targets, MaxConnsPerHost: cfg.MaxConnsPerHost, Registerer: n.reg})
	if err != nil {
		_ = cl.Shutdown()
		_ = ln.Close()
		_ = store.Close()
		return nil, fmt.Errorf("create target host limits: %w", err)
	}
	planner := backpressure.NewPlanner(backpressure.PlannerConfig{
		Quotas: n.quota,
		// Ceilings come from the same applied view as the claim scope
		// (issue #12 item 3), not from the live membership snapshot.
		Fraction: func() shards.OwnedShardFraction { return n.ownership().Fraction },
		Hosts:    hosts,
		Logger:   log,
	})
	n.disp, err = dispatch.New(dispatch.Config{
		Store:             heldClaimsStore{store},
		Planner:           planner,
		Targets:           targets,
		Hosts:             hosts,
		Held:              n.rc.heldWorkflows,
		RetryPolicyFor:    n.rc.retryPolicyFor,
		Paused:            n.rc.paused,
		Logger:            log,
		Registerer:        n.reg,
		PollInterval:      cfg.PollInterval,
		BatchSize:         cfg.BatchSize,
		DeliveryTimeout:   cfg.DeliveryTimeout,
		VisibilityTimeout: cfg.VisibilityTimeout,
		MaxConnsPerHost:   cfg.MaxConnsPerHost,
		Retry: dispatch.RetryPolicy{
			Base: cfg.RetryBase, Factor: cfg.RetryFactor, Cap: cfg.RetryCap, MaxAttempts: uint32(cfg.MaxAttempts),
		},
	})
	if err != nil {
		_ = cl.Shutdown()
		_ = ln.Close()
		_ = store.Close()
		return nil, fmt.Errorf("create dispatcher: %w", err)
	}
	n.peers = newPeerClient(cfg.ClusterSecret)
	n.mover, err = transfer.NewMover(store, transfer.MoverConfig{
		Limits:     transfer.Limits{MaxRows: cfg.HandoffBatch, MaxBytes: cfg.HandoffBatchBytes},
		Logger:     log,
		Registerer: n.reg,
	})
	if err != nil {
		_ = cl.Shutdown()
		_ = ln.Close()
		_ = store.Close()
		return nil, fmt.Errorf("create handoff mover: %w", err)
	}
	n.srv = &http.Server{Handler: n.routes(), ReadHeaderTimeout: 10 * time.Second}
	log.Info("node created", "data_dir", dir, "api_addr", n.apiAddr, "gossip_addr", cl.GossipAddr(), "shards", cfg.Shards)
	return n, nil
}

// Name returns the node's name in the cluster.
func (n *Node) Name() string { return n.name }

// APIAddr returns the host:port other nodes and clients use for this
// node's API.
func (n *Node) APIAddr() string { return n.apiAddr }

// ListenAddr returns the host:port the HTTP listener is bound to. It
// differs from APIAddr when --advertise-http names another address (a
// proxy, a NAT mapping); with --http-addr port 0 it tells the chosen port.
func (n *Node) ListenAddr() string { return n.ln.Addr().String() }

// GossipAddr returns the ip:port peers use to reach this node's gossip
// (what --join takes).
func (n *Node) GossipAddr() string { return n.cl.GossipAddr() }

// Registry returns the node's metrics registry (served on /metrics).
func (n *Node) Registry() *prometheus.Registry { return n.reg }

// openStore resolves the data dir (claiming a free "{slot}" when the path
// has one) and opens the bbolt store with a lock timeout, so a second
// process on the same dir fails clearly instead of hanging.
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
	// Slot mode (docker compose replicas sharing one volume): take the
	// first slot whose file is not locked by another process.
	opts.LockTimeout = 200 * time.Millisecond
	for slot := 0; slot < 1024; slot++ {
		dir := strings.ReplaceAll(cfg.DataDir, "{slot}", "slot-"+strconv.Itoa(slot))
		s, err := openIn(dir, opts)
		if errors.Is(err, boltstore.ErrLocked) {
			continue
		}
		return s, dir, err
	}
	return nil, "", fmt.Errorf("data dir %s: every slot is in use", cfg.DataDir)
}

// slotNameFile, inside a slot data dir, holds the node name bound to it.
const slotNameFile = "node-name"

// slotNodeName returns the node name bound to a slot dir, binding name to
// it on first use.
func slotNodeName(dir, name string) (string, error) {
	path := filepath.Join(dir, slotNameFile)
	b, err := os.ReadFile(path)
	if err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read node name of slot %s: %w", dir, err)
	}
	if err := os.WriteFile(path, []byte(name+"\n"), 0o640); err != nil {
		return "", fmt.Errorf("bind node name to slot %s: %w", dir, err)
	}
	return name, nil
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
	c := cluster.DefaultConfig()
	if cfg.GossipProfile == "fast" {
		c = cluster.FastConfig()
	}
	c.Name = cfg.NodeName
	host, portStr, _ := net.SplitHostPort(cfg.GossipAddr)
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("--gossip-addr %q: bad port", cfg.GossipAddr)
	}
	if host == "" {
		host = "0.0.0.0"
	}
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
		// Bound to every interface: advertise a private IP as memberlist
		// would, resolved here so the API address can use the same one.
		priv, err := sockaddr.GetPrivateIP()
		if err != nil || priv == "" {
			priv = "127.0.0.1"
		}
		c.AdvertiseAddr, c.AdvertisePort, advIP = priv, port, priv
	}
	if port == 0 {
		c.AdvertisePort = 0
	}
	c.Join = cfg.Join
	c.ShardCount = cfg.Shards
	c.SecretKey = cfg.GossipKey
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
	initial, err := loadConfig(context.Background(), n.store, n.log)
	if err != nil {
		return nil, fmt.Errorf("load persisted cluster config: %w", err)
	}
	c.KV.Initial = initial
	c.KV.Persister = configPersister{n.store}
	return c, nil
}

// heldClaimsStore is the store as the dispatcher sees it: a namespace's
// claimed count is every claimed row held on this node, owned shard or not.
// Right after an ownership change, rows of a shard just lost are still being
// delivered here and must keep counting against this node's ceiling, or the
// node would claim past it (docs/DECISIONS.md). Everything else, the
// one-transaction ClaimBatch included, is the store's own.
type heldClaimsStore struct{ *boltstore.Store }

// CountClaimedByNamespace counts claimed rows held here, all shards.
func (s heldClaimsStore) CountClaimedByNamespace(ctx context.Context, namespaces []string) (map[string]int, error) {
	return s.CountClaimedHeld(ctx, namespaces)
}
