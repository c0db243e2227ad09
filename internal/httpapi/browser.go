package httpapi

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path"
	"strings"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/httperr"
	"github.com/fairshard/fairshard/nodeauth"
)

// Requests a web browser sends on a page's behalf. A page on any site can
// make a browser POST to a node without a CORS preflight when the request
// is "simple": no body or a text/plain, form or multipart body, no custom
// header. With DNS rebinding (a name of the attacker's resolving to
// 127.0.0.1) the page even reads the answers, the node being the page's
// own origin. The API carries no cookie, so a page cannot send the API
// token; without a token, these checks are all that keeps a page out.
//
//   - A write (POST, PUT, PATCH) on /v1 must carry Content-Type
//     application/json, body or not: a browser sends that type only after
//     a preflight the node never answers (415 unsupported_media_type,
//     field Content-Type). Any other write (node-to-node routes) must
//     carry a type a page cannot send without a preflight.
//   - A write (DELETE too) that a browser marks cross-site (Sec-Fetch-Site
//     cross-site or same-site, or an Origin that is not the request's own
//     host) is refused unless its Origin is allowed (--allow-origin): 403
//     cross_site, field Origin or Sec-Fetch-Site.
//   - Without an API token, a request whose Host is not a loopback name,
//     one of the node's own addresses or an allowed host (--allow-host)
//     is refused, whatever its path: 421 misdirected, field Host. That is
//     what DNS rebinding sends.
//
// Clients that are not browsers (curl, the Go client, other nodes) send
// no Origin and no Sec-Fetch-* headers; they only need the Content-Type.

// BrowserPolicy is the API's defence against requests a web page makes a
// browser send (see above).
type BrowserPolicy struct {
	// AllowedOrigins are the origins ("https://admin.example", scheme,
	// host and port, lower case) whose cross-site writes are served
	// (--allow-origin). The node's own origin never needs listing.
	AllowedOrigins []string
	// HostAllowed reports whether a request's Host (its host part,
	// without port, lower case, IPv6 without brackets) is served beside
	// loopback names ("localhost", loopback IPs), which always are; nil:
	// every Host (a node with an API token: a page cannot send it).
	HostAllowed func(host string) bool
}

// isWrite reports whether method may change state.
func isWrite(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return false
	}
	return true
}

// needsJSON reports whether a request of method on a /v1 path must carry
// Content-Type application/json.
func needsJSON(method string) bool {
	return method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch
}

// browserGuard applies p before next.
func browserGuard(p BrowserPolicy, next http.Handler) http.Handler {
	allowed := map[string]bool{}
	for _, o := range p.AllowedOrigins {
		allowed[strings.ToLower(strings.TrimSuffix(o, "/"))] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p.HostAllowed != nil {
			if host := RequestHost(r.Host); !loopbackName(host) && !p.HostAllowed(host) {
				writeError(w, &httperr.Error{Status: http.StatusMisdirectedRequest, Code: api.CodeMisdirected, Field: "Host",
					Message: fmt.Sprintf("Host: %.100q is not a name of this node: without --api-token it serves only loopback names, its own addresses and --allow-host (a page reaching it through DNS rebinding sends its own name)", host)})
				return
			}
		}
		if !isWrite(r.Method) {
			next.ServeHTTP(w, r)
			return
		}
		if err := crossSite(r, allowed); err != nil {
			writeError(w, err)
			return
		}
		if err := checkContentType(r); err != nil {
			writeError(w, err)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// crossSite refuses a write a browser sent for another site: nil when the
// request carries no browser marks, its Origin is its own host, or its
// Origin is allowed.
func crossSite(r *http.Request, allowed map[string]bool) *httperr.Error {
	origin := strings.ToLower(r.Header.Get("Origin"))
	if origin != "" && allowed[origin] {
		return nil
	}
	switch site := r.Header.Get("Sec-Fetch-Site"); site {
	case "cross-site", "same-site":
		return &httperr.Error{Status: http.StatusForbidden, Code: api.CodeCrossSite, Field: "Sec-Fetch-Site",
			Message: fmt.Sprintf("Sec-Fetch-Site: %s: a write sent by a web page of another site is refused (allow its origin with --allow-origin)", site)}
	}
	if origin == "" {
		return nil
	}
	if u, err := url.Parse(origin); err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" &&
		u.Path == "" && sameHost(stripDefaultPort(u.Scheme, u.Host), r.Host) {
		return nil
	}
	return &httperr.Error{Status: http.StatusForbidden, Code: api.CodeCrossSite, Field: "Origin",
		Message: fmt.Sprintf("Origin: %.100q is not this node (Host %.100q): a write sent by a web page of another site is refused (allow its origin with --allow-origin)", origin, r.Host)}
}

// sameHost compares an origin's host[:port] with a request's Host, a
// default port on either side ignored.
func sameHost(originHost, host string) bool {
	host = strings.ToLower(host)
	return originHost == host || originHost == strings.TrimSuffix(strings.TrimSuffix(host, ":80"), ":443")
}

func stripDefaultPort(scheme, host string) string {
	switch {
	case scheme == "http" && strings.HasSuffix(host, ":80"):
		return strings.TrimSuffix(host, ":80")
	case scheme == "https" && strings.HasSuffix(host, ":443"):
		return strings.TrimSuffix(host, ":443")
	}
	return host
}

// corsSafelisted are the media types a page may send without a preflight.
var corsSafelisted = map[string]bool{"text/plain": true, "application/x-www-form-urlencoded": true, "multipart/form-data": true}

// checkContentType requires application/json on /v1 writes, and a type a
// page cannot send without a preflight on any other write.
func checkContentType(r *http.Request) *httperr.Error {
	ct := r.Header.Get("Content-Type")
	mt, _, err := mime.ParseMediaType(ct)
	mt = strings.ToLower(mt)
	switch p := path.Clean("/" + r.URL.Path); {
	case nodeauth.Guarded(r.URL.Path):
		if ct == "" || err != nil || corsSafelisted[mt] {
			return &httperr.Error{Status: http.StatusUnsupportedMediaType, Code: api.CodeUnsupportedMediaType, Field: "Content-Type",
				Message: fmt.Sprintf("Content-Type: %.100q: a node-to-node write carries application/json or application/x-fairshard-rows", ct)}
		}
	case p == "/v1" || strings.HasPrefix(p, "/v1/"):
		if needsJSON(r.Method) && (err != nil || mt != "application/json") {
			return &httperr.Error{Status: http.StatusUnsupportedMediaType, Code: api.CodeUnsupportedMediaType, Field: "Content-Type",
				Message: fmt.Sprintf("Content-Type: %.100q: every %s on /v1 must be application/json, with or without a body (a type a web page cannot send without a preflight)", ct, r.Method)}
		}
	}
	return nil
}

// loopbackName reports whether host is "localhost" or a loopback IP.
func loopbackName(host string) bool {
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.Unmap().IsLoopback()
}

// RequestHost is the host part of a request's Host header, lower case,
// without port and without an IPv6 address's brackets.
func RequestHost(hostport string) string {
	h := hostport
	if host, _, err := net.SplitHostPort(hostport); err == nil {
		h = host
	}
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.ToLower(strings.TrimSuffix(h, "."))
}
