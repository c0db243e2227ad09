package node

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/httpapi"
	"github.com/fairshard/fairshard/internal/tick"
)

// HTTP server limits against slow and idle clients; the read and idle
// timeouts are flags (--http-read-timeout, 60 s: a 64 MiB handoff batch at
// 2 MiB/s fits; --http-idle-timeout, 2 min).
const (
	// HTTPReadHeaderTimeout bounds reading a request's headers.
	HTTPReadHeaderTimeout = 10 * time.Second
	// HTTPWriteTimeout bounds a request from its headers to the end of
	// the answer (reads, the store's commit, peers' fan-out).
	HTTPWriteTimeout = 2 * time.Minute
	// HTTPMaxHeaderBytes bounds a request's headers.
	HTTPMaxHeaderBytes = 64 << 10
)

// newHTTPServer is the API's server with the limits above.
func newHTTPServer(h http.Handler, cfg Config) *http.Server {
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: min(HTTPReadHeaderTimeout, cfg.HTTPReadTimeout),
		ReadTimeout:       cfg.HTTPReadTimeout,
		WriteTimeout:      max(HTTPWriteTimeout, cfg.HTTPReadTimeout),
		IdleTimeout:       cfg.HTTPIdleTimeout,
		MaxHeaderBytes:    HTTPMaxHeaderBytes,
	}
}

// Modes of the node-to-node routes (/internal/), api.Security's
// InternalRoutes.
const (
	// internalSigned: calls signed with the cluster secret, both ways.
	internalSigned = "cluster_secret"
	// internalSelfOnly: --api-token without a cluster secret: the routes
	// verify a secret this process drew at start and never shares, so
	// they answer nobody (the node serves its own reads locally) and the
	// token cannot be bypassed through them.
	internalSelfOnly = "this_node_only"
	// internalOpen: no credential at all (no API token, no cluster
	// secret): the routes are as open as /v1, to whoever reaches the
	// port (loopback unless --insecure); the browser checks of /v1 apply.
	internalOpen = "open"
)

// nodeSecret is the secret node-to-node calls are signed with: the
// cluster secret; without one, when an API token guards /v1, a fresh
// per-process secret (ownSecret), so that /internal/ is never the way
// around the token; else "" (no credentials at all). Validate refuses
// --api-token with --join and no cluster secret, so a node with its own
// secret is never started to join others.
func (n *Node) nodeSecret() string {
	if n.cfg.ClusterSecret != "" {
		return n.cfg.ClusterSecret
	}
	if n.cfg.APIToken == "" {
		return ""
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go ≥ 1.24)
	n.ownSecret = true
	return hex.EncodeToString(b)
}

// insecureWarnEvery is how often an unprotected node repeats its warning.
const insecureWarnEvery = time.Hour

func (n *Node) initSecurity(reg prometheus.Registerer) error {
	n.security = api.Security{
		InsecureFlag: n.cfg.Insecure, NodeAuth: n.cfg.ClusterSecret != "",
		GossipEncrypted: len(n.cfg.GossipKeys) > 0, Exposed: n.cfg.ExposedAddrs(),
	}
	// One fact behind /v1/cluster, fairshard_insecure and the warning.
	n.security.Insecure = !n.security.NodeAuth || !n.security.GossipEncrypted
	switch {
	case n.cfg.ClusterSecret != "":
		n.security.InternalRoutes = internalSigned
	case n.ownSecret:
		n.security.InternalRoutes = internalSelfOnly
	default:
		n.security.InternalRoutes = internalOpen
	}
	if n.cfg.PprofAddr != "" {
		if host, _, err := net.SplitHostPort(n.cfg.PprofAddr); err == nil && !loopbackHost(host) {
			n.security.Exposed = append(n.security.Exposed, "--pprof-addr "+n.cfg.PprofAddr)
		}
	}
	if n.security.Exposed == nil {
		n.security.Exposed = []string{}
	}
	g := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "fairshard_insecure",
		Help: "1 when this node runs without node-to-node authentication (--cluster-secret) or without gossip encryption (--gossip-key): allowed on loopback or with --insecure.",
	}, func() float64 {
		if n.security.Insecure {
			return 1
		}
		return 0
	})
	return reg.Register(g)
}

// warnInsecure logs, at start and every hour, what an unprotected node
// leaves open.
func (n *Node) warnInsecure(ctx context.Context) error {
	s := n.security
	if !s.Insecure {
		return nil
	}
	warn := func() {
		n.log.Warn("INSECURE: node-to-node calls or gossip are not protected; anyone who reaches these ports can join, read and change rows",
			"insecure_flag", s.InsecureFlag, "node_auth", s.NodeAuth, "gossip_encrypted", s.GossipEncrypted,
			"exposed", s.Exposed, "fix", "set --cluster-secret and --gossip-key (docs/operations.md \"Security\")")
	}
	warn()
	return tick.Every(ctx, insecureWarnEvery, func(context.Context) { warn() })
}

// browserPolicy is the API's defence against requests web pages make
// browsers send (httpapi.BrowserPolicy): --allow-origin, and without an
// API token the Hosts served beside loopback names: the node's own
// listen and advertised hosts (every interface address when it listens
// on all of them) and --allow-host.
func (n *Node) browserPolicy() httpapi.BrowserPolicy {
	p := httpapi.BrowserPolicy{AllowedOrigins: n.cfg.AllowOrigins}
	if n.cfg.APIToken != "" {
		return p
	}
	names := map[string]bool{}
	for _, hp := range []string{n.cfg.HTTPAddr, n.cfg.AdvertiseHTTP, n.serving.addr, n.serving.ln.Addr().String()} {
		if h := httpapi.RequestHost(hp); h != "" {
			names[h] = true
		}
	}
	for _, h := range n.cfg.AllowHosts {
		names[h] = true
	}
	everyInterface := false
	if h := httpapi.RequestHost(n.cfg.HTTPAddr); h == "" {
		everyInterface = true
	} else if ip, err := netip.ParseAddr(h); err == nil && ip.IsUnspecified() {
		everyInterface = true
	}
	ifaces := &interfaceAddrs{}
	p.HostAllowed = func(host string) bool {
		if names[host] {
			return true
		}
		ip, err := netip.ParseAddr(host)
		if err != nil {
			return false
		}
		return everyInterface && ifaces.has(ip.Unmap())
	}
	return p
}

// interfaceAddrs caches the host's interface addresses for a few seconds.
type interfaceAddrs struct {
	mu    sync.Mutex
	at    time.Time
	addrs map[netip.Addr]bool
}

func (c *interfaceAddrs) has(ip netip.Addr) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.at) > 5*time.Second {
		c.addrs, c.at = map[netip.Addr]bool{}, time.Now()
		if as, err := net.InterfaceAddrs(); err == nil {
			for _, a := range as {
				if pn, ok := a.(*net.IPNet); ok {
					if x, ok := netip.AddrFromSlice(pn.IP); ok {
						c.addrs[x.Unmap()] = true
					}
				}
			}
		}
	}
	return c.addrs[ip]
}
