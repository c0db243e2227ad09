package node_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/node"
	"github.com/fairshard/fairshard/nodeauth"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/replication"
	"github.com/fairshard/fairshard/shards"
	"github.com/fairshard/fairshard/transfer"
)

// TestInternalRoutesRefuseOutsiders: beside an API token, the
// node-to-node routes answer nobody but members. Input, the reproducer:
// a loopback node started with --api-token and no --cluster-secret,
// holding a pending row with a payload and a dead letter, asked for
// GET /internal/v1/rows/{key}, the dead letters, cancel and purge. Every
// internal route the node serves (enumerated from its mux, so a route
// added later is covered) is called without credentials, with the API
// token, and signed by a foreign cluster's secret, on a node with the
// token alone and on one with a cluster secret too: each answers 401 and
// nothing changes (no payload leaks, the pending row stays pending, the
// dead letter stays dead, no row is injected).
func TestInternalRoutesRefuseOutsiders(t *testing.T) {
	t.Parallel()
	const token = "api-token-internal-0123"
	const payload = "secret-payload-7f3a"
	for _, c := range []struct {
		name, secret, mode string
	}{
		{"api token without cluster secret", "", "this_node_only"},
		{"api token and cluster secret", "cluster-secret-internal-0123", "cluster_secret"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			n := startNode(t, func(cfg *node.Config) { cfg.APIToken, cfg.ClusterSecret = token, c.secret })
			var cl struct {
				Security struct {
					InternalRoutes string `json:"internal_routes"`
				} `json:"security"`
			}
			n.mustDo(http.MethodGet, "/v1/cluster", nil, http.StatusOK, &cl)
			if cl.Security.InternalRoutes != c.mode {
				t.Errorf("/v1/cluster security.internal_routes %q, want %q", cl.Security.InternalRoutes, c.mode)
			}
			// A pending row with a payload (no target: it waits) and a
			// dead letter.
			n.appendRows(rowIn{"dispatch_key": "open-1", "namespace": "open", "payload": map[string]any{"p": payload}})
			tg := newTarget(t)
			tg.SetStatus(http.StatusServiceUnavailable)
			n.setTarget("dl", "default", tg.URL())
			n.mustDo(http.MethodPut, "/v1/namespaces/dl", map[string]any{"retry": map[string]any{"max_attempts": 1}}, http.StatusOK, nil)
			n.appendRows(rowIn{"dispatch_key": "dead-1", "namespace": "dl", "payload": map[string]any{"p": payload}})
			n.waitStatus("dead-1", "failed", 10*time.Second)
			before := map[string]rowView{}
			for _, k := range []string{"open-1", "dead-1"} {
				before[k], _ = n.getRow(k)
			}
			deadBefore := n.mustDo(http.MethodGet, "/v1/namespaces/dl/dead-letters", nil, http.StatusOK, nil)

			routes := internalRoutes(t, n)
			foreign := foreignClient(t)
			for _, pattern := range routes {
				method, path, body, ct := internalCall(pattern)
				// No credentials, then the API token.
				for _, auth := range []string{"", "Bearer " + token} {
					req, _ := http.NewRequest(method, n.base+path, bytes.NewReader(body))
					req.Header.Set("Content-Type", ct)
					if auth != "" {
						req.Header.Set("Authorization", auth)
					}
					resp, err := httpClient.Do(req)
					if err != nil {
						t.Fatalf("%s %s: %v", method, path, err)
					}
					b := readAll(t, resp)
					resp.Body.Close()
					what := "without credentials"
					if auth != "" {
						what = "with the API token"
					}
					if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(string(b), `"unauthorized"`) {
						t.Errorf("%s (%s) %s: HTTP %d %.200s; want 401 unauthorized", pattern, path, what, resp.StatusCode, b)
					}
					if strings.Contains(string(b), payload) {
						t.Errorf("%s %s: the answer carries a row's payload", pattern, what)
					}
				}
				// Signed with another cluster's secret, as a member of
				// that cluster would sign (no proof asked first, so the
				// route itself answers).
				req, _ := http.NewRequest(method, n.base+path, bytes.NewReader(body))
				req.Header.Set("Content-Type", ct)
				resp, err := foreign.Do(req)
				if err == nil {
					b := readAll(t, resp)
					resp.Body.Close()
					t.Errorf("%s signed with a foreign cluster's secret: HTTP %d %.200s; want 401", pattern, resp.StatusCode, b)
				} else if !errors.Is(err, nodeauth.ErrRefused) {
					t.Errorf("%s signed with a foreign cluster's secret: %v; want refused with 401", pattern, err)
				}
			}

			// Nothing changed.
			for k, was := range before {
				now, ok := n.getRow(k)
				if !ok || now.Status != was.Status || now.Attempt != was.Attempt {
					t.Errorf("row %s: %s attempt %d (found %v) after the calls, was %s attempt %d", k, now.Status, now.Attempt, ok, was.Status, was.Attempt)
				}
			}
			if after := n.mustDo(http.MethodGet, "/v1/namespaces/dl/dead-letters", nil, http.StatusOK, nil); !bytes.Equal(after, deadBefore) {
				t.Errorf("dead letters changed:\nbefore %s\nafter  %s", deadBefore, after)
			}
			wantNotStored(t, n, "injected-append", "injected-forward")
		})
	}
}

// internalRoutes lists the node's /internal/ route patterns from its mux,
// plus nodeauth's challenge; it fails when the list looks incomplete.
func internalRoutes(t *testing.T, n *tnode) []string {
	t.Helper()
	var out []string
	for _, p := range n.Routes() {
		if _, path, _ := strings.Cut(p, " "); strings.HasPrefix(path, "/internal/") {
			out = append(out, p)
		}
	}
	out = append(out, "GET "+nodeauth.PathChallenge)
	for _, want := range []string{"GET /internal/v1/rows/{key...}", "GET /internal/v1/namespaces/{ns}/dead-letters",
		"POST /internal/v1/rows/cancel", "POST /internal/v1/namespaces/{ns}/dead-letters/purge", "POST " + replication.PathPrefix + "merge"} {
		found := false
		for _, p := range out {
			found = found || p == want
		}
		if !found {
			t.Fatalf("the node's routes %v lack %q: has the enumeration lost them?", out, want)
		}
	}
	return out
}

var wildcard = regexp.MustCompile(`\{[^}]*\}`)

// internalCall is the request a member would send on pattern, aimed at the
// test's rows: the pending row open-1, the dead letter dead-1 (namespace
// dl), a copy marking open-1 done, rows to inject. A route this does not
// know gets an empty JSON object.
func internalCall(pattern string) (method, path string, body []byte, contentType string) {
	method, path, _ = strings.Cut(pattern, " ")
	ns := "open"
	if strings.Contains(path, "dead-letters") {
		ns = "dl"
	}
	path = strings.ReplaceAll(path, "{key...}", "open-1")
	path = strings.ReplaceAll(path, "{ns}", ns)
	path = wildcard.ReplaceAllString(path, "x")
	now := time.Now().UTC()
	row := func(key string) outbox.Row {
		return outbox.Row{DispatchKey: key, Namespace: "open", TaskQueue: "default", Status: outbox.StatusPending, Attempt: 1,
			CreatedAt: now, VisibleAfter: now, Shard: shards.ShardOf(key, 1024), Version: outbox.FirstVersion}
	}
	js := func(v any) []byte { b, _ := json.Marshal(v); return b }
	shard := shards.ShardOf("open-1", 1024)
	switch path {
	case replication.PathPrefix + "merge":
		done := row("open-1")
		done.Status, done.Version, done.FinishedAt = outbox.StatusDone, outbox.Version{Seq: 9}, now
		return method, path, transfer.EncodeBatch(nil, []outbox.Row{done}), transfer.ContentType
	case replication.PathPrefix + "append":
		return method, path, transfer.EncodeBatch(nil, []outbox.Row{row("injected-append")}), transfer.ContentType
	case replication.PathPrefix + "forward":
		return method, path, transfer.EncodeBatch(nil, []outbox.Row{row("injected-forward")}), transfer.ContentType
	case replication.PathPrefix + "states":
		body = js(map[string]any{"shards": []uint32{shard}})
	case replication.PathPrefix + "read":
		body = js(map[string]any{"reads": []map[string]any{{"shard": shard}}, "max_rows": 10, "max_bytes": 1 << 20})
	case replication.PathPrefix + "keys":
		body = js(map[string]any{"shard": shard})
	case replication.PathPrefix + "rows":
		body = js(map[string]any{"keys": []string{"open-1"}, "max_bytes": 1 << 20})
	case "/internal/v1/rows/cancel":
		body = js(map[string]any{"dispatch_key": "open-1", "reason": "outsider"})
	case "/internal/v1/namespaces/dl/dead-letters/purge", "/internal/v1/namespaces/dl/dead-letters/redrive":
		body = js(map[string]any{"keys": []string{"dead-1"}})
	default:
		if method != http.MethodGet {
			body = []byte(`{}`)
		}
	}
	return method, path, body, "application/json"
}

// foreignClient signs like a member of another cluster: another secret,
// and no proof asked before a body.
func foreignClient(t *testing.T) *http.Client {
	t.Helper()
	a, err := nodeauth.New(nodeauth.Config{Secrets: [][]byte{[]byte("another-cluster-secret-0123")}, ProofTTL: -1})
	if err != nil {
		t.Fatal(err)
	}
	c := a.Client(&http.Transport{}, 10*time.Second)
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// TestAPITokenWithoutClusterSecretRefusesToJoin: --api-token with --join
// and no cluster secret refuses to start, naming the flag (a cluster's
// members must share a secret, or their node-to-node routes would be the
// way around the token).
func TestAPITokenWithoutClusterSecretRefusesToJoin(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.APIToken, cfg.Join = "api-token-join-0123", []string{"127.0.0.1:7946"}
	_, err := node.New(cfg, nil)
	if err == nil || !strings.Contains(err.Error(), "--cluster-secret") || !strings.Contains(err.Error(), "--api-token") {
		t.Fatalf("New with --api-token, --join and no cluster secret: %v; want a refusal naming --cluster-secret", err)
	}
	cfg.ClusterSecret = "cluster-secret-join-0123"
	if err := cfg.Validate(); err != nil {
		t.Errorf("with a cluster secret too: %v", err)
	}
}
