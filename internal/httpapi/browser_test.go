package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/httperr"
)

// TestBrowserGuard: what a page can make a browser send is refused before
// any handler runs (the reproducer's shapes: a text/plain POST with a foreign
// Origin, Sec-Fetch-Site cross-site, a rebound Host), and what clients
// and the node's own console send passes.
func TestBrowserGuard(t *testing.T) {
	served := 0
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served++ })
	ownHosts := map[string]bool{"node-1.internal": true}
	noToken := browserGuard(BrowserPolicy{AllowedOrigins: []string{"https://admin.example"}, HostAllowed: func(h string) bool { return ownHosts[h] }}, next)
	withToken := browserGuard(BrowserPolicy{}, next)
	type tc struct {
		name             string
		h                http.Handler
		method, host     string
		path             string
		header           map[string]string
		status           int
		code, errorField string
	}
	jsonType := map[string]string{"Content-Type": "application/json"}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{"Content-Type": "application/json"}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	cases := []tc{
		{"reproducer: text/plain POST from evil.example", noToken, "POST", "127.0.0.1:8080", "/v1/rows",
			map[string]string{"Content-Type": "text/plain", "Origin": "http://evil.example"}, 403, api.CodeCrossSite, "Origin"},
		{"text/plain POST, no Origin", noToken, "POST", "127.0.0.1:8080", "/v1/rows",
			map[string]string{"Content-Type": "text/plain"}, 415, api.CodeUnsupportedMediaType, "Content-Type"},
		{"form POST", noToken, "POST", "127.0.0.1:8080", "/v1/namespaces/a/dead-letters/purge",
			map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, api.CodeUnsupportedMediaType, "Content-Type"},
		{"bodiless POST without a type (no-cors fetch)", noToken, "POST", "127.0.0.1:8080", "/v1/namespaces/a/dead-letters/purge",
			nil, 415, api.CodeUnsupportedMediaType, "Content-Type"},
		{"PUT without a type", noToken, "PUT", "127.0.0.1:8080", "/v1/workflows/w/hold", nil, 415, api.CodeUnsupportedMediaType, "Content-Type"},
		{"Sec-Fetch-Site cross-site", noToken, "POST", "127.0.0.1:8080", "/v1/rows",
			with(map[string]string{"Sec-Fetch-Site": "cross-site"}), 403, api.CodeCrossSite, "Sec-Fetch-Site"},
		{"Sec-Fetch-Site same-site (another port)", noToken, "POST", "127.0.0.1:8080", "/v1/rows",
			with(map[string]string{"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:3000"}), 403, api.CodeCrossSite, "Sec-Fetch-Site"},
		{"Origin null", noToken, "DELETE", "127.0.0.1:8080", "/v1/workflows/w/hold",
			map[string]string{"Origin": "null"}, 403, api.CodeCrossSite, "Origin"},
		{"reproducer: Host evil.example (DNS rebinding)", noToken, "GET", "evil.example:8080", "/v1/rows/k", nil, 421, api.CodeMisdirected, "Host"},
		{"rebinding to an internal route", noToken, "GET", "evil.example:8080", "/internal/v1/rows/k", nil, 421, api.CodeMisdirected, "Host"},
		{"internal write as text/plain", noToken, "POST", "127.0.0.1:8080", "/internal/v1/rows/cancel",
			map[string]string{"Content-Type": "text/plain"}, 415, api.CodeUnsupportedMediaType, "Content-Type"},
		// Passing.
		{"curl with JSON", noToken, "POST", "127.0.0.1:8080", "/v1/rows", jsonType, 200, "", ""},
		{"JSON with charset", noToken, "POST", "localhost:8080", "/v1/rows", map[string]string{"Content-Type": "application/json; charset=utf-8"}, 200, "", ""},
		{"the console, same origin", noToken, "POST", "127.0.0.1:8080", "/v1/rows/cancel",
			with(map[string]string{"Origin": "http://127.0.0.1:8080", "Sec-Fetch-Site": "same-origin"}), 200, "", ""},
		{"an allowed origin", noToken, "PUT", "127.0.0.1:8080", "/v1/namespaces/a",
			with(map[string]string{"Origin": "https://admin.example", "Sec-Fetch-Site": "cross-site"}), 200, "", ""},
		{"DELETE needs no type", noToken, "DELETE", "127.0.0.1:8080", "/v1/workflows/w/hold", nil, 200, "", ""},
		{"GET needs nothing", noToken, "GET", "[::1]:8080", "/v1/cluster", nil, 200, "", ""},
		{"the node's own name", noToken, "GET", "node-1.internal:8080", "/v1/cluster", nil, 200, "", ""},
		{"a member's signed call", noToken, "POST", "node-1.internal:8080", "/internal/v1/replication/merge",
			map[string]string{"Content-Type": "application/x-fairshard-rows"}, 200, "", ""},
		{"with a token any Host", withToken, "GET", "evil.example:8080", "/v1/cluster", nil, 200, "", ""},
		{"with a token still no cross-site writes", withToken, "POST", "127.0.0.1:8080", "/v1/rows",
			with(map[string]string{"Origin": "http://evil.example"}), 403, api.CodeCrossSite, "Origin"},
	}
	for _, c := range cases {
		served = 0
		req := httptest.NewRequest(c.method, "http://"+c.host+c.path, strings.NewReader(`{"rows":[{"dispatch_key":"k"}]}`))
		req.Host = c.host
		for k, v := range c.header {
			req.Header.Set(k, v)
		}
		rec := httptest.NewRecorder()
		c.h.ServeHTTP(rec, req)
		if c.status == 200 {
			if rec.Code != 200 || served != 1 {
				t.Errorf("%s: HTTP %d, handler called %d times; want it served: %s", c.name, rec.Code, served, rec.Body)
			}
			continue
		}
		var e struct {
			Error httperr.Error `json:"error"`
		}
		_ = json.Unmarshal(rec.Body.Bytes(), &e)
		if rec.Code != c.status || served != 0 || e.Error.Code != c.code || e.Error.Field != c.errorField {
			t.Errorf("%s: HTTP %d code %q field %q (handler called %d times); want %d %q naming %q: %s",
				c.name, rec.Code, e.Error.Code, e.Error.Field, served, c.status, c.code, c.errorField, rec.Body)
		}
	}
}
