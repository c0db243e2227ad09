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
	"strings"
	"time"

	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/dispatch"
	"github.com/fairshard/fairshard/kv"
	"github.com/fairshard/fairshard/lease"
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
	// Gossip is the memberlist addresses, seeds, keys and profile.
	Gossip
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
	// Security is the API token, cluster secret, browser and Host
	// allow lists, profiling listener and egress policy.
	Security
	// Version is the binary's release version (cmd/node's main.version),
	// reported by the fairshard_build_info metric; "" reads "dev".
	// Revision is the commit given at link time (main.revision), used
	// when the toolchain recorded none (buildinfo.Read).
	Version, Revision string
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
	c.Gossip.registerFlags(fs)
	c.Security.registerFlags(fs)
	fs.StringVar(&c.AdvertiseHTTP, "advertise-http", "", "host:port other nodes use for this node's API (default: derived)")
	fs.Func("shards", "cluster shard count, fixed per cluster (default 1024)", uintFlag(&c.Shards))
	c.Shards = 1024
	fs.Func("default-max-in-flight", "quota (rows) of a namespace without a quota record (default 1024)", uintFlag(&c.DefaultMaxInFlight))
	c.DefaultMaxInFlight = 1024
	fs.StringVar(&c.DefaultTarget, "default-target", "", "delivery URL for routes without a target; {namespace} and {task_queue} are substituted")
	fs.DurationVar(&c.HTTPReadTimeout, "http-read-timeout", 60*time.Second, "bound on reading one request, body included (slow clients are cut off)")
	fs.DurationVar(&c.HTTPIdleTimeout, "http-idle-timeout", 2*time.Minute, "keep-alive connections idle this long are closed")
	fs.DurationVar(&c.PeerCheckInterval, "peer-check-interval", 2*time.Second, "how often each other member's API is probed; one that fails 3 times in a row is shown unreachable in /v1/cluster and counted (backoff up to 5x)")
	fs.IntVar(&c.MetricsNamespaces, "metrics-namespaces", 100, "namespaces with their own label on namespace-labelled metrics; the rest are summed under \"_other\"")
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
	c.Gossip.validate(&errs)
	c.validateDefaultTarget(&errs)
	c.validateDelivery(&errs)
	c.validateReplication(&errs)
	c.validateRetention(&errs)
	c.validateQuotaLeases(&errs)
	c.validateSettingsCaps(&errs)
	c.validateLogging(&errs)
	c.Security.validate(&errs, c.Join)
	c.validateHTTPServing(&errs)
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
// directory, HTTP listen and advertised addresses and shard count.
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
	if c.AdvertiseHTTP != "" {
		if _, _, err := net.SplitHostPort(c.AdvertiseHTTP); err != nil {
			errs.bad("advertise-http", "%q is not host:port", c.AdvertiseHTTP)
		}
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

// validateHTTPServing checks the HTTP server timeouts, the peer check
// interval and the metrics namespace cap.
func (c *Config) validateHTTPServing(errs *configErrors) {
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
