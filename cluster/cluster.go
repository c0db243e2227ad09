package cluster

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/kv"
	"github.com/fairshard/fairshard/lifecycle"
)

// Errors returned by this package. Test them with errors.Is; the returned
// errors wrap them with the node, key or field concerned.
var (
	// ErrInvalidConfig is returned by New for a Config that fails
	// validation; the message names the field and its bound.
	ErrInvalidConfig = errors.New("cluster: invalid config")
	// ErrShardCountMismatch is returned when a peer's shard_count differs
	// from this node's; such a peer is refused (DESIGN.md "Membership").
	ErrShardCountMismatch = errors.New("cluster: peer has another shard count")
	// ErrProtocolMismatch is returned when a peer speaks another
	// ProtocolVersion; such a peer is refused.
	ErrProtocolMismatch = errors.New("cluster: peer speaks another protocol version")
	// ErrBadMeta is returned when a peer's node meta cannot be read (not a
	// fairshard node, or corrupt); such a peer is refused.
	ErrBadMeta = errors.New("cluster: unreadable peer node meta")
	// ErrShutdown is returned by calls on a Cluster after Shutdown.
	ErrShutdown = errors.New("cluster: shut down")
	// ErrAlreadyStarted is returned by a second Start.
	ErrAlreadyStarted = errors.New("cluster: already started")
	// ErrLeft is returned by Join after Leave: a memberlist that left
	// cannot join again (memberlist#140); build a new Cluster.
	ErrLeft = errors.New("cluster: node has left")
	// ErrNoPeers is returned by Join when every address given resolves to
	// this node's own gossip address: there is nobody else to join yet
	// (the first node of a cluster, or a DNS name listing only itself).
	ErrNoPeers = errors.New("cluster: no address to join but this node's own")
	// ErrStateExchange is returned by Join when a seed answered but the
	// push/pull state exchange with it failed: the peer refused this
	// node's state or sent one this node cannot take (another gossip key
	// or label, a state over memberlist's 20 MiB limit). Unlike "nobody
	// answered", it means a cluster is there that this node is not part
	// of, so it must not serve as if alone.
	ErrStateExchange = errors.New("cluster: a seed answered but the state exchange failed")
)

// Cluster is one node's membership in a fairshard cluster: memberlist
// gossip, shard ownership snapshots, and the host of the gossiped cluster
// config (a kv.Store, KV). Build it with New; it is safe for concurrent use.
type Cluster struct {
	cfg      *Config // defaulted, validated, private copy
	name     string
	protocol uint8
	log      *slog.Logger
	ml       *memberlist.Memberlist
	keyring  *memberlist.Keyring // nil without gossip encryption
	dials    *dialTracker
	metrics  *metrics

	metaMu sync.Mutex // serialises state changes
	state  MemberState
	meta   atomic.Pointer[[]byte]

	// membership, copied from memberlist's event callbacks (events.go)
	peersMu  sync.Mutex
	peers    map[string]peer
	selfAddr string
	// failed maps each peer memberlist declared dead (not a graceful
	// leave) that has not returned since to when that happened
	// (OwnershipSnapshot.PeerFailedAt); at most maxFailedPeers, the oldest
	// forgotten first.
	failed map[string]time.Time

	// ownership
	recomputeMu sync.Mutex
	recomputeCh chan struct{} // 1-buffered, poked by events
	snap        atomic.Pointer[OwnershipSnapshot]
	factor      atomic.Int64 // the replication factor R of the next recompute
	numMembers  atomic.Int64 // live members at the last recompute, for the broadcast queue
	subs        subscribers

	// gossiped config
	kv         *kv.Store
	broadcasts *memberlist.TransmitLimitedQueue

	// acceptance is this node's acceptance by the members (accept.go).
	acceptance acceptance
	// admission rate-limits and records the refusals of peers (delegate.go).
	admission admission

	// lifecycle: every background loop runs in loops, started in order
	// (kv persistence, kv collection, recompute, memberlist, join) and
	// stopped in reverse by Shutdown.
	lifeMu   sync.Mutex // serialises Start, Leave and Shutdown
	started  bool
	left     atomic.Bool
	shutdown atomic.Bool
	loops    *lifecycle.Group
}

// New validates cfg, opens the gossiped config store (cfg.KV: its
// persisted entries, caps and Persister), creates the memberlist
// (listening on the gossip address; peers may join it from now on) and
// publishes a first ownership snapshot in which this node alone owns every
// shard. It does not contact anyone: call Start to join the seeds. On
// error nothing is left running. cfg is not modified.
func New(cfg *Config) (*Cluster, error) {
	if cfg == nil {
		return nil, fmt.Errorf("%w: nil *Config", ErrInvalidConfig)
	}
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	c := newCluster(cfg)
	keyring, err := newKeyring(cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: gossip keys: %v", ErrInvalidConfig, err)
	}
	c.keyring = keyring
	meta, err := c.encodeMeta(MemberActive)
	if err != nil {
		return nil, err
	}
	c.meta.Store(&meta)
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}

	mc := cfg.Config // private copy made by withDefaults
	c.broadcasts = &memberlist.TransmitLimitedQueue{
		NumNodes:       func() int { return int(max(c.numMembers.Load(), 1)) },
		RetransmitMult: mc.RetransmitMult,
	}
	if err := c.openKV(reg); err != nil {
		return nil, err
	}
	c.metrics = newMetrics(c)
	if err := c.createMemberlist(mc); err != nil {
		c.kv.Close()
		return nil, err
	}
	if err := c.metrics.register(reg); err != nil {
		_ = c.ml.Shutdown()
		c.kv.Close()
		return nil, err
	}

	c.factor.Store(int64(cfg.ReplicationFactor))
	c.Recompute()
	c.startLoops()
	st := c.kv.Stats()
	c.log.Info("cluster node created", "gossip_addr", c.GossipAddr(), "api_addr", cfg.APIAddr, "accepted", c.acceptance.accepted.Load(), "gossip_keys", c.GossipKeys(),
		"shard_count", cfg.ShardCount, "config_entries", st.Live, "config_tombstones", st.Tombstones)
	return c, nil
}

// newCluster returns the node's state for a validated cfg, before anything
// is opened: an active member with empty peer, subscriber and answer
// tables. A node without seeds is a cluster of its own and counts as
// accepted; one with seeds owns nothing until its peers confirm it
// (accept.go).
func newCluster(cfg *Config) *Cluster {
	c := &Cluster{
		cfg:         cfg,
		name:        cfg.Name,
		protocol:    cfg.protocolVersion,
		log:         cfg.Logger.With("component", "cluster", "node", cfg.Name),
		state:       MemberActive,
		recomputeCh: make(chan struct{}, 1),
		peers:       make(map[string]peer),
		failed:      make(map[string]time.Time),
		subs:        subscribers{set: make(map[*subscriber]struct{})},
		admission:   admission{logged: make(map[string]time.Time)},
		acceptance: acceptance{
			answers:    make(map[string]string),
			conflicts:  make(map[string]bool),
			heldLogged: make(map[string]time.Time),
			refusedCh:  make(chan struct{}),
			queries:    make(chan memberQuery, maxQueuedQueries),
			wake:       make(chan struct{}, 1),
		},
	}
	c.acceptance.accepted.Store(len(cfg.Join) == 0)
	c.loops = lifecycle.NewGroup(c.log)
	return c
}

// openKV opens the gossiped config store of cfg.KV for this node: its
// changes are broadcast through c's queue and its series registered with
// reg. A config the store rejects is an ErrInvalidConfig.
func (c *Cluster) openKV(reg prometheus.Registerer) error {
	kcfg := c.cfg.KV
	kcfg.Node, kcfg.Broadcast = c.cfg.Name, c.queueBroadcast
	kcfg.Logger, kcfg.Registerer = c.log.With("component", "kv"), reg
	var err error
	if c.kv, err = kv.New(kcfg); err != nil {
		if errors.Is(err, kv.ErrInvalidConfig) {
			return fmt.Errorf("%w: KV: %v", ErrInvalidConfig, err)
		}
		return fmt.Errorf("open gossiped config of node %q: %w", c.cfg.Name, err)
	}
	return nil
}

// createMemberlist creates the memberlist of mc with c as its delegate,
// the node's keyring and logger, and (unless mc brings its own) a
// transport that tracks dials. It listens on the gossip address from now
// on. On error it leaves nothing of its own running.
func (c *Cluster) createMemberlist(mc *memberlist.Config) error {
	d := &delegate{c: c}
	mc.Delegate, mc.Events, mc.Alive, mc.Merge, mc.Conflict = d, &events{c: c}, d, d, d
	mc.Keyring, mc.SecretKey = c.keyring, nil
	mc.LogOutput = nil
	mc.Logger = log.New(&logBridge{l: c.log.With("component", "memberlist")}, "", 0)
	var err error
	if mc.Transport == nil {
		if c.dials, err = newTransport(mc, mc.Logger); err != nil {
			return fmt.Errorf("create memberlist for node %q: %w", c.cfg.Name, err)
		}
		mc.Transport = c.dials
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		if c.dials != nil {
			_ = c.dials.Shutdown()
		}
		return fmt.Errorf("create memberlist for node %q on %s:%d: %w", c.cfg.Name, mc.BindAddr, mc.BindPort, err)
	}
	c.ml = ml
	return nil
}

// startLoops starts the node's background loops. Shutdown stops them in
// reverse: the join loop first, then memberlist (no more gossip comes in),
// then ownership, and the kv loops last so persistence flushes what gossip
// brought.
func (c *Cluster) startLoops() {
	for _, l := range []lifecycle.Loop{
		{Name: "kv-persist", Run: c.kv.RunPersist},
		{Name: "kv-collect", Run: c.kv.RunCollect},
		{Name: "recompute", Run: c.recomputeLoop},
		{Name: "memberlist", Run: c.memberlistLoop},
		{Name: "member-answers", Run: c.answerLoop},
		{Name: "accept", Run: c.acceptLoop},
	} {
		_ = c.loops.Go(nil, l) // a fresh group is never stopped
	}
}

// memberlistLoop holds the memberlist open until the lifecycle stops it,
// then shuts it down (without a leave message: Leave sends that first).
func (c *Cluster) memberlistLoop(ctx context.Context) error {
	<-ctx.Done()
	if err := c.ml.Shutdown(); err != nil {
		return fmt.Errorf("shut down memberlist of node %q: %w", c.name, err)
	}
	return nil
}

// KV returns the gossiped cluster config this node hosts: read, write and
// watch it there. It is open from New until Shutdown.
func (c *Cluster) KV() *kv.Store { return c.kv }

func (c *Cluster) encodeMeta(state MemberState) ([]byte, error) {
	return nodeMeta{
		Protocol:   c.protocol,
		ShardCount: c.cfg.ShardCount,
		State:      state,
		Name:       c.name,
		APIAddr:    c.cfg.APIAddr,
		GossipKeys: c.GossipKeys(),
	}.encodeChecked()
}

// Name returns this node's name.
func (c *Cluster) Name() string { return c.name }

// GossipAddr returns the address (ip:port) peers reach this node's gossip
// at; with BindPort 0 it carries the port memberlist picked.
func (c *Cluster) GossipAddr() string {
	c.peersMu.Lock()
	defer c.peersMu.Unlock()
	return c.selfAddr
}

// Start launches the join loop: it joins Config.Join at once and then every
// RejoinInterval re-joins any seed that is not a member, all of them while
// this node is alone (PITFALLS: Join may succeed and the peers still
// reject us; dead nodes are forgotten, so a partition heals only by
// re-joining). It returns once the loop is launched; the loop ends when ctx
// ends, on Leave or on Shutdown. Errors: ErrAlreadyStarted, ErrShutdown.
func (c *Cluster) Start(ctx context.Context) error {
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	switch {
	case c.shutdown.Load():
		return ErrShutdown
	case c.started:
		return ErrAlreadyStarted
	}
	c.started = true
	if len(c.cfg.Join) == 0 {
		return nil
	}
	if err := c.loops.Go(ctx, lifecycle.Loop{Name: "join", Run: c.joinLoop}); err != nil {
		return ErrShutdown
	}
	return nil
}

func (c *Cluster) joinLoop(ctx context.Context) error {
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-timer.C:
		}
		if c.left.Load() || c.shutdown.Load() || c.RefusedErr() != nil {
			return nil // a refused node has nothing to re-join (accept.go)
		}
		c.rejoinOnce(ctx)
		// ±10% jitter so restarted nodes do not re-join in lockstep.
		iv := c.cfg.RejoinInterval
		timer.Reset(iv - iv/10 + rand.N(iv/5+1))
	}
}

// rejoinOnce joins every seed address that is not a live member.
func (c *Cluster) rejoinOnce(ctx context.Context) {
	targets, resolveErr := c.resolve(ctx, c.cfg.Join)
	live := make(map[string]bool)
	for _, p := range c.livePeers() {
		live[p.addr] = true
	}
	isolated := len(live) <= 1
	var missing []string
	for _, t := range targets {
		if !live[t] {
			missing = append(missing, t)
		}
	}
	if resolveErr != nil {
		c.log.Warn("resolving join addresses", "join", c.cfg.Join, "error", resolveErr)
	}
	if len(missing) == 0 || ctx.Err() != nil {
		return
	}
	n, err := c.joinAddrs(missing)
	switch {
	case errors.Is(err, ErrNameConflict):
		// refuseSelf logged it; the loop stops
	case err != nil && isolated:
		c.log.Warn("isolated and joining the seeds failed; retrying", "targets", missing,
			"retry_in", c.cfg.RejoinInterval.String(), "error", err)
	case err != nil:
		c.log.Debug("re-joining seeds that are not members failed", "targets", missing, "error", err)
	case n > 0:
		c.log.Info("joined", "targets", missing, "contacted", n, "was_isolated", isolated)
	}
}

// Join joins the cluster through addrs (host:port; a DNS name joins every
// address it resolves to) now, in addition to the background loop of
// Start. It returns how many addresses answered. An error means none
// answered; when a peer was refused during the attempt the error wraps
// ErrShardCountMismatch, ErrProtocolMismatch or ErrBadMeta, and when a
// seed answered but the state exchange with it failed, ErrStateExchange.
// A join that answered returns ErrNameConflict when the cluster holds
// this node's name at another address where a live node answers to it
// (the node is refused for good: Refused).
// memberlist's
// join is bounded by Config.TCPTimeout per address and cannot be
// interrupted, so ctx is checked only while resolving. Errors also:
// ErrShutdown, ErrLeft.
func (c *Cluster) Join(ctx context.Context, addrs ...string) (int, error) {
	switch {
	case c.shutdown.Load():
		return 0, ErrShutdown
	case c.left.Load():
		return 0, ErrLeft
	}
	targets, err := c.resolve(ctx, addrs)
	if len(targets) == 0 {
		if err == nil {
			err = ErrNoPeers
		}
		return 0, fmt.Errorf("join %v: %w", addrs, err)
	}
	return c.joinAddrs(targets)
}

func (c *Cluster) joinAddrs(targets []string) (int, error) {
	c.admission.mu.Lock()
	before := c.admission.seq
	c.admission.mu.Unlock()
	var dialled map[string]uint64
	if c.dials != nil {
		dialled = c.dials.counts(targets)
	}
	n, err := c.ml.Join(targets)
	if err == nil {
		poke(c.acceptance.wake) // ask the new peers now, not at the next tick
		return n, c.checkJoinConflicts()
	}
	c.admission.mu.Lock()
	r := c.admission.last
	c.admission.mu.Unlock()
	if r.seq > before {
		return n, fmt.Errorf("join %v: %w", targets, r.err)
	}
	if c.dials != nil {
		if reached := c.dials.reached(dialled); len(reached) > 0 {
			slices.Sort(reached)
			return n, fmt.Errorf("join %v: %w with %v (a different gossip key or label, or a cluster state over memberlist's 20 MiB limit?): %v",
				targets, ErrStateExchange, reached, err)
		}
	}
	return n, fmt.Errorf("join %v: %w", targets, err)
}

// checkJoinConflicts runs after a join that answered: if the merged
// state held this node's name at another address (memberlist reported a
// conflict), it pings that address at once, so Join itself reports a live
// duplicate (ErrNameConflict) instead of leaving it to the accept loop.
// An accepted node is the one the cluster holds: a conflict is the
// other's problem.
func (c *Cluster) checkJoinConflicts() error {
	if err := c.RefusedErr(); err != nil {
		return err
	}
	if c.acceptance.accepted.Load() {
		return nil
	}
	c.acceptance.mu.Lock()
	addrs := slices.Sorted(maps.Keys(c.acceptance.conflicts))
	c.acceptance.mu.Unlock()
	return c.checkHeldElsewhere(context.Background(), addrs)
}

// resolve turns host:port addresses into ip:port ones, every IP of a DNS
// name included, without duplicates and without this node's own address.
func (c *Cluster) resolve(ctx context.Context, addrs []string) ([]string, error) {
	self := c.GossipAddr()
	var out []string
	var errs []error
	add := func(ip string, port uint16) {
		a := net.JoinHostPort(ip, fmt.Sprint(port))
		if a != self && !slices.Contains(out, a) {
			out = append(out, a)
		}
	}
	for _, a := range addrs {
		hp, err := splitHostPort(a)
		if err != nil {
			errs = append(errs, fmt.Errorf("join address %q: %w", a, err))
			continue
		}
		if ip := net.ParseIP(hp.host); ip != nil {
			add(ip.String(), hp.port)
			continue
		}
		ips, err := c.cfg.Resolver.LookupIPAddr(ctx, hp.host)
		if err != nil {
			errs = append(errs, fmt.Errorf("resolve join address %q: %w", a, err))
			continue
		}
		for _, ip := range ips {
			add(ip.IP.String(), hp.port)
		}
	}
	return out, errors.Join(errs...)
}

// SetLeaving declares this node leaving in its meta and announces it:
// peers recompute ownership without it, so its shards move to them while
// it drains (hands off its rows). It returns once the update has been
// broadcast to a peer, or ctx ends (default 5 s without a deadline);
// locally the new snapshot is published before it returns either way.
// Repeating it is a no-op. A node cannot become active again: build a new
// Cluster. Errors: ErrShutdown, or the announcement timed out.
func (c *Cluster) SetLeaving(ctx context.Context) error {
	if c.shutdown.Load() {
		return ErrShutdown
	}
	c.metaMu.Lock()
	if c.state == MemberLeaving {
		c.metaMu.Unlock()
		return nil
	}
	meta, err := c.encodeMeta(MemberLeaving)
	if err != nil {
		c.metaMu.Unlock()
		return err
	}
	c.state = MemberLeaving
	c.meta.Store(&meta)
	c.metaMu.Unlock()

	err = c.announce(ctx, "leaving state", c.ml.UpdateNode)
	c.Recompute()
	c.log.Info("node is leaving: it owns no shards now")
	if err != nil {
		return fmt.Errorf("announce leaving state of node %q: %w", c.name, err)
	}
	return nil
}

// announce runs send (memberlist's UpdateNode or Leave, which queue a
// broadcast and wait for it to go out) with a bounded wait:
// leaveBroadcastRounds gossip intervals (at least minLeaveBroadcastWait),
// ctx's deadline if sooner (default 5 s), and only two gossip intervals
// when no peer needs the news (every live peer is leaving, or there is
// none). memberlist gossips only to live peers: a broadcast queued while
// the last peers leave can never go out (a whole cluster stopped at once),
// so a timeout with no live peer left, or with only leaving peers, is not
// an error: nobody is left who would act on it.
func (c *Cluster) announce(ctx context.Context, what string, send func(time.Duration) error) error {
	bound := min(timeoutOf(ctx, 5*time.Second), max(leaveBroadcastRounds*c.cfg.GossipInterval, minLeaveBroadcastWait))
	nobodyNeeds := c.peersAllLeaving()
	if nobodyNeeds {
		bound = min(bound, 2*c.cfg.GossipInterval)
	}
	err := send(bound)
	if err == nil {
		return nil
	}
	if nobodyNeeds || c.peersAllLeaving() {
		c.log.Info("broadcast not confirmed: no live peer that is not leaving is left to tell", "what", what, "error", err)
		return nil
	}
	return err
}

// peersAllLeaving reports whether every live peer (other than this node)
// declares itself leaving in its meta; true with no live peer at all. It
// reads the Cluster's copy of memberlist's view, never memberlist itself,
// so it is safe anywhere but inside a memberlist callback.
func (c *Cluster) peersAllLeaving() bool {
	for _, p := range c.livePeers() {
		if p.name == c.name {
			continue
		}
		if m, err := decodeMeta(p.meta); err == nil && m.State == MemberLeaving {
			continue
		}
		return false
	}
	return true
}

// Leave leaves the cluster gracefully: it stops the join loop, gives
// queued config gossip a bounded chance to go out, broadcasts memberlist's
// leave and waits Config.LeavePropagateDelay so more than one peer hears
// it. Peers then drop this node at once instead of waiting for failure
// detection. Call SetLeaving and drain first; call Shutdown after. It is
// safe to repeat. ctx bounds the whole call (default 5 s without a
// deadline); the wait for the leave broadcast is bounded by
// leaveBroadcastRounds gossip intervals (at least minLeaveBroadcastWait)
// as well.
//
// A node whose peers are all leaving or gone leaves at once: no config
// flush, two gossip intervals at most for the leave broadcast and no
// propagation delay, since nobody is left who would act on them (a whole
// cluster stopped together). When every peer left or died while the
// broadcast was queued, memberlist has nobody to gossip it to: that is not
// an error either. A node the cluster never accepted (Accepted false: its
// name is held at another address) sends no leave at all: its leave would
// carry that name and could evict the member the cluster does hold under
// it. Errors: ErrShutdown, or memberlist's leave timed out while a live,
// active peer remained.
func (c *Cluster) Leave(ctx context.Context) error {
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	if c.shutdown.Load() {
		return ErrShutdown
	}
	if c.left.Swap(true) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeoutOf(ctx, 5*time.Second))
	defer cancel()
	start := time.Now()
	nobodyNeeds := c.peersAllLeaving()

	// Bounded flush of queued config broadcasts (STYLE §7 stop order): a
	// message needs about two gossip rounds to use up its transmits; with
	// no peer it would never go out, so skip it then.
	if !nobodyNeeds && c.numMembers.Load() > 1 {
		deadline := time.After(10 * c.cfg.GossipInterval)
		flush := time.NewTicker(c.cfg.GossipInterval)
	flushing:
		for c.broadcasts.NumQueued() > 0 {
			select {
			case <-ctx.Done():
				break flushing
			case <-deadline:
				break flushing
			case <-flush.C:
			}
		}
		flush.Stop()
	}

	if !c.acceptance.accepted.Load() {
		c.Recompute()
		c.log.Info("left without a leave message: the cluster never accepted this node", "refused", c.RefusedErr())
		return nil
	}
	err := c.announce(ctx, "leave", c.ml.Leave)
	if err == nil && !nobodyNeeds && c.numMembers.Load() > 1 {
		select {
		case <-ctx.Done():
		case <-time.After(c.cfg.LeavePropagateDelay):
		}
	}
	c.Recompute()
	c.log.Info("left the cluster", "took", time.Since(start).String(), "peers_all_leaving", nobodyNeeds, "error", err)
	if err != nil {
		return fmt.Errorf("leave cluster as node %q: %w", c.name, err)
	}
	return nil
}

// leaveBroadcastRounds bounds, in gossip intervals, Leave's wait for its
// broadcast: memberlist sends a message RetransmitMult × ⌈log10(N+1)⌉
// times (4 below 10 nodes, 8 below 100) to GossipNodes peers a round, so a
// leave with live peers goes out in a few rounds; 25 rounds is 5 s with
// LAN timing (serf's BroadcastTimeout). minLeaveBroadcastWait keeps the
// bound sane for short intervals on a loaded machine (FastConfig: 2 s).
const (
	leaveBroadcastRounds  = 25
	minLeaveBroadcastWait = 2 * time.Second
)

// Shutdown stops this node's gossip and goroutines without a leave message
// (peers detect the loss by probing; call Leave first for a graceful exit):
// it stops the background loops in the reverse of their start order (join,
// memberlist, ownership recompute, tombstone collection, then config
// persistence, which flushes what gossip brought), closes the gossiped
// config store and every Subscribe channel and Watch, and unregisters the
// metrics. It is idempotent and returns after every goroutine of this
// Cluster has exited. memberlist does not wait for a probe in flight: one
// of its goroutines may outlive Shutdown by up to ProbeInterval (1 s with
// DefaultConfig, 100 ms with FastConfig), which matters to goroutine-leak
// checks in tests.
func (c *Cluster) Shutdown() error {
	c.lifeMu.Lock()
	defer c.lifeMu.Unlock()
	if c.shutdown.Swap(true) {
		return nil
	}
	err := c.loops.Stop(context.Background())
	c.kv.Close()
	c.metrics.unregister()

	c.subs.mu.Lock()
	for s := range c.subs.set {
		close(s.ch)
	}
	c.subs.set = nil
	c.subs.mu.Unlock()
	c.log.Info("cluster node shut down")
	return err
}

// timeoutOf returns the time left before ctx's deadline, or def without one.
func timeoutOf(ctx context.Context, def time.Duration) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return max(time.Until(d), time.Millisecond)
	}
	return def
}

// logBridge turns memberlist's "[LEVEL] memberlist: message" lines into
// structured slog records at the matching level.
type logBridge struct{ l *slog.Logger }

func (b *logBridge) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	level := slog.LevelInfo
	for prefix, lv := range map[string]slog.Level{
		"[DEBUG]": slog.LevelDebug, "[INFO]": slog.LevelInfo, "[WARN]": slog.LevelWarn,
		"[ERR]": slog.LevelError, "[ERROR]": slog.LevelError,
	} {
		if rest, ok := strings.CutPrefix(msg, prefix); ok {
			level, msg = lv, strings.TrimSpace(rest)
			break
		}
	}
	msg = strings.TrimPrefix(msg, "memberlist: ")
	b.l.Log(context.Background(), level, msg)
	return len(p), nil
}
