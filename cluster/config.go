package cluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/kv"
)

// Defaults and bounds of [Config]. Durations are wall-clock time.
const (
	// DefaultShardCount is the shard count of DefaultConfig. Every node of
	// a cluster must use the same value; it is fixed for the cluster's life.
	DefaultShardCount uint32 = 1024
	// MaxReplicationFactor bounds the replication factor R.
	MaxReplicationFactor = 5
	// MaxShardCount bounds Config.ShardCount (an ownership table holds one
	// uint32 per shard).
	MaxShardCount uint32 = 1 << 20
	// DefaultGossipPort is the memberlist port (UDP and TCP) of DefaultConfig.
	DefaultGossipPort = 7946
	// DefaultRejoinInterval is how often DefaultConfig re-joins its seeds.
	DefaultRejoinInterval = 15 * time.Second
	// DefaultLeavePropagateDelay is how long Leave waits after memberlist's
	// leave broadcast went out, so it reaches more than one peer (serf
	// waits the same way).
	DefaultLeavePropagateDelay = time.Second
	// MaxNodeNameBytes bounds Config.Name (bytes). Names travel in node meta
	// (≤ 512 bytes in all) and in every config gossip message.
	MaxNodeNameBytes = 128
	// MaxAPIAddrBytes bounds Config.APIAddr (bytes).
	MaxAPIAddrBytes = 256
)

// Resolver looks up the IP addresses of a host name; *net.Resolver
// satisfies it. Config.Resolver exists so tests can stand in for a DNS name
// with several A records.
type Resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
}

// Config configures a [Cluster]. Build one with [DefaultConfig] (LAN timing)
// or [FastConfig] (tests), then set Name, addresses, Join, APIAddr and
// ShardCount. New validates it once and does not modify it; zero values of
// this struct's own fields mean "use the default" as documented per field.
//
// The embedded *memberlist.Config carries the node name (Name, default the
// hostname), gossip bind address and port (BindAddr, BindPort; port 0 picks
// a free one), advertise address and port (AdvertiseAddr must be an IP
// literal, PITFALLS: memberlist#282; set it behind NAT), the optional gossip
// encryption key (SecretKey: 16, 24 or 32 bytes) and all timing. Cluster
// owns its Delegate, Events, Alive, Merge and Conflict hooks and its logger:
// New rejects a config that sets Delegate, Events, Alive, Merge or Conflict,
// and overrides LogOutput and the memberlist *log.Logger.
type Config struct {
	*memberlist.Config

	// Join lists seed addresses as host:port. A host that is a DNS name is
	// resolved on every attempt and every address it resolves to is
	// joined. The node joins them at Start and re-joins every
	// RejoinInterval while it is isolated or a seed is not a member.
	Join []string
	// RejoinInterval is the period of the re-join check. Defaults to
	// DefaultRejoinInterval.
	RejoinInterval time.Duration
	// LeavePropagateDelay is how long Leave waits after the leave
	// broadcast went out. Defaults to DefaultLeavePropagateDelay.
	LeavePropagateDelay time.Duration

	// ShardCount is the cluster's fixed shard count (DESIGN.md). A peer
	// with another value is refused. Defaults to DefaultShardCount.
	ShardCount uint32
	// ReplicationFactor is the replication factor R the replica sets of the
	// ownership snapshots start with (1–5; 0 means 1). It is a cluster-wide
	// setting the node keeps in the gossiped config and applies with
	// SetReplicationFactor; this is only the value before that.
	ReplicationFactor int
	// APIAddr is this node's HTTP API address (host:port), carried in node
	// meta so peers can forward appends and hand off rows. May be empty for
	// a node that serves no API.
	APIAddr string

	// GossipKeys are the gossip encryption keys (16, 24 or 32 bytes each,
	// at most MaxGossipKeys, no key twice), primary first: the primary
	// encrypts, every key decrypts. Cluster builds memberlist's Keyring
	// from them; set them instead of SecretKey (which stays accepted as a
	// single key) and leave Keyring nil. Cluster.SetGossipKeys changes them
	// on a running node (keyring.go: the rotation). Empty: no encryption,
	// for good.
	GossipKeys [][]byte

	// KV configures the gossiped cluster config this node hosts (KV()):
	// the entries its Persister saved before a restart (Initial), the
	// Persister, caps and tombstone timing. Cluster sets its Node,
	// Broadcast, Logger and Registerer (this Config's) itself.
	KV kv.Config

	// Logger receives structured logs, memberlist's own included (bridged
	// by level). It shadows memberlist.Config.Logger. nil discards.
	Logger *slog.Logger
	// Registerer receives the metrics of metrics.go. nil registers them on
	// a private registry nobody reads. Shutdown unregisters them, so a
	// restarted node may reuse the Registerer.
	Registerer prometheus.Registerer
	// Resolver resolves Join host names. Defaults to net.DefaultResolver.
	Resolver Resolver

	// protocolVersion overrides ProtocolVersion in node meta; tests use it
	// to build an incompatible peer.
	protocolVersion uint8
}

// DefaultConfig returns the production profile: memberlist's LAN timing
// (memberlist.DefaultLANConfig: probe every 1 s, push/pull every 30 s; crash
// detection measured 5.8–7.2 s, PITFALLS), gossip on 0.0.0.0:7946,
// DefaultShardCount shards and the default rejoin and leave delays. The
// node name defaults to the hostname.
func DefaultConfig() *Config {
	mc := memberlist.DefaultLANConfig()
	mc.BindPort = DefaultGossipPort
	mc.AdvertisePort = DefaultGossipPort
	// Reclaim a dead node's name from a new address after a while:
	// containers often restart with a new IP (PITFALLS).
	mc.DeadNodeReclaimTime = 30 * time.Second
	return &Config{
		Config:              mc,
		ShardCount:          DefaultShardCount,
		RejoinInterval:      DefaultRejoinInterval,
		LeavePropagateDelay: DefaultLeavePropagateDelay,
	}
}

// FastConfig returns DefaultConfig with timing shrunk for tests and
// single-host demos on loopback: probe every 100 ms, gossip every 20 ms,
// push/pull every 1 s, dead nodes reclaimable after 1 s, re-join every
// 200 ms, leave delay 100 ms; config tombstones kept at least 3 s (three
// push/pull rounds) and checked for collection every 200 ms. It binds 127.0.0.1 on a free port (BindPort 0);
// set BindAddr to give each node its own loopback address.
func FastConfig() *Config {
	c := DefaultConfig()
	mc := c.Config
	mc.BindAddr = "127.0.0.1"
	mc.BindPort = 0
	mc.AdvertisePort = 0
	mc.TCPTimeout = time.Second
	mc.IndirectChecks = 2
	mc.ProbeInterval = 100 * time.Millisecond
	mc.ProbeTimeout = 80 * time.Millisecond
	mc.SuspicionMult = 3
	mc.SuspicionMaxTimeoutMult = 3
	mc.AwarenessMaxMultiplier = 3
	mc.GossipInterval = 20 * time.Millisecond
	mc.GossipToTheDeadTime = 2 * time.Second
	mc.PushPullInterval = time.Second
	mc.DeadNodeReclaimTime = time.Second
	mc.QueueCheckInterval = time.Second
	c.RejoinInterval = 200 * time.Millisecond
	c.LeavePropagateDelay = 100 * time.Millisecond
	c.KV.TombstoneMinAge = 3 * time.Second
	c.KV.CollectInterval = 200 * time.Millisecond
	return c
}

// SharedHostConfig returns FastConfig with probes a node on a busy machine
// answers in time: a probe waits 200 ms for its ack (FastConfig: 80 ms)
// within a 300 ms round (100 ms), so a node whose process was not
// scheduled for a few tenths of a second, as happens to every node of a
// test suite sharing two cores with others, is not suspected for it. A
// crashed node is still found dead within about 1-3 s. For test suites
// that run several nodes on one loaded host.
func SharedHostConfig() *Config {
	c := FastConfig()
	c.Config.ProbeInterval = 300 * time.Millisecond
	c.Config.ProbeTimeout = 200 * time.Millisecond
	return c
}

// MinFailureDetection is the shortest time from a node's stop to its
// peers declaring it dead under c's memberlist timings: one probe timeout
// plus the smallest suspicion timeout, SuspicionMult × ProbeInterval
// (memberlist scales it by log10 of the cluster size, at least 1, and
// lengthens it while few peers confirm). A process paused for less cannot
// have been replaced. 0 without a memberlist config.
func (c *Config) MinFailureDetection() time.Duration {
	if c.Config == nil {
		return 0
	}
	return c.Config.ProbeTimeout + time.Duration(c.Config.SuspicionMult)*c.Config.ProbeInterval
}

// withDefaults returns a copy of c with zero fields filled in, plus a private
// copy of the memberlist config (memberlist writes to its config: BindPort,
// Keyring), so the caller's Config can build another node after a restart.
func (c *Config) withDefaults() *Config {
	out := *c
	if c.Config != nil {
		mc := *c.Config
		out.Config = &mc
	}
	out.ShardCount = cmp.Or(out.ShardCount, DefaultShardCount)
	out.ReplicationFactor = cmp.Or(out.ReplicationFactor, 1)
	out.RejoinInterval = cmp.Or(out.RejoinInterval, DefaultRejoinInterval)
	out.LeavePropagateDelay = cmp.Or(out.LeavePropagateDelay, DefaultLeavePropagateDelay)
	if out.Logger == nil {
		out.Logger = slog.New(slog.DiscardHandler)
	}
	if out.Resolver == nil {
		out.Resolver = net.DefaultResolver
	}
	out.protocolVersion = cmp.Or(out.protocolVersion, ProtocolVersion)
	return &out
}

// validate checks a defaulted config; each error names the field and its
// bound and wraps ErrInvalidConfig.
func (c *Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if c.Config == nil {
		return bad("Config (the embedded *memberlist.Config) is nil: start from DefaultConfig or FastConfig")
	}
	switch {
	case c.Name == "":
		return bad("Name is empty and the hostname could not be read: set a node name")
	case len(c.Name) > MaxNodeNameBytes:
		return bad("Name is %d bytes, limit %d", len(c.Name), MaxNodeNameBytes)
	case !utf8.ValidString(c.Name):
		return bad("Name %q is not valid UTF-8", c.Name)
	}
	if c.ShardCount > MaxShardCount {
		return bad("ShardCount %d is above the limit %d", c.ShardCount, MaxShardCount)
	}
	if c.ReplicationFactor < 1 || c.ReplicationFactor > MaxReplicationFactor {
		return bad("ReplicationFactor %d is outside 1..%d", c.ReplicationFactor, MaxReplicationFactor)
	}
	if net.ParseIP(c.BindAddr) == nil {
		return bad("BindAddr %q is not an IP literal", c.BindAddr)
	}
	if c.BindPort < 0 || c.BindPort > 65535 {
		return bad("BindPort %d is outside 0..65535", c.BindPort)
	}
	if c.AdvertiseAddr != "" && net.ParseIP(c.AdvertiseAddr) == nil {
		return bad("AdvertiseAddr %q is not an IP literal (memberlist needs one; resolve names first)", c.AdvertiseAddr)
	}
	if c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		return bad("AdvertisePort %d is outside 0..65535", c.AdvertisePort)
	}
	if n := len(c.SecretKey); n != 0 && n != 16 && n != 24 && n != 32 {
		return bad("SecretKey is %d bytes, want 16, 24 or 32 (AES-128/192/256)", n)
	}
	if len(c.GossipKeys) > 0 {
		if len(c.SecretKey) > 0 {
			return bad("both SecretKey and GossipKeys are set: put the key in GossipKeys")
		}
		if err := validateGossipKeys(c.GossipKeys); err != nil {
			return bad("GossipKeys: %v", err)
		}
	}
	if c.Keyring != nil {
		return bad("Keyring is set: cluster builds it from GossipKeys")
	}
	if c.APIAddr != "" {
		if len(c.APIAddr) > MaxAPIAddrBytes {
			return bad("APIAddr is %d bytes, limit %d", len(c.APIAddr), MaxAPIAddrBytes)
		}
		if _, err := splitHostPort(c.APIAddr); err != nil {
			return bad("APIAddr %q: %v", c.APIAddr, err)
		}
	}
	for i, j := range c.Join {
		if _, err := splitHostPort(j); err != nil {
			return bad("Join[%d] %q: %v", i, j, err)
		}
	}
	if c.RejoinInterval < 0 {
		return bad("RejoinInterval %v is negative", c.RejoinInterval)
	}
	if c.LeavePropagateDelay < 0 {
		return bad("LeavePropagateDelay %v is negative", c.LeavePropagateDelay)
	}
	switch {
	case c.Delegate != nil:
		return bad("Delegate is set: cluster installs its own memberlist delegate")
	case c.Events != nil:
		return bad("Events is set: cluster installs its own event delegate")
	case c.Alive != nil:
		return bad("Alive is set: cluster installs its own alive delegate")
	case c.Merge != nil:
		return bad("Merge is set: cluster installs its own merge delegate")
	case c.Conflict != nil:
		return bad("Conflict is set: cluster installs its own conflict delegate")
	}
	return nil
}

// splitHostPort parses host:port with a non-empty host and a port in
// 1..65535.
func splitHostPort(hp string) (hostPort, error) {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return hostPort{}, err
	}
	if host == "" {
		return hostPort{}, errors.New("host is empty")
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return hostPort{}, fmt.Errorf("port %q is not in 1..65535", port)
	}
	return hostPort{host: host, port: uint16(p)}, nil
}

type hostPort struct {
	host string
	port uint16
}
