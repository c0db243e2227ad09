package node

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/dispatch"
	"github.com/fairshard/fairshard/egress"
	"github.com/fairshard/fairshard/kv"
	"github.com/fairshard/fairshard/lease"
	"github.com/fairshard/fairshard/nodeauth"
	"github.com/fairshard/fairshard/quota"
	"github.com/fairshard/fairshard/replication"
)

// ErrInsecure is returned (wrapped) by Validate for a node that would
// listen beyond loopback without a cluster secret and a gossip key, and
// without --insecure.
var ErrInsecure = errors.New("refusing to start without secrets")

// ExposedAddrs lists the addresses of c (listen and advertised, as
// "--flag value") that are not loopback: an empty host or 0.0.0.0 (every
// interface), a non-loopback IP, or a host name other than "localhost".
func (c *Config) ExposedAddrs() []string {
	var out []string
	for _, a := range []struct{ flag, v string }{
		{"--http-addr", c.HTTPAddr}, {"--gossip-addr", c.GossipAddr},
		{"--advertise-http", c.AdvertiseHTTP}, {"--advertise-gossip", c.AdvertiseGossip},
	} {
		if a.v == "" && a.flag != "--http-addr" && a.flag != "--gossip-addr" {
			continue
		}
		host, _, err := net.SplitHostPort(a.v)
		if err != nil {
			continue // reported by Validate
		}
		if !loopbackHost(host) {
			out = append(out, a.flag+" "+a.v)
		}
	}
	return out
}

// validHost reports whether h is an IP (IPv6 with or without brackets)
// or a DNS host name.
func validHost(h string) bool {
	if net.ParseIP(strings.Trim(h, "[]")) != nil {
		return true
	}
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || strings.HasPrefix(label, "-") {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// loopbackHost reports whether host names a loopback address only.
func loopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Default caps on the gossiped config (--max-namespaces, --max-targets,
// --max-holds), checked when an admin call would add an entry: a call past
// a cap is answered 409 limit_exceeded naming it, and changes nothing. At
// their defaults they keep the config inside the kv store's own caps
// (kv.DefaultMaxEntries, kv.DefaultMaxBytes), which bound the state every
// push/pull sends; the kv caps answer 409 too (field "config") if big
// values reach them first.
const (
	// DefaultMaxNamespaces caps the namespaces with settings (any field set).
	DefaultMaxNamespaces = 5000
	// DefaultMaxTargets caps the routes with their own delivery target.
	DefaultMaxTargets = 5000
	// DefaultMaxHolds caps the workflows held at once.
	DefaultMaxHolds = 10_000
)

// Config is the node's boot configuration: fixed after start. Runtime
// settings (namespace quotas, pauses, targets, holds) live in the gossiped
// cluster config instead. Every field but Version has a flag
// (RegisterFlags), and the embedded package tunables have one each for
// those an operator sets (the rest keep their package defaults); cmd/node
// maps each flag to the environment variable FAIRSHARD_<FLAG_NAME>.
type Config struct {
	// NodeName is this node's unique name in the cluster. Defaults to the
	// hostname.
	NodeName string
	// DataDir holds the node's bbolt file (fairshard.db). Defaults to ./data.
	DataDir string
	// HTTPAddr is the API listen address. Defaults to 127.0.0.1:8080
	// (loopback: a node reachable from other hosts needs secrets, see
	// Insecure).
	HTTPAddr string
	// AdvertiseHTTP is the host:port other nodes use to reach this node's
	// API; derived from HTTPAddr (and the gossip advertise IP) when empty.
	AdvertiseHTTP string
	// GossipAddr is the memberlist bind address (UDP and TCP). Defaults to
	// 127.0.0.1:7946.
	GossipAddr string
	// AdvertiseGossip is the ip:port peers use to reach this node's gossip
	// (matters behind NAT); derived when empty.
	AdvertiseGossip string
	// Join lists host:port seeds; a DNS name resolving to several addresses
	// joins them all.
	Join []string
	// JoinWait bounds how long Start waits for a seed to answer before the
	// node serves alone (it owns no shard while it waits). Defaults to 10 s.
	JoinWait time.Duration
	// Shards is the cluster's shard count, fixed for the cluster's life.
	// Defaults to 1024.
	Shards uint32
	// DefaultMaxInFlight is the quota (rows) of a namespace with no quota
	// record. Defaults to 1024.
	DefaultMaxInFlight uint32
	// DefaultTarget is the delivery URL of a route with no target of its
	// own; "{namespace}" and "{task_queue}" are substituted. Empty: such
	// routes wait.
	DefaultTarget string
	// APIToken, when set, is required as "Authorization: Bearer <token>" on
	// every /v1 call. Health and metrics stay open.
	APIToken string
	// AllowOrigins are the web origins ("https://admin.example": scheme,
	// host, port) whose cross-site writes the API serves
	// (--allow-origin), e.g. a console hosted elsewhere. Empty: a write a
	// browser marks cross-site is refused (403); the node's own origin
	// (its /ui/) never needs listing.
	AllowOrigins []string
	// AllowHosts are host names and IPs served as a request's Host when
	// no APIToken is set (--allow-host), beside loopback names and the
	// node's own addresses: the names a proxy or a DNS alias uses for
	// it. Other Hosts are refused (421), since that is what a page
	// reaching the node by DNS rebinding sends. Ignored with APIToken.
	AllowHosts []string
	// ClusterSecret authenticates node-to-node calls both ways (package
	// nodeauth: every /internal/ request and its answer are signed with
	// keys derived from it; it never travels). At least 16 bytes; never
	// the API token. Empty: with APIToken set, the node signs with a
	// per-process secret, so its /internal/ routes answer nobody else,
	// and it may not join others (Validate refuses Join); without
	// APIToken, node-to-node calls are not authenticated (allowed on
	// loopback or with Insecure).
	ClusterSecret string
	// PprofAddr, when set, is the listen address of a separate listener
	// serving net/http/pprof under /debug/pprof/, always behind the API
	// token (Validate requires APIToken) and on loopback unless
	// PprofInsecure; /debug/pprof/cmdline shows the arguments with secret
	// values redacted (ScrubArgs). Empty (the default): no profiling
	// endpoint.
	PprofAddr string
	// PprofInsecure allows PprofAddr beyond loopback (profiles show the
	// program's code paths, memory use and goroutines to whoever holds
	// the API token); /v1/cluster then lists it as exposed.
	PprofInsecure bool
	// APITokenFile, when set, holds the API token instead of --api-token
	// (the file's content, edge whitespace trimmed), so the token is not
	// in the process arguments (ps, /proc/PID/cmdline).
	APITokenFile string
	// Version is the binary's release version (cmd/node's main.version),
	// reported by the fairshard_build_info metric; "" reads "dev".
	Version string
	// ClusterSecretFile, when set, holds the cluster secret instead of
	// --cluster-secret (the file's content, edge whitespace trimmed).
	ClusterSecretFile string
	// Insecure allows listening beyond loopback without a cluster secret
	// and a gossip key: the node then logs a warning at start and every
	// hour, and /v1/cluster and fairshard_insecure say so. Without it such
	// a node refuses to start.
	Insecure bool
	// TargetAllow is the egress policy of deliveries (--target-allow):
	// CIDRs, IPs and host names, checked at dial time against the address
	// dialled (package egress): an address in a CIDR is allowed; a listed
	// name reaches only public addresses and those in a CIDR, never
	// egress.DefaultDeny. Empty: every address but link-local, cloud
	// metadata, unspecified and multicast ones (egress.DefaultDeny).
	TargetAllow []string
	// HTTPReadTimeout bounds reading one request, body included (a client
	// trickling a body is cut off); HTTPIdleTimeout closes keep-alive
	// connections idle that long. Default to 60 s and 2 min.
	HTTPReadTimeout, HTTPIdleTimeout time.Duration
	// PeerCheckInterval is how often each other member's API is probed
	// (unreachable ones with a backoff up to 5×). Defaults to 2 s.
	PeerCheckInterval time.Duration
	// MetricsNamespaces is how many namespaces get their own label value
	// on namespace-labelled metrics; the others are counted under
	// "_other". Defaults to 100.
	MetricsNamespaces int
	// GossipKeys encrypt gossip: 16, 24 or 32 bytes each (base64 in flags
	// and env, comma-separated), at most cluster.MaxGossipKeys, primary
	// first: the primary encrypts, every key decrypts. A rotation changes
	// the list in three cluster-wide steps (docs/operations.md "Rotating
	// the gossip key"). Empty: no encryption.
	GossipKeys [][]byte
	// GossipKeyFile, when set, holds the gossip keys instead of
	// --gossip-key: base64 keys one a line, primary first, blank lines and
	// lines starting with # ignored. Validate reads it into GossipKeys; the
	// node reads it again on ReloadGossipKeys (SIGHUP), so keys rotate
	// without restarts.
	GossipKeyFile string
	// GossipProfile picks memberlist timings: "lan" (default), "fast"
	// (short probe and push/pull intervals, for tests and demos on
	// loopback) or "shared-host" (fast with longer probe timeouts, for
	// test suites running many nodes on one busy machine).
	GossipProfile string

	// Dispatch is the dispatcher's tunables: sweep interval and batch,
	// delivery and visibility timeouts, the node's retry policy and the
	// per-host concurrency bound. Its flags, defaults and checks are the
	// dispatch package's (dispatch.Tunables.RegisterFlags, Validate).
	Dispatch dispatch.Tunables

	// ReplicationFactor is the replication factor R a new cluster starts
	// with: every shard is kept on R nodes (1–5, capped by the active
	// members). It is cluster-wide: the cluster's value lives in the
	// gossiped config (PUT /v1/cluster changes it on a live cluster), and
	// this flag only seeds it when the cluster has none yet; a node whose
	// flag differs follows the cluster and logs the difference. Defaults
	// to 2.
	ReplicationFactor int
	// Replication is the replicator's tunables: the write-copies minimum,
	// the repair and handoff intervals and the handoff batch limits. Its
	// flags, defaults and checks are the replication package's
	// (replication.Tunables.RegisterFlags, Validate). The node sets two of
	// them from its other settings when it starts: HandoverTimeout to the
	// delivery timeout + 5 s, FailedPeerWait to its gossip profile's
	// GossipToTheDeadTime (at least 5 s).
	Replication replication.Tunables
	// ShutdownGrace is the graceful stop's grace: in-flight deliveries get
	// half of it to finish; a leave still handing off rows after it logs
	// so and goes on until every row held here is held elsewhere (only a
	// second signal cuts it short). Defaults to 30 s.
	ShutdownGrace time.Duration
	// TombstoneRetention is the dedupe window: how long finished rows keep
	// their key. Defaults to 24 h.
	TombstoneRetention time.Duration
	// QuotaTTL is how long a namespace quota is cached. Defaults to 2 s.
	QuotaTTL time.Duration
	// DefaultQuotaMode is the quota mode of a namespace without one:
	// "exact" (capacity leases; the default) or "proportional" (the seed's
	// ceil(quota × owned/total)). See docs/api.md "Quota modes".
	DefaultQuotaMode string
	// Lease is the exact quota mode's lease length and refresh interval;
	// its flags, defaults and checks are the lease package's
	// (lease.Timings.RegisterFlags, Validate).
	Lease lease.Timings
	// MaxNamespaces, MaxTargets and MaxHolds cap the gossiped config:
	// namespaces with settings, routes with their own target, workflows
	// held. An admin call past a cap is answered 409. Default to
	// DefaultMaxNamespaces, DefaultMaxTargets and DefaultMaxHolds; at most
	// kv.DefaultMaxEntries each.
	MaxNamespaces, MaxTargets, MaxHolds int

	// LogLevel is debug, info, warn or error; LogFormat is text or json.
	LogLevel  string
	LogFormat string
}

// DefaultConfig returns a Config holding every default.
func DefaultConfig() Config {
	fs := flag.NewFlagSet("defaults", flag.ContinueOnError)
	var c Config
	c.RegisterFlags(fs)
	return c
}

// RegisterFlags registers one flag per field on fs, with its default and
// help text; flags are the single source of defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	host, _ := os.Hostname()
	fs.StringVar(&c.NodeName, "node-name", host, "unique node name in the cluster")
	fs.StringVar(&c.DataDir, "data-dir", "./data", "directory of this node's bbolt outbox file; with {slot} (e.g. /data/{slot}) the node takes the first free slot dir, and the node name bound to that slot wins over --node-name")
	fs.StringVar(&c.HTTPAddr, "http-addr", "127.0.0.1:8080", "HTTP API listen address (beyond loopback the node needs --cluster-secret and --gossip-key, or --insecure)")
	fs.StringVar(&c.AdvertiseHTTP, "advertise-http", "", "host:port other nodes use for this node's API (default: derived)")
	fs.StringVar(&c.GossipAddr, "gossip-addr", "127.0.0.1:7946", "gossip (memberlist) bind address, UDP and TCP (beyond loopback the node needs --cluster-secret and --gossip-key, or --insecure)")
	fs.StringVar(&c.AdvertiseGossip, "advertise-gossip", "", "ip:port peers use to reach this node's gossip (default: the bound IP, or for 0.0.0.0 an address of the default route's interface, logged at start)")
	fs.Func("join", "comma-separated host:port seeds to join (DNS names join every address)", func(s string) error {
		c.Join = splitList(s)
		return nil
	})
	fs.DurationVar(&c.JoinWait, "join-wait", 10*time.Second, "how long start-up waits for a seed to answer before serving alone (owning nothing meanwhile)")
	fs.Func("shards", "cluster shard count, fixed per cluster (default 1024)", uintFlag(&c.Shards))
	c.Shards = 1024
	fs.Func("default-max-in-flight", "quota (rows) of a namespace without a quota record (default 1024)", uintFlag(&c.DefaultMaxInFlight))
	c.DefaultMaxInFlight = 1024
	fs.StringVar(&c.DefaultTarget, "default-target", "", "delivery URL for routes without a target; {namespace} and {task_queue} are substituted")
	fs.StringVar(&c.APIToken, "api-token", "", "bearer token required on /v1 calls (default: none); on the command line it is visible to ps: prefer --api-token-file or FAIRSHARD_API_TOKEN")
	fs.StringVar(&c.APITokenFile, "api-token-file", "", "file holding the API token (instead of --api-token)")
	fs.Func("allow-origin", "comma-separated web origins (scheme://host[:port]) whose cross-site writes the API serves (default: none; the node's own /ui/ needs none)", func(s string) error {
		c.AllowOrigins = splitList(s)
		return nil
	})
	fs.Func("allow-host", "comma-separated host names and IPs served as the Host of a request when --api-token is not set, beside loopback names and the node's own addresses (default: none)", func(s string) error {
		c.AllowHosts = splitList(s)
		return nil
	})
	fs.StringVar(&c.PprofAddr, "pprof-addr", "", "listen address of a separate net/http/pprof listener (/debug/pprof/), behind --api-token (required), loopback only unless --pprof-insecure; empty: off")
	fs.BoolVar(&c.PprofInsecure, "pprof-insecure", false, "allow --pprof-addr beyond loopback (still behind --api-token; listed as exposed in /v1/cluster)")
	fs.StringVar(&c.ClusterSecret, "cluster-secret", "", "shared secret (at least 16 bytes, not the API token) that signs node-to-node calls both ways; required beyond loopback unless --insecure; on the command line it is visible to ps: prefer --cluster-secret-file or FAIRSHARD_CLUSTER_SECRET")
	fs.StringVar(&c.ClusterSecretFile, "cluster-secret-file", "", "file holding the cluster secret (instead of --cluster-secret)")
	fs.BoolVar(&c.Insecure, "insecure", false, "allow listening beyond loopback without --cluster-secret and --gossip-key: node-to-node calls unauthenticated, gossip in clear (warned at start and every hour)")
	fs.Func("target-allow", "comma-separated CIDRs and host names delivery targets may connect to, checked at dial time on the address dialled: a listed name reaches public addresses and those in a listed CIDR, never metadata or link-local (default: any address but link-local, cloud metadata, unspecified and multicast)", func(s string) error {
		c.TargetAllow = splitList(s)
		return nil
	})
	fs.DurationVar(&c.HTTPReadTimeout, "http-read-timeout", 60*time.Second, "bound on reading one request, body included (slow clients are cut off)")
	fs.DurationVar(&c.HTTPIdleTimeout, "http-idle-timeout", 2*time.Minute, "keep-alive connections idle this long are closed")
	fs.DurationVar(&c.PeerCheckInterval, "peer-check-interval", 2*time.Second, "how often each other member's API is probed; one that fails 3 times in a row is shown unreachable in /v1/cluster and counted (backoff up to 5x)")
	fs.IntVar(&c.MetricsNamespaces, "metrics-namespaces", 100, "namespaces with their own label on namespace-labelled metrics; the rest are summed under \"_other\"")
	fs.Func("gossip-key", "comma-separated base64 gossip encryption keys of 16, 24 or 32 bytes, primary first: the first encrypts, each decrypts (default: none; rotation: see docs/operations.md \"Rotating the gossip key\"); on the command line they are visible to ps: prefer --gossip-key-file or FAIRSHARD_GOSSIP_KEY", func(s string) error {
		keys, err := ParseGossipKeys(strings.Split(s, ","))
		if err != nil {
			return err
		}
		c.GossipKeys = keys
		return nil
	})
	fs.StringVar(&c.GossipKeyFile, "gossip-key-file", "", "file of base64 gossip keys, one a line, primary first; read again on SIGHUP to rotate keys without restarts (instead of --gossip-key)")
	fs.StringVar(&c.GossipProfile, "gossip-profile", "lan", "memberlist timings: lan, fast (tests and demos on loopback) or shared-host (fast with probe timeouts a busy machine meets: test suites)")
	c.Dispatch.RegisterFlags(fs)
	fs.IntVar(&c.ReplicationFactor, "replication-factor", 2, "copies of every shard, 1-5, cluster-wide: seeds a new cluster's value (PUT /v1/cluster changes it live); capped by the active members")
	c.Replication.RegisterFlags(fs)
	fs.DurationVar(&c.ShutdownGrace, "shutdown-grace", 30*time.Second, "graceful stop: in-flight deliveries get half of it; a leave past it says so and goes on until every row is handed off (a second signal exits at once)")
	fs.DurationVar(&c.TombstoneRetention, "tombstone-retention", 24*time.Hour, "dedupe window: how long finished rows keep their key")
	fs.DurationVar(&c.QuotaTTL, "quota-ttl", 2*time.Second, "how long a namespace quota is cached")
	fs.StringVar(&c.DefaultQuotaMode, "default-quota-mode", "exact", "quota mode of a namespace without one: exact (cluster-wide capacity leases) or proportional (ceil(quota × owned/total) per node)")
	c.Lease.RegisterFlags(fs)
	fs.IntVar(&c.MaxNamespaces, "max-namespaces", DefaultMaxNamespaces, "most namespaces with settings (cluster-wide, gossiped config)")
	fs.IntVar(&c.MaxTargets, "max-targets", DefaultMaxTargets, "most routes with their own delivery target (cluster-wide)")
	fs.IntVar(&c.MaxHolds, "max-holds", DefaultMaxHolds, "most workflows held at once (cluster-wide)")
	fs.StringVar(&c.LogLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", "text", "text or json")
}

// ParseGossipKeys decodes gossip keys given as base64 strings, primary
// first; blank entries are skipped. Errors name the key by position: not
// base64, not 16, 24 or 32 bytes, a key given twice, more than
// cluster.MaxGossipKeys.
func ParseGossipKeys(encoded []string) ([][]byte, error) {
	var keys [][]byte
	for _, e := range encoded {
		if e = strings.TrimSpace(e); e == "" {
			continue
		}
		k, err := base64.StdEncoding.DecodeString(e)
		if err != nil {
			return nil, fmt.Errorf("key %d is not base64: %w", len(keys)+1, err)
		}
		if n := len(k); n != 16 && n != 24 && n != 32 {
			return nil, fmt.Errorf("key %d decodes to %d bytes, want 16, 24 or 32", len(keys)+1, n)
		}
		for i, o := range keys {
			if bytes.Equal(o, k) {
				return nil, fmt.Errorf("keys %d and %d are the same key", i+1, len(keys)+1)
			}
		}
		keys = append(keys, k)
	}
	if len(keys) > cluster.MaxGossipKeys {
		return nil, fmt.Errorf("%d keys, at most %d (a rotation needs two)", len(keys), cluster.MaxGossipKeys)
	}
	return keys, nil
}

// LoadGossipKeys reads a --gossip-key-file: base64 keys one a line,
// primary first; blank lines and lines starting with # are skipped. An
// empty file is an error (a node cannot drop encryption while running).
func LoadGossipKeys(path string) ([][]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read gossip keys: %w", err)
	}
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" && !strings.HasPrefix(l, "#") {
			lines = append(lines, l)
		}
	}
	keys, err := ParseGossipKeys(lines)
	if err != nil {
		return nil, fmt.Errorf("gossip keys in %s: %w", path, err)
	}
	if len(keys) == 0 {
		return nil, fmt.Errorf("gossip keys in %s: no key", path)
	}
	return keys, nil
}

func uintFlag(dst *uint32) func(string) error {
	return func(s string) error {
		var v uint64
		if _, err := fmt.Sscanf(s, "%d", &v); err != nil || v > 1<<32-1 || fmt.Sprint(v) != strings.TrimSpace(s) {
			return fmt.Errorf("%q is not a non-negative integer", s)
		}
		*dst = uint32(v)
		return nil
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// Validate checks the configuration once, at start-up, and fills the
// defaults left to it: the package tunables' (dispatch and replication
// Tunables.Validate, VisibilityTimeout among them), the quota mode and
// lease timings, ClusterSecret. Messages name the flag.
func (c *Config) Validate() error {
	var errs configErrors
	c.validateIdentity(&errs)
	c.validateDefaultTarget(&errs)
	c.validateGossip(&errs)
	c.validateDelivery(&errs)
	c.validateReplication(&errs)
	c.validateRetention(&errs)
	c.validateQuotaLeases(&errs)
	c.validateSettingsCaps(&errs)
	c.validateLogging(&errs)
	c.validateAPIToken(&errs)
	c.validatePprof(&errs)
	c.validateClusterSecret(&errs)
	c.validateHTTPExposure(&errs)
	c.validateSecretsWhenExposed(&errs)
	return errors.Join(errs...)
}

// configErrors collects Validate's errors in the order they are found.
type configErrors []error

// bad records that flag's value is wrong: "--flag: message".
func (e *configErrors) bad(flag, format string, args ...any) {
	e.add(fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, args...)))
}

// add records err as is.
func (e *configErrors) add(err error) { *e = append(*e, err) }

// validateIdentity checks what names and places the node: its name, data
// directory, listen and advertised addresses, seeds and shard count.
// An advertised gossip address must be an IP literal: peers dial it as is.
func (c *Config) validateIdentity(errs *configErrors) {
	if c.NodeName == "" {
		errs.bad("node-name", "is empty (and the hostname is unknown)")
	}
	if c.DataDir == "" {
		errs.bad("data-dir", "is empty")
	}
	if _, _, err := net.SplitHostPort(c.HTTPAddr); err != nil {
		errs.bad("http-addr", "%q is not host:port: %v", c.HTTPAddr, err)
	}
	if _, _, err := net.SplitHostPort(c.GossipAddr); err != nil {
		errs.bad("gossip-addr", "%q is not host:port: %v", c.GossipAddr, err)
	}
	if c.AdvertiseGossip != "" {
		h, _, err := net.SplitHostPort(c.AdvertiseGossip)
		if err != nil || net.ParseIP(h) == nil {
			errs.bad("advertise-gossip", "%q must be ip:port with an IP literal", c.AdvertiseGossip)
		}
	}
	if c.AdvertiseHTTP != "" {
		if _, _, err := net.SplitHostPort(c.AdvertiseHTTP); err != nil {
			errs.bad("advertise-http", "%q is not host:port", c.AdvertiseHTTP)
		}
	}
	for _, j := range c.Join {
		if _, _, err := net.SplitHostPort(j); err != nil {
			errs.bad("join", "%q is not host:port", j)
		}
	}
	if len(c.Join) > 0 && c.JoinWait <= 0 {
		errs.bad("join-wait", "must be positive")
	}
	if c.Shards == 0 {
		errs.bad("shards", "must be at least 1")
	}
}

// validateDefaultTarget checks that the default delivery target, with its
// {namespace} and {task_queue} placeholders filled, is an http(s) URL.
func (c *Config) validateDefaultTarget(errs *configErrors) {
	if c.DefaultTarget != "" {
		u, err := url.Parse(strings.NewReplacer("{namespace}", "ns", "{task_queue}", "tq").Replace(c.DefaultTarget))
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			errs.bad("default-target", "%q is not an http(s) URL", c.DefaultTarget)
		}
	}
}

// validateGossip loads the gossip keys from --gossip-key-file (the file and
// --gossip-key may not disagree) and checks the gossip profile.
func (c *Config) validateGossip(errs *configErrors) {
	if c.GossipKeyFile != "" {
		// Validate may run twice (cmd/node, then New): keys equal to the
		// file's are the file's.
		keys, err := LoadGossipKeys(c.GossipKeyFile)
		switch {
		case err != nil:
			errs.bad("gossip-key-file", "%v", err)
		case len(c.GossipKeys) > 0 && !slices.EqualFunc(c.GossipKeys, keys, bytes.Equal):
			errs.bad("gossip-key-file", "and --gossip-key are both set: keep the keys in one place")
		default:
			c.GossipKeys = keys
		}
	}
	if c.GossipProfile != "lan" && c.GossipProfile != "fast" && c.GossipProfile != "shared-host" {
		errs.bad("gossip-profile", "%q is not lan, fast or shared-host", c.GossipProfile)
	}
}

// validateDelivery checks the dispatcher's tunables and fills the derived
// ones (dispatch.Tunables.Validate: the visibility timeout defaults to the
// delivery timeout + 30s and must exceed it).
func (c *Config) validateDelivery(errs *configErrors) {
	if err := c.Dispatch.Validate(); err != nil {
		errs.add(err)
	}
}

// validateReplication checks the replication factor, write copies, repair
// and handoff settings.
func (c *Config) validateReplication(errs *configErrors) {
	if c.ReplicationFactor < 1 || c.ReplicationFactor > replication.MaxFactor {
		errs.bad("replication-factor", "%d is not between 1 and %d", c.ReplicationFactor, replication.MaxFactor)
	}
	if err := c.Replication.Validate(); err != nil {
		errs.add(err)
	}
}

// validateRetention checks how long a leaving node drains and how long
// finished rows are kept as tombstones.
func (c *Config) validateRetention(errs *configErrors) {
	if c.ShutdownGrace <= 0 {
		errs.bad("shutdown-grace", "must be positive")
	}
	if c.TombstoneRetention <= 0 {
		errs.bad("tombstone-retention", "must be positive")
	}
}

// validateQuotaLeases defaults the quota mode to exact and the capacity
// lease timing to the lease package's defaults, then checks that the
// refresh interval is at most the lease length.
func (c *Config) validateQuotaLeases(errs *configErrors) {
	c.DefaultQuotaMode = cmp.Or(c.DefaultQuotaMode, "exact")
	if _, err := quota.ParseMode(c.DefaultQuotaMode); err != nil {
		errs.bad("default-quota-mode", "%q is not exact or proportional", c.DefaultQuotaMode)
	}
	if err := c.Lease.Validate(); err != nil {
		errs.add(err)
	}
}

// validateSettingsCaps checks the caps on the gossiped config (namespaces,
// targets, holds): each at most the config store's entry cap.
func (c *Config) validateSettingsCaps(errs *configErrors) {
	for _, lim := range []struct {
		flag string
		v    int
	}{{"max-namespaces", c.MaxNamespaces}, {"max-targets", c.MaxTargets}, {"max-holds", c.MaxHolds}} {
		if lim.v < 1 || lim.v > kv.DefaultMaxEntries {
			errs.bad(lim.flag, "%d is not between 1 and %d (the gossiped config's entry cap)", lim.v, kv.DefaultMaxEntries)
		}
	}
}

// validateLogging checks the log level and format.
func (c *Config) validateLogging(errs *configErrors) {
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		errs.bad("log-level", "%q is not debug, info, warn or error", c.LogLevel)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs.bad("log-format", "%q is not text or json", c.LogFormat)
	}
}

// validateAPIToken reads the API token from --api-token-file: the file must
// not be empty and may not disagree with --api-token.
func (c *Config) validateAPIToken(errs *configErrors) {
	if c.APITokenFile != "" {
		b, err := os.ReadFile(c.APITokenFile)
		tok := strings.TrimSpace(string(b))
		switch {
		case err != nil:
			errs.bad("api-token-file", "%v", err)
		case tok == "":
			errs.bad("api-token-file", "%s is empty", c.APITokenFile)
		case c.APIToken != "" && c.APIToken != tok:
			errs.bad("api-token-file", "and --api-token are both set: keep the token in one place")
		default:
			c.APIToken = tok
		}
	}
}

// validatePprof checks the profiling listener: it is served only behind the
// API token, and beyond loopback only with --pprof-insecure.
func (c *Config) validatePprof(errs *configErrors) {
	if c.PprofAddr != "" {
		host, _, err := net.SplitHostPort(c.PprofAddr)
		switch {
		case err != nil:
			errs.bad("pprof-addr", "%q is not host:port: %v", c.PprofAddr, err)
		case c.APIToken == "":
			errs.bad("pprof-addr", "needs --api-token (or --api-token-file): profiles are served only behind it")
		case !loopbackHost(host) && !c.PprofInsecure:
			errs.bad("pprof-addr", "%q listens beyond loopback: bind 127.0.0.1, or pass --pprof-insecure to expose profiles on purpose", c.PprofAddr)
		}
	}
}

// validateClusterSecret reads the cluster secret from --cluster-secret-file
// and checks it: required for a joining node with an API token, long
// enough, and different from the API token, so API clients cannot make
// node-to-node calls.
func (c *Config) validateClusterSecret(errs *configErrors) {
	if c.ClusterSecretFile != "" {
		b, err := os.ReadFile(c.ClusterSecretFile)
		sec := strings.TrimSpace(string(b))
		switch {
		case err != nil:
			errs.bad("cluster-secret-file", "%v", err)
		case c.ClusterSecret != "" && c.ClusterSecret != sec:
			errs.bad("cluster-secret-file", "and --cluster-secret are both set: keep the secret in one place")
		default:
			c.ClusterSecret = sec
		}
	}
	if c.APIToken != "" && c.ClusterSecret == "" && len(c.Join) > 0 {
		errs.bad("cluster-secret", "is required with --api-token and --join: without it the node-to-node routes (/internal/) of a cluster "+
			"would answer anyone who reaches --http-addr, token or not; give every node the same --cluster-secret-file "+
			"(or FAIRSHARD_CLUSTER_SECRET; `fairshard secrets` prints one)")
	}
	if c.ClusterSecret != "" && len(c.ClusterSecret) < nodeauth.MinSecretBytes {
		errs.bad("cluster-secret", "is %d bytes, at least %d are required (e.g. openssl rand -hex 32)", len(c.ClusterSecret), nodeauth.MinSecretBytes)
	}
	if c.ClusterSecret != "" && c.ClusterSecret == c.APIToken {
		errs.bad("cluster-secret", "must differ from --api-token: API clients must not be able to make node-to-node calls")
	}
}

// validateHTTPExposure checks and normalises (lower case, no trailing dot
// or slash) the allowed browser origins and Host names, the delivery
// targets' allow list, the HTTP server timeouts, the peer check interval
// and the metrics namespace cap.
func (c *Config) validateHTTPExposure(errs *configErrors) {
	for i, o := range c.AllowOrigins {
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			strings.TrimSuffix(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" {
			errs.bad("allow-origin", "%q is not an origin (scheme://host[:port], e.g. https://admin.example)", o)
			continue
		}
		c.AllowOrigins[i] = strings.ToLower(u.Scheme + "://" + u.Host)
	}
	for i, h := range c.AllowHosts {
		if !validHost(h) {
			errs.bad("allow-host", "%q is not a host name or an IP (no port, no scheme)", h)
			continue
		}
		c.AllowHosts[i] = strings.ToLower(strings.TrimSuffix(strings.Trim(h, "[]"), "."))
	}
	if _, err := egress.Parse(c.TargetAllow); err != nil {
		errs.bad("target-allow", "%v", err)
	}
	if c.HTTPReadTimeout <= 0 {
		errs.bad("http-read-timeout", "must be positive")
	}
	if c.HTTPIdleTimeout <= 0 {
		errs.bad("http-idle-timeout", "must be positive")
	}
	if c.PeerCheckInterval <= 0 {
		errs.bad("peer-check-interval", "must be positive")
	}
	if c.MetricsNamespaces < 0 || c.MetricsNamespaces > 10_000 {
		errs.bad("metrics-namespaces", "%d is not between 0 and 10000", c.MetricsNamespaces)
	}
}

// validateSecretsWhenExposed refuses, with ErrInsecure, a node that listens
// beyond loopback without a cluster secret and gossip keys, unless
// --insecure says so on purpose.
func (c *Config) validateSecretsWhenExposed(errs *configErrors) {
	if exposed := c.ExposedAddrs(); len(exposed) > 0 && !c.Insecure {
		var missing []string
		if c.ClusterSecret == "" {
			missing = append(missing, "--cluster-secret (or --cluster-secret-file)")
		}
		if len(c.GossipKeys) == 0 {
			missing = append(missing, "--gossip-key (or --gossip-key-file)")
		}
		if len(missing) > 0 {
			errs.add(fmt.Errorf("%w: %s listens beyond loopback, so it needs %s; generate them with `fairshard secrets`, "+
				"or pass --insecure to run unauthenticated on purpose (docs/operations.md \"Security\")", ErrInsecure, strings.Join(exposed, " and "), strings.Join(missing, " and ")))
		}
	}
}
