// Package webui is fairshard's web console: static files (HTML, CSS,
// JavaScript; no framework, no build step, nothing from a CDN) embedded in
// the binary and served under /ui/ on every node. The page reads and acts
// through the node's public /v1 API with the API token the operator types
// (kept in the tab's session storage), so it has no access of its own: the
// files carry no data and are served without the token.
//
// Every answer carries a strict Content-Security-Policy (scripts, styles
// and connections from the node itself only; no inline script or style,
// no framing), nosniff and no-referrer.
package webui

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// ContentSecurityPolicy is the policy every console answer carries.
const ContentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; " +
	"connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"

// Prefix is the path the console is served under.
const Prefix = "/ui/"

// Handler serves the console's files under Prefix (GET and HEAD; the
// caller routes only those methods here).
func Handler() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic("webui: embedded files missing: " + err.Error()) // a build error, not a runtime one
	}
	files := http.StripPrefix(Prefix, http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", ContentSecurityPolicy)
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}
