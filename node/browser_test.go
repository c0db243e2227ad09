package node_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/node"
)

// rawRequest sends one request with exactly the headers given (Host
// included, when set) and returns the status and body.
func rawRequest(t *testing.T, method, u, body string, header map[string]string) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, readAll(t, resp)
}

// TestBrowserRequestsRefused: what a web page can make a browser send is
// refused and changes nothing, on a real node with the documented
// loopback default (no API token). Input, the reproducer: a POST
// /v1/rows with Content-Type text/plain and Origin http://evil.example
// (what a browser sends cross-site without a preflight), the same shape
// on the purge route, and requests with Host evil.example (DNS
// rebinding). The console's own calls (same origin, JSON) and clients'
// calls still work, and --allow-origin / --allow-host admit what they
// list.
func TestBrowserRequestsRefused(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(c *node.Config) {
		c.AllowOrigins = []string{"https://admin.example"}
		c.AllowHosts = []string{"fairshard.internal"}
	})
	host := strings.TrimPrefix(n.base, "http://")
	tg := newTarget(t)
	tg.SetStatus(http.StatusServiceUnavailable)
	n.setTarget("dl", "default", tg.URL())
	n.mustDo(http.MethodPut, "/v1/namespaces/dl", map[string]any{"retry": map[string]any{"max_attempts": 1}}, http.StatusOK, nil)
	n.appendRows(rowIn{"dispatch_key": "dead-1", "namespace": "dl"})
	n.waitStatus("dead-1", "failed", 10*time.Second)
	n.appendRows(rowIn{"dispatch_key": "kept-1", "namespace": "open", "payload": map[string]any{"p": "private-payload-91"}})

	rowBody := `{"rows":[{"dispatch_key":"evil-1","namespace":"open"}]}`
	evil := map[string]string{"Content-Type": "text/plain", "Origin": "http://evil.example"}
	for _, c := range []struct {
		name, method, path, body string
		header                   map[string]string
		status                   int
		code, field              string
	}{
		{"reproducer: cross-site text/plain append", "POST", "/v1/rows", rowBody, evil, 403, api.CodeCrossSite, "Origin"},
		{"reproducer: cross-site text/plain purge", "POST", "/v1/namespaces/dl/dead-letters/purge", "", evil, 403, api.CodeCrossSite, "Origin"},
		{"text/plain append without Origin", "POST", "/v1/rows", rowBody, map[string]string{"Content-Type": "text/plain"}, 415, api.CodeUnsupportedMediaType, "Content-Type"},
		{"purge without a type", "POST", "/v1/namespaces/dl/dead-letters/purge", "", nil, 415, api.CodeUnsupportedMediaType, "Content-Type"},
		{"JSON append marked cross-site", "POST", "/v1/rows", rowBody,
			map[string]string{"Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403, api.CodeCrossSite, "Sec-Fetch-Site"},
		{"reproducer: Host evil.example, append", "POST", "/v1/rows", rowBody,
			map[string]string{"Content-Type": "application/json", "Host": "evil.example:" + strings.Split(host, ":")[1]}, 421, api.CodeMisdirected, "Host"},
		{"reproducer: Host evil.example, read", "GET", "/v1/rows/kept-1", "", map[string]string{"Host": "evil.example"}, 421, api.CodeMisdirected, "Host"},
		{"Host evil.example, internal read", "GET", "/internal/v1/rows/kept-1", "", map[string]string{"Host": "evil.example"}, 421, api.CodeMisdirected, "Host"},
	} {
		st, b := rawRequest(t, c.method, n.base+c.path, c.body, c.header)
		wantError(t, st, b, c.status, c.code, c.field)
		if strings.Contains(string(b), "private-payload-91") {
			t.Errorf("%s: the answer carries the row's payload", c.name)
		}
	}
	wantNotStored(t, n, "evil-1")
	if r, ok := n.getRow("dead-1"); !ok || r.Status != "failed" {
		t.Errorf("dead-1 after the refused purge: %+v (found %v), want still a dead letter", r, ok)
	}

	// What the console sends (same origin, JSON, bodiless POST included),
	// what curl sends, an allowed origin and an allowed Host pass.
	console := map[string]string{"Content-Type": "application/json", "Origin": n.base, "Sec-Fetch-Site": "same-origin"}
	for _, c := range []struct {
		name, method, path, body string
		header                   map[string]string
	}{
		{"console append", "POST", "/v1/rows", `{"rows":[{"dispatch_key":"console-1","namespace":"open"}]}`, console},
		{"console redrive, no body", "POST", "/v1/namespaces/dl/dead-letters/redrive", "", console},
		{"curl append", "POST", "/v1/rows", `{"rows":[{"dispatch_key":"curl-1","namespace":"open"}]}`, map[string]string{"Content-Type": "application/json"}},
		{"allowed origin", "PUT", "/v1/namespaces/open", `{"max_in_flight":5}`,
			map[string]string{"Content-Type": "application/json", "Origin": "https://admin.example", "Sec-Fetch-Site": "cross-site"}},
		{"allowed host", "GET", "/v1/rows/kept-1", "", map[string]string{"Host": "fairshard.internal"}},
		{"localhost", "GET", "/v1/cluster", "", map[string]string{"Host": "localhost:8080"}},
	} {
		if st, b := rawRequest(t, c.method, n.base+c.path, c.body, c.header); st/100 != 2 {
			t.Errorf("%s: HTTP %d %.300s, want it served", c.name, st, b)
		}
	}
	for _, k := range []string{"console-1", "curl-1"} {
		if _, ok := n.getRow(k); !ok {
			t.Errorf("%s was not stored", k)
		}
	}
}

// TestBrowserChecksWithAToken: with --api-token any Host is served (a
// page cannot send the token), but a cross-site write is still refused
// and a write still needs its JSON type.
func TestBrowserChecksWithAToken(t *testing.T) {
	t.Parallel()
	const token = "browser-token-0123"
	n := startNode(t, func(c *node.Config) { c.APIToken = token })
	auth := "Bearer " + token
	if st, b := rawRequest(t, "GET", n.base+"/v1/cluster", "", map[string]string{"Host": "fairshard.example", "Authorization": auth}); st != http.StatusOK {
		t.Errorf("GET with the token and Host fairshard.example: HTTP %d %.200s, want 200", st, b)
	}
	st, b := rawRequest(t, "POST", n.base+"/v1/rows", `{"rows":[{"dispatch_key":"t-1"}]}`,
		map[string]string{"Content-Type": "application/json", "Origin": "http://evil.example", "Authorization": auth})
	wantError(t, st, b, http.StatusForbidden, api.CodeCrossSite, "Origin")
	st, b = rawRequest(t, "POST", n.base+"/v1/rows", `{"rows":[{"dispatch_key":"t-1"}]}`,
		map[string]string{"Content-Type": "text/plain", "Authorization": auth})
	wantError(t, st, b, http.StatusUnsupportedMediaType, api.CodeUnsupportedMediaType, "Content-Type")
	wantNotStored(t, n, "t-1")
}
