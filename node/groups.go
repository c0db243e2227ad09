package node

import (
	"bytes"
	"flag"
	"net"
	"net/url"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/fairshard/fairshard/egress"
	"github.com/fairshard/fairshard/nodeauth"
)

// Gossip is where the node gossips and whom it joins: memberlist's
// addresses, the seeds, the encryption keys and the timing profile.
// Config embeds it; its flags are --gossip-addr, --advertise-gossip,
// --join, --join-wait, --gossip-key, --gossip-key-file and
// --gossip-profile.
type Gossip struct {
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
}

// registerFlags registers g's flags on fs with their defaults.
func (g *Gossip) registerFlags(fs *flag.FlagSet) {
	fs.StringVar(&g.GossipAddr, "gossip-addr", "127.0.0.1:7946", "gossip (memberlist) bind address, UDP and TCP (beyond loopback the node needs --cluster-secret and --gossip-key, or --insecure)")
	fs.StringVar(&g.AdvertiseGossip, "advertise-gossip", "", "ip:port peers use to reach this node's gossip (default: the bound IP, or for 0.0.0.0 an address of the default route's interface, logged at start)")
	fs.Func("join", "comma-separated host:port seeds to join (DNS names join every address)", func(v string) error {
		g.Join = splitList(v)
		return nil
	})
	fs.DurationVar(&g.JoinWait, "join-wait", 10*time.Second, "how long start-up waits for a seed to answer before serving alone (owning nothing meanwhile)")
	fs.Func("gossip-key", "comma-separated base64 gossip encryption keys of 16, 24 or 32 bytes, primary first: the first encrypts, each decrypts (default: none; rotation: see docs/operations.md \"Rotating the gossip key\"); on the command line they are visible to ps: prefer --gossip-key-file or FAIRSHARD_GOSSIP_KEY", func(v string) error {
		keys, err := ParseGossipKeys(strings.Split(v, ","))
		if err != nil {
			return err
		}
		g.GossipKeys = keys
		return nil
	})
	fs.StringVar(&g.GossipKeyFile, "gossip-key-file", "", "file of base64 gossip keys, one a line, primary first; read again on SIGHUP to rotate keys without restarts (instead of --gossip-key)")
	fs.StringVar(&g.GossipProfile, "gossip-profile", "lan", "memberlist timings: lan, fast (tests and demos on loopback) or shared-host (fast with probe timeouts a busy machine meets: test suites)")
}

// Security is the node's credentials and exposure policy: the API token,
// the cluster secret that signs node-to-node calls, the browser origins
// and Host names served, the profiling listener and the egress policy of
// deliveries (docs/operations.md "Security"). Config embeds it; each
// field has the flag named in its comment.
type Security struct {
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
}

// registerFlags registers s's flags on fs with their defaults.
func (s *Security) registerFlags(fs *flag.FlagSet) {
	fs.StringVar(&s.APIToken, "api-token", "", "bearer token required on /v1 calls (default: none); on the command line it is visible to ps: prefer --api-token-file or FAIRSHARD_API_TOKEN")
	fs.StringVar(&s.APITokenFile, "api-token-file", "", "file holding the API token (instead of --api-token)")
	fs.Func("allow-origin", "comma-separated web origins (scheme://host[:port]) whose cross-site writes the API serves (default: none; the node's own /ui/ needs none)", func(v string) error {
		s.AllowOrigins = splitList(v)
		return nil
	})
	fs.Func("allow-host", "comma-separated host names and IPs served as the Host of a request when --api-token is not set, beside loopback names and the node's own addresses (default: none)", func(v string) error {
		s.AllowHosts = splitList(v)
		return nil
	})
	fs.StringVar(&s.PprofAddr, "pprof-addr", "", "listen address of a separate net/http/pprof listener (/debug/pprof/), behind --api-token (required), loopback only unless --pprof-insecure; empty: off")
	fs.BoolVar(&s.PprofInsecure, "pprof-insecure", false, "allow --pprof-addr beyond loopback (still behind --api-token; listed as exposed in /v1/cluster)")
	fs.StringVar(&s.ClusterSecret, "cluster-secret", "", "shared secret (at least 16 bytes, not the API token) that signs node-to-node calls both ways; required beyond loopback unless --insecure; on the command line it is visible to ps: prefer --cluster-secret-file or FAIRSHARD_CLUSTER_SECRET")
	fs.StringVar(&s.ClusterSecretFile, "cluster-secret-file", "", "file holding the cluster secret (instead of --cluster-secret)")
	fs.BoolVar(&s.Insecure, "insecure", false, "allow listening beyond loopback without --cluster-secret and --gossip-key: node-to-node calls unauthenticated, gossip in clear (warned at start and every hour)")
	fs.Func("target-allow", "comma-separated CIDRs and host names delivery targets may connect to, checked at dial time on the address dialled: a listed name reaches public addresses and those in a listed CIDR, never metadata or link-local (default: any address but link-local, cloud metadata, unspecified and multicast)", func(v string) error {
		s.TargetAllow = splitList(v)
		return nil
	})
}

// validate checks the gossip addresses (an advertised address must be an
// IP literal: peers dial it as is) and seeds, loads the gossip keys from
// --gossip-key-file (the file and --gossip-key may not disagree) and
// checks the gossip profile.
func (g *Gossip) validate(errs *configErrors) {
	if _, _, err := net.SplitHostPort(g.GossipAddr); err != nil {
		errs.bad("gossip-addr", "%q is not host:port: %v", g.GossipAddr, err)
	}
	if g.AdvertiseGossip != "" {
		h, _, err := net.SplitHostPort(g.AdvertiseGossip)
		if err != nil || net.ParseIP(h) == nil {
			errs.bad("advertise-gossip", "%q must be ip:port with an IP literal", g.AdvertiseGossip)
		}
	}
	for _, j := range g.Join {
		if _, _, err := net.SplitHostPort(j); err != nil {
			errs.bad("join", "%q is not host:port", j)
		}
	}
	if len(g.Join) > 0 && g.JoinWait <= 0 {
		errs.bad("join-wait", "must be positive")
	}
	if g.GossipKeyFile != "" {
		// Validate may run twice (cmd/node, then New): keys equal to the
		// file's are the file's.
		keys, err := LoadGossipKeys(g.GossipKeyFile)
		switch {
		case err != nil:
			errs.bad("gossip-key-file", "%v", err)
		case len(g.GossipKeys) > 0 && !slices.EqualFunc(g.GossipKeys, keys, bytes.Equal):
			errs.bad("gossip-key-file", "and --gossip-key are both set: keep the keys in one place")
		default:
			g.GossipKeys = keys
		}
	}
	if g.GossipProfile != "lan" && g.GossipProfile != "fast" && g.GossipProfile != "shared-host" {
		errs.bad("gossip-profile", "%q is not lan, fast or shared-host", g.GossipProfile)
	}
}

// validate checks s and fills what it derives: the API token and cluster
// secret read from their files, the origins and Host names normalised.
// join is the node's seeds: a joining node with an API token needs a
// cluster secret.
func (s *Security) validate(errs *configErrors, join []string) {
	s.validateAPIToken(errs)
	s.validatePprof(errs)
	s.validateClusterSecret(errs, join)
	s.validateBrowsers(errs)
	if _, err := egress.Parse(s.TargetAllow); err != nil {
		errs.bad("target-allow", "%v", err)
	}
}

// validateAPIToken reads the API token from --api-token-file: the file must
// not be empty and may not disagree with --api-token.
func (s *Security) validateAPIToken(errs *configErrors) {
	if s.APITokenFile != "" {
		b, err := os.ReadFile(s.APITokenFile)
		tok := strings.TrimSpace(string(b))
		switch {
		case err != nil:
			errs.bad("api-token-file", "%v", err)
		case tok == "":
			errs.bad("api-token-file", "%s is empty", s.APITokenFile)
		case s.APIToken != "" && s.APIToken != tok:
			errs.bad("api-token-file", "and --api-token are both set: keep the token in one place")
		default:
			s.APIToken = tok
		}
	}
}

// validatePprof checks the profiling listener: it is served only behind the
// API token, and beyond loopback only with --pprof-insecure.
func (s *Security) validatePprof(errs *configErrors) {
	if s.PprofAddr != "" {
		host, _, err := net.SplitHostPort(s.PprofAddr)
		switch {
		case err != nil:
			errs.bad("pprof-addr", "%q is not host:port: %v", s.PprofAddr, err)
		case s.APIToken == "":
			errs.bad("pprof-addr", "needs --api-token (or --api-token-file): profiles are served only behind it")
		case !loopbackHost(host) && !s.PprofInsecure:
			errs.bad("pprof-addr", "%q listens beyond loopback: bind 127.0.0.1, or pass --pprof-insecure to expose profiles on purpose", s.PprofAddr)
		}
	}
}

// validateClusterSecret reads the cluster secret from --cluster-secret-file
// and checks it: required for a joining node with an API token, long
// enough, and different from the API token, so API clients cannot make
// node-to-node calls.
func (s *Security) validateClusterSecret(errs *configErrors, join []string) {
	if s.ClusterSecretFile != "" {
		b, err := os.ReadFile(s.ClusterSecretFile)
		sec := strings.TrimSpace(string(b))
		switch {
		case err != nil:
			errs.bad("cluster-secret-file", "%v", err)
		case s.ClusterSecret != "" && s.ClusterSecret != sec:
			errs.bad("cluster-secret-file", "and --cluster-secret are both set: keep the secret in one place")
		default:
			s.ClusterSecret = sec
		}
	}
	if s.APIToken != "" && s.ClusterSecret == "" && len(join) > 0 {
		errs.bad("cluster-secret", "is required with --api-token and --join: without it the node-to-node routes (/internal/) of a cluster "+
			"would answer anyone who reaches --http-addr, token or not; give every node the same --cluster-secret-file "+
			"(or FAIRSHARD_CLUSTER_SECRET; `fairshard secrets` prints one)")
	}
	if s.ClusterSecret != "" && len(s.ClusterSecret) < nodeauth.MinSecretBytes {
		errs.bad("cluster-secret", "is %d bytes, at least %d are required (e.g. openssl rand -hex 32)", len(s.ClusterSecret), nodeauth.MinSecretBytes)
	}
	if s.ClusterSecret != "" && s.ClusterSecret == s.APIToken {
		errs.bad("cluster-secret", "must differ from --api-token: API clients must not be able to make node-to-node calls")
	}
}

// validateBrowsers checks and normalises (lower case, no trailing dot or
// slash) the allowed browser origins and Host names.
func (s *Security) validateBrowsers(errs *configErrors) {
	for i, o := range s.AllowOrigins {
		u, err := url.Parse(o)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
			strings.TrimSuffix(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" {
			errs.bad("allow-origin", "%q is not an origin (scheme://host[:port], e.g. https://admin.example)", o)
			continue
		}
		s.AllowOrigins[i] = strings.ToLower(u.Scheme + "://" + u.Host)
	}
	for i, h := range s.AllowHosts {
		if !validHost(h) {
			errs.bad("allow-host", "%q is not a host name or an IP (no port, no scheme)", h)
			continue
		}
		s.AllowHosts[i] = strings.ToLower(strings.TrimSuffix(strings.Trim(h, "[]"), "."))
	}
}
