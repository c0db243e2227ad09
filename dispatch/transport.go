package dispatch

import (
	"net"
	"net/http"
	"time"
)

// newTransport builds the dispatcher's shared HTTP transport: keep-alive
// connections reused across rows, HTTP/2 when the target offers it, the
// HTTP_PROXY/HTTPS_PROXY/NO_PROXY environment honoured.
//
// It does not decide how many requests go to a host: the planner claims
// only what a host's adaptive limit has slots for (HostLimits), and a
// namespace below its share of a full host may add up to the limit again.
// So the connection cap is twice MaxConnsPerHost, a bound the planner
// never reaches: no claimed row ever waits here for a connection (it
// would wait inside its delivery timeout). Dialling has no timeout of its
// own: the attempt's connect timer bounds it (wireClock). The dial goes
// through the egress policy (Config.Egress, package egress: checked on the
// address dialled, after DNS).
func newTransport(cfg Config) *http.Transport {
	return &http.Transport{
		Proxy: http.ProxyFromEnvironment,
		// The egress policy judges the address actually dialled, after
		// DNS, so a name cannot re-resolve past it.
		DialContext:           cfg.Egress.DialContext(&net.Dialer{KeepAlive: 30 * time.Second}),
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          0, // no global cap; per host below
		MaxIdleConnsPerHost:   2 * cfg.MaxConnsPerHost,
		MaxConnsPerHost:       2 * cfg.MaxConnsPerHost,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}
