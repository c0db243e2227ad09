package nodeauth_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshard/fairshard/nodeauth"
)

var (
	secretA = []byte("cluster-secret-A-0123456789")
	secretB = []byte("cluster-secret-B-0123456789")
)

func mustAuth(t *testing.T, cfg nodeauth.Config) *nodeauth.Auth {
	t.Helper()
	a, err := nodeauth.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// node is a real HTTP server on loopback whose /internal/ routes are
// guarded by auth; it records what its handler saw.
type node struct {
	srv   *httptest.Server
	mu    sync.Mutex
	calls []string // "METHOD path body"
}

func newNode(t *testing.T, auth *nodeauth.Auth) *node {
	n := &node{}
	mux := http.NewServeMux()
	record := func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		n.mu.Lock()
		n.calls = append(n.calls, r.Method+" "+r.URL.Path+" "+string(b))
		n.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]string{"got": string(b)})
	}
	mux.HandleFunc("POST /internal/v1/handoff", record)
	mux.HandleFunc("GET /internal/v1/rows/{key...}", record)
	mux.HandleFunc("GET /v1/cluster", record)
	n.srv = httptest.NewServer(auth.Middleware(mux))
	t.Cleanup(n.srv.Close)
	return n
}

func (n *node) seen() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]string(nil), n.calls...)
}

func post(c *http.Client, url, body string) (int, string, error) {
	resp, err := c.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestBothWays: a member's signed call reaches the handler and its signed
// answer is accepted; the same call from a process with another secret,
// or with none, or with the API's bearer token, is refused 401 before the
// handler; and a member refuses the answer of an address that does not
// hold the secret, without sending it the body.
func TestBothWays(t *testing.T) {
	a := mustAuth(t, nodeauth.Config{Secrets: [][]byte{secretA}})
	member := newNode(t, a)
	client := a.Client(nil, 5*time.Second)

	st, body, err := post(client, member.srv.URL+"/internal/v1/handoff", `{"rows":[1]}`)
	if err != nil || st != 200 || !strings.Contains(body, `{\"rows\":[1]}`) {
		t.Fatalf("member to member: %d %q %v", st, body, err)
	}
	if got := member.seen(); len(got) != 1 || got[0] != `POST /internal/v1/handoff {"rows":[1]}` {
		t.Fatalf("handler saw %q", got)
	}
	// An escaped key with a slash and a space round-trips the signature.
	resp, err := client.Get(member.srv.URL + "/internal/v1/rows/a%2Fb%20c?x=1")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET escaped key: %v %v", resp, err)
	}
	resp.Body.Close()

	// Callers without the secret.
	other := mustAuth(t, nodeauth.Config{Secrets: [][]byte{secretB}})
	before := len(member.seen())
	if _, _, err := post(other.Client(nil, 5*time.Second), member.srv.URL+"/internal/v1/handoff", `{}`); !errors.Is(err, nodeauth.ErrRefused) && !errors.Is(err, nodeauth.ErrPeerUnproven) {
		t.Errorf("another secret: err %v, want a refusal", err)
	}
	for _, authz := range []string{"", "Bearer " + string(secretA)} {
		req, _ := http.NewRequest("POST", member.srv.URL+"/internal/v1/handoff", strings.NewReader(`{"rows":[2]}`))
		if authz != "" {
			req.Header.Set("Authorization", authz)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 401 || !strings.Contains(string(b), `"code":"unauthorized"`) {
			t.Errorf("unsigned call (Authorization %q): %d %s, want 401 unauthorized", authz, resp.StatusCode, b)
		}
	}
	// A path that cleans to /internal/ is guarded too.
	req, _ := http.NewRequest("GET", member.srv.URL+"/internal/v1/rows/k", nil)
	req.URL.Path = "/v1/../internal/v1/rows/k"
	if resp, err := http.DefaultClient.Do(req); err == nil {
		if resp.StatusCode == 200 {
			t.Errorf("GET /v1/../internal/v1/rows/k unsigned: 200")
		}
		resp.Body.Close()
	}
	if got := len(member.seen()); got != before {
		t.Errorf("handler ran %d times for refused calls", got-before)
	}
	// Public routes pass through.
	if resp, err := http.Get(member.srv.URL + "/v1/cluster"); err != nil || resp.StatusCode != 200 || resp.Header.Get(nodeauth.HeaderResponse) != "" {
		t.Errorf("public route: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// The callee is authenticated: an impostor (no secret, or another one)
	// answering 200 gets no body and the caller an error.
	var impostorBodies atomic.Int64
	impostor := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if len(b) > 0 {
			impostorBodies.Add(1)
		}
		w.WriteHeader(200)
		_, _ = w.Write([]byte(`{"created":1}`))
	}))
	defer impostor.Close()
	otherMember := newNode(t, other)
	for _, u := range []string{impostor.URL, otherMember.srv.URL} {
		_, _, err := post(client, u+"/internal/v1/handoff", `{"rows":["secret payload"]}`)
		if !nodeauth.IsAuthError(err) {
			t.Errorf("POST to %s: err %v, want the peer unproven", u, err)
		}
		if resp, err := client.Get(u + "/internal/v1/rows/k"); err == nil || !nodeauth.IsAuthError(err) {
			t.Errorf("GET from %s: %v %v, want the answer refused", u, resp, err)
		}
	}
	if n := impostorBodies.Load(); n != 0 {
		t.Errorf("the impostor received %d bodies; want none (challenge first)", n)
	}
	if got := otherMember.seen(); len(got) != 0 {
		t.Errorf("a node with another secret ran its handler for %q", got)
	}
}

// capture is a RoundTripper that records the signed request it forwards.
type capture struct {
	base http.RoundTripper
	req  *http.Request
	body []byte
}

func (c *capture) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.URL.Path != nodeauth.PathChallenge {
		c.req = r.Clone(r.Context())
		c.body, _ = io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(c.body))
	}
	return c.base.RoundTrip(r)
}

// TestReplayTamperClock: a captured signed request sent again is refused
// (nonce seen), so is one with its body changed, and one signed by a clock
// outside the window; a rotation's second secret verifies.
func TestReplayTamperClock(t *testing.T) {
	a := mustAuth(t, nodeauth.Config{Secrets: [][]byte{secretA}})
	member := newNode(t, a)
	cp := &capture{base: http.DefaultTransport}
	client := &http.Client{Transport: a.Transport(cp)}
	if st, _, err := post(client, member.srv.URL+"/internal/v1/handoff", `{"rows":["x"]}`); err != nil || st != 200 {
		t.Fatalf("first call: %d %v", st, err)
	}
	resend := func(body []byte) (int, string) {
		req, _ := http.NewRequest(cp.req.Method, cp.req.URL.String(), bytes.NewReader(body))
		req.Header = cp.req.Header.Clone()
		resp, err := http.DefaultTransport.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, b := resend(cp.body); st != 401 || !strings.Contains(b, "replayed") {
		t.Errorf("replay: %d %s, want 401 replayed", st, b)
	}
	if n := len(member.seen()); n != 1 {
		t.Errorf("handler calls %d, want 1", n)
	}

	// Body tampering: a transport that alters the body after signing.
	tamper := &http.Client{Transport: a.Transport(rtFunc(func(r *http.Request) (*http.Response, error) {
		if r.URL.Path != nodeauth.PathChallenge {
			r.Body = io.NopCloser(strings.NewReader(`{"rows":["evil"]}`))
			r.ContentLength = int64(len(`{"rows":["evil"]}`))
		}
		return http.DefaultTransport.RoundTrip(r)
	}))}
	if _, _, err := post(tamper, member.srv.URL+"/internal/v1/handoff", `{"rows":["z"]}`); !errors.Is(err, nodeauth.ErrRefused) {
		t.Errorf("tampered body: %v, want refused", err)
	}
	// Clock skew beyond the window.
	skewed := mustAuth(t, nodeauth.Config{Secrets: [][]byte{secretA}, Now: func() time.Time { return time.Now().Add(-2 * nodeauth.DefaultWindow) }})
	if _, _, err := post(skewed.Client(nil, 0), member.srv.URL+"/internal/v1/handoff", `{}`); !errors.Is(err, nodeauth.ErrRefused) {
		t.Errorf("skewed clock: %v, want refused", err)
	}
	if n := len(member.seen()); n != 1 {
		t.Errorf("handler calls %d after refused ones, want 1", n)
	}
	// Rotation: a node verifying with [B, A] accepts A-signed calls and
	// its B-signed answers are accepted by a node holding [A, B].
	rot := newNode(t, mustAuth(t, nodeauth.Config{Secrets: [][]byte{secretB, secretA}}))
	old := mustAuth(t, nodeauth.Config{Secrets: [][]byte{secretA, secretB}})
	if st, _, err := post(old.Client(nil, 0), rot.srv.URL+"/internal/v1/handoff", `{}`); err != nil || st != 200 {
		t.Errorf("rotation: %d %v", st, err)
	}
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestNilAndBadConfig: a nil Auth is the insecure mode (no-op); short or
// missing secrets are refused.
func TestNilAndBadConfig(t *testing.T) {
	var a *nodeauth.Auth
	h := http.NotFoundHandler()
	if got := a.Middleware(h); got == nil {
		t.Error("nil Middleware returned nil")
	}
	if a.Transport(nil) != http.DefaultTransport {
		t.Error("nil Transport is not the base")
	}
	if _, err := nodeauth.New(nodeauth.Config{}); err == nil {
		t.Error("no secret accepted")
	}
	if _, err := nodeauth.New(nodeauth.Config{Secrets: [][]byte{[]byte("short")}}); err == nil {
		t.Error("a 5-byte secret accepted")
	}
}

// TestBodyOverTheLimit: a signed body one byte over MaxBodyBytes is refused
// 413 too_large before the handler runs, whether its length is declared or
// only found by reading; a smaller one passes (its echoed answer, bounded
// by the same limit, must fit too).
func TestBodyOverTheLimit(t *testing.T) {
	const limit = 1024
	a := mustAuth(t, nodeauth.Config{Secrets: [][]byte{secretA}, MaxBodyBytes: limit})
	member := newNode(t, a)
	client := a.Client(nil, 5*time.Second)
	url := member.srv.URL + "/internal/v1/handoff"

	if st, body, err := post(client, url, strings.Repeat("a", limit-64)); err != nil || st != 200 {
		t.Fatalf("body under the limit: %d %.80q %v", st, body, err)
	}
	for _, declared := range []bool{true, false} {
		body := strings.Repeat("b", limit+1)
		var rd io.Reader = strings.NewReader(body)
		if !declared {
			rd = io.MultiReader(rd) // no length known: sent chunked
		}
		req, _ := http.NewRequest("POST", url, rd)
		req.Header.Set("Content-Type", "application/json")
		// The refusal is the middleware's, unsigned: the signing client
		// reports it as an answer it cannot trust, naming the status.
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			t.Errorf("declared=%v: %d, want a 413 refusal", declared, resp.StatusCode)
		} else if !nodeauth.IsAuthError(err) || !strings.Contains(err.Error(), "413") {
			t.Errorf("declared=%v: %v, want the unsigned 413 named", declared, err)
		}
		// Unsigned, the caller reads the middleware's JSON error.
		req, _ = http.NewRequest("POST", url, strings.NewReader(body))
		if !declared {
			req, _ = http.NewRequest("POST", url, io.MultiReader(strings.NewReader(body)))
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close() // refused 401 first: unsigned calls never reach the size check
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("unsigned oversized call: %d, want 401", resp.StatusCode)
			}
		}
	}
	if got := member.seen(); len(got) != 1 {
		t.Errorf("handler ran %d times, want once (the body under the limit)", len(got))
	}
}
