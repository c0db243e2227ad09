package node_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/node"
	"github.com/fairshard/fairshard/nodeauth"
)

// endpoint is one API route with a body that passes auth (it need not be
// a valid request).
type endpoint struct {
	method, path string
	body         any
}

var publicEndpoints = []endpoint{
	{"POST", "/v1/rows", `{"rows":[{"dispatch_key":"auth-1"}]}`},
	{"GET", "/v1/rows/auth-1", nil},
	{"GET", "/v1/namespaces", nil},
	{"GET", "/v1/namespaces/default", nil},
	{"PUT", "/v1/namespaces/default", `{"max_in_flight":10}`},
	{"PUT", "/v1/namespaces/default/task-queues/default/target", `{"url":"http://127.0.0.1:1/"}`},
	{"DELETE", "/v1/namespaces/default/task-queues/default/target", nil},
	{"GET", "/v1/namespaces/default/dead-letters", nil},
	{"POST", "/v1/namespaces/default/dead-letters/redrive", nil},
	{"PUT", "/v1/workflows/wf/hold", nil},
	{"DELETE", "/v1/workflows/wf/hold", nil},
	{"GET", "/v1/cluster", nil},
	{"GET", "/v1/shards", nil},
}

var internalEndpoints = []endpoint{
	{"POST", "/internal/v1/replication/states", `{"shards":[1]}`},
	{"POST", "/internal/v1/replication/keys", `{"shard":1}`},
	{"POST", "/internal/v1/replication/missing", `{"keys":[]}`},
	{"GET", "/internal/v1/rows/auth-1", nil},
	{"GET", "/internal/v1/namespaces/default/dead-letters", nil},
	{"POST", "/internal/v1/namespaces/default/dead-letters/redrive", `{}`},
}

// TestAuth: with --api-token every /v1 call needs the bearer token (401
// JSON otherwise), health and metrics stay open, and the internal endpoints
// need a call signed with the cluster secret (package nodeauth): neither
// the API token nor the secret itself as a bearer token opens them.
func TestAuth(t *testing.T) {
	t.Parallel()
	const token, secret = "api-token-1", "cluster-secret-0123456789"
	n := startNode(t, func(c *node.Config) { c.APIToken, c.ClusterSecret = token, secret })

	for _, e := range publicEndpoints {
		for _, bad := range []string{"", "Bearer wrong", "Basic " + token, token, "Bearer " + secret} {
			status, body, hdr := request(t, e.method, n.base+e.path, e.body, "")
			if bad != "" {
				status, body, hdr = requestHeader(t, e.method, n.base+e.path, e.body, bad)
			}
			wantError(t, status, body, http.StatusUnauthorized, api.CodeUnauthorized, "")
			if !strings.HasPrefix(hdr.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("%s %s with %q: WWW-Authenticate %q, want a Bearer challenge", e.method, e.path, bad, hdr.Get("WWW-Authenticate"))
			}
		}
		if st, b := n.doAuth(e.method, e.path, e.body, token); st == http.StatusUnauthorized || st >= 500 {
			t.Errorf("%s %s with the API token: status %d: %s", e.method, e.path, st, b)
		}
	}
	// The scheme is case-insensitive (RFC 9110 §11.1).
	if st, b, _ := requestHeader(t, "GET", n.base+"/v1/cluster", nil, "bearer "+token); st != http.StatusOK {
		t.Errorf("GET /v1/cluster with scheme \"bearer\": status %d: %s", st, b)
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		if st, b := n.doAuth("GET", p, nil, ""); st != http.StatusOK {
			t.Errorf("GET %s without a token: status %d, want 200: %.200s", p, st, b)
		}
	}
	signed := signedClient(t, secret)
	other := signedClient(t, "another-secret-0123456789")
	for _, e := range internalEndpoints {
		for _, bad := range []string{"", token, secret} {
			st, b := n.doAuth(e.method, e.path, e.body, bad)
			wantError(t, st, b, http.StatusUnauthorized, api.CodeUnauthorized, "")
		}
		if st, b, err := signedDo(signed, e.method, n.base+e.path, e.body); err != nil || st == http.StatusUnauthorized || st >= 500 {
			t.Errorf("%s %s signed with the cluster secret: status %d %v: %s", e.method, e.path, st, err, b)
		}
		if _, _, err := signedDo(other, e.method, n.base+e.path, e.body); !nodeauth.IsAuthError(err) {
			t.Errorf("%s %s signed with another secret: %v, want refused", e.method, e.path, err)
		}
	}
}

// signedClient signs node-to-node calls with secret, as a member does.
func signedClient(t testing.TB, secret string) *http.Client {
	t.Helper()
	a, err := nodeauth.New(nodeauth.Config{Secrets: [][]byte{[]byte(secret)}})
	if err != nil {
		t.Fatal(err)
	}
	c := a.Client(&http.Transport{}, 30*time.Second) // a safety net, not a bound: the gate's machine stalls for seconds
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// signedDo sends a JSON body (a string as is) through a signing client.
func signedDo(c *http.Client, method, u string, body any) (int, []byte, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequest(method, u, rd)
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// TestAuthDefaults: the cluster secret never defaults to the API token:
// a node with the token and no secret answers its internal endpoints to
// nobody, the token included (every route: TestInternalRoutesRefuseOutsiders);
// a node with no credential at all (allowed on loopback) leaves them as
// open as /v1. A node without secrets says so in /v1/cluster and
// fairshard_insecure.
func TestAuthDefaults(t *testing.T) {
	t.Parallel()
	withToken := startNode(t, func(c *node.Config) { c.APIToken = "only-token" })
	bare := startNode(t, nil)
	secured := startNode(t, func(c *node.Config) {
		c.ClusterSecret = "cluster-secret-0123456789"
		c.GossipKeys = [][]byte{bytes.Repeat([]byte{7}, 32)}
	})
	for _, e := range internalEndpoints {
		st, b := withToken.doAuth(e.method, e.path, e.body, "only-token")
		wantError(t, st, b, http.StatusUnauthorized, api.CodeUnauthorized, "")
		if st, b := bare.do(e.method, e.path, e.body); st == http.StatusUnauthorized || st >= 500 {
			t.Errorf("%s %s on a node without any credential: status %d: %s", e.method, e.path, st, b)
		}
	}
	// /v1/cluster, fairshard_insecure and the INSECURE warning read one
	// fact: with no secret (and no --insecure: loopback) all three say
	// insecure, with both none does.
	type security struct {
		Insecure        bool `json:"insecure"`
		InsecureFlag    bool `json:"insecure_flag"`
		NodeAuth        bool `json:"node_auth"`
		GossipEncrypted bool `json:"gossip_encrypted"`
	}
	for _, c := range []struct {
		name string
		n    *tnode
		want security
	}{
		{"without secrets", withToken, security{Insecure: true}},
		{"with both secrets", secured, security{NodeAuth: true, GossipEncrypted: true}},
	} {
		var view struct {
			Security security `json:"security"`
		}
		c.n.mustDo("GET", "/v1/cluster", nil, http.StatusOK, &view)
		if view.Security != c.want {
			t.Errorf("node %s: /v1/cluster security %+v, want %+v", c.name, view.Security, c.want)
		}
		metric := 0.0
		if c.want.Insecure {
			metric = 1
		}
		if got := c.n.metric("fairshard_insecure"); got != metric {
			t.Errorf("node %s: fairshard_insecure = %v, want %v", c.name, got, metric)
		}
		if got := strings.Contains(c.n.logs.String(), "INSECURE"); got != c.want.Insecure {
			t.Errorf("node %s: INSECURE warning logged %v, want %v", c.name, got, c.want.Insecure)
		}
	}
}

// requestHeader is request with a raw Authorization header value.
func requestHeader(t *testing.T, method, u string, body any, authorization string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, u, bodyReader(t, body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", authorization)
	if method != http.MethodGet && method != http.MethodHead {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	b := readAll(t, resp)
	return resp.StatusCode, b, resp.Header
}

// TestRoutingErrors: unknown paths, wrong methods and bad path values get
// JSON errors too.
func TestRoutingErrors(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	for _, p := range []string{"/nope", "/v1/nope", "/v1/namespaces/a/b/c", "/internal/v1/nope"} {
		st, b := n.do("GET", p, nil)
		wantError(t, st, b, http.StatusNotFound, api.CodeNotFound, "")
	}
	for _, e := range []endpoint{{"DELETE", "/v1/rows", nil}, {"POST", "/healthz", nil}, {"PATCH", "/v1/namespaces/x", nil}, {"GET", "/internal/v1/replication/states", nil}} {
		st, b, hdr := request(t, e.method, n.base+e.path, e.body, "")
		e := wantError(t, st, b, http.StatusMethodNotAllowed, api.CodeMethodNotAllowed, "")
		if hdr.Get("Allow") == "" || !strings.Contains(e.Error.Message, hdr.Get("Allow")) {
			t.Errorf("405 with Allow %q and message %q: want the allowed methods in both", hdr.Get("Allow"), e.Error.Message)
		}
		if ct := hdr.Get("Content-Type"); ct != "application/json" {
			t.Errorf("405 content type %q, want application/json", ct)
		}
	}
	st, b := n.do("GET", "/v1/rows/", nil)
	wantError(t, st, b, http.StatusBadRequest, api.CodeInvalidField, "dispatch_key")
	st, b = n.do("GET", "/v1/rows/"+strings.Repeat("k", node.MaxKeyBytes+1), nil)
	wantError(t, st, b, http.StatusBadRequest, api.CodeInvalidField, "dispatch_key")
	st, b = n.do("GET", "/v1/rows/no-such-row", nil)
	if e := wantError(t, st, b, http.StatusNotFound, api.CodeNotFound, ""); !strings.Contains(e.Error.Message, "no-such-row") {
		t.Errorf("404 message %q does not name the key", e.Error.Message)
	}
	st, b = n.do("GET", "/v1/namespaces/bad%20name", nil)
	wantError(t, st, b, http.StatusBadRequest, api.CodeInvalidField, "namespace")
	st, b = n.do("GET", "/v1/namespaces/"+strings.Repeat("n", 65)+"/dead-letters", nil)
	wantError(t, st, b, http.StatusBadRequest, api.CodeInvalidField, "namespace")
	st, b = n.do("PUT", "/v1/namespaces/ok/task-queues/b%21d/target", map[string]any{"url": "http://127.0.0.1:1/"})
	wantError(t, st, b, http.StatusBadRequest, api.CodeInvalidField, "task_queue")
	st, b = n.do("PUT", "/v1/workflows/"+strings.Repeat("w", 200)+"/hold", nil)
	wantError(t, st, b, http.StatusBadRequest, api.CodeInvalidField, "workflow_id")
}

// TestHealthClusterShardsMetrics covers /healthz, /readyz, /v1/cluster,
// /v1/shards and /metrics on a single node.
func TestHealthClusterShardsMetrics(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	tg := newTarget(t)
	n.setTarget("metrics", "default", tg.URL())
	n.appendRows(rowIn{"dispatch_key": "m-1", "namespace": "metrics"})
	n.waitStatus("m-1", "done", 10*time.Second)

	n.mustDo("GET", "/healthz", nil, http.StatusOK, nil)
	n.mustDo("GET", "/readyz", nil, http.StatusOK, nil)

	var c clusterView
	n.mustDo("GET", "/v1/cluster", nil, http.StatusOK, &c)
	if c.Node != n.Name() || c.ShardCount != 1024 || c.OwnershipVersion < 1 || len(c.Members) != 1 {
		t.Fatalf("cluster = %+v, want node %s, 1024 shards, a version and one member", c, n.Name())
	}
	if m := c.Members[0]; m.Name != n.Name() || m.APIAddr != n.APIAddr() || m.State != "active" || m.OwnedShards != 1024 || m.OwnedShardFraction != 1 {
		t.Errorf("member = %+v, want %s at %s, active, owning all 1024 shards", m, n.Name(), n.APIAddr())
	}
	var s shardsView
	n.mustDo("GET", "/v1/shards", nil, http.StatusOK, &s)
	if s.ShardCount != 1024 || len(s.Shards) != 1024 || s.OwnershipVersion != c.OwnershipVersion {
		t.Fatalf("shards: count %d, %d entries, version %d; want 1024, 1024, %d", s.ShardCount, len(s.Shards), s.OwnershipVersion, c.OwnershipVersion)
	}
	for i, e := range s.Shards {
		if e.Shard != uint32(i) || e.Owner != n.Name() {
			t.Fatalf("shards[%d] = %+v, want shard %d owned by %s", i, e, i, n.Name())
		}
	}

	st, body := n.do("GET", "/metrics", nil)
	if st != http.StatusOK {
		t.Fatalf("/metrics: status %d", st)
	}
	for _, name := range []string{
		"fairshard_store_rows",                     // boltstore
		"fairshard_store_commit_duration_seconds",  // boltstore
		"fairshard_cluster_members",                // cluster
		"fairshard_owned_shard_fraction",           // cluster
		"fairshard_rows_delivered_total",           // dispatch
		"fairshard_deliveries_in_flight",           // dispatch
		"fairshard_append_rows_total",              // node
		"fairshard_replication_dropped_rows_total", // replication
		"fairshard_replication_lag_seconds",        // replication
		"go_goroutines", "process_open_fds",        // Go and process collectors
	} {
		if !strings.Contains(string(body), "\n"+name) {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if v := n.metric("fairshard_rows_delivered_total"); v != 1 {
		t.Errorf("fairshard_rows_delivered_total = %v, want 1", v)
	}
	if v := n.metric("fairshard_append_rows_total"); v != 1 {
		t.Errorf("fairshard_append_rows_total = %v, want 1", v)
	}
	problems, err := testutil.GatherAndLint(n.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("metric lint: %s: %s", p.Metric, p.Text)
	}
}

// TestNamespaceSettings covers GET /v1/namespaces and GET|PUT
// /v1/namespaces/{ns}: max_in_flight 0..1e6 or null, paused, errors naming
// the field with nothing changed, ceiling and headroom (in proportional
// mode, the seed's ceiling; TestExactModeNamespaceView covers exact).
func TestNamespaceSettings(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(c *node.Config) { c.DefaultMaxInFlight = 64; c.DefaultQuotaMode = "proportional" })

	v := n.namespace("fresh")
	if v.MaxInFlight != 64 || !v.MaxInFlightDefault || v.Paused || v.Ceiling != 64 || v.Headroom != 64 || v.OwnedShardFraction != 1 || v.Node != n.Name() {
		t.Errorf("fresh namespace = %+v, want the default 64, not paused, ceiling = headroom = 64 on a lone node", v)
	}
	put := func(body any, want int) nsView {
		t.Helper()
		var v nsView
		st, b := n.do("PUT", "/v1/namespaces/quota", body)
		if st != want {
			t.Fatalf("PUT %v: status %d, want %d: %s", body, st, want, b)
		}
		if want == http.StatusOK {
			mustUnmarshal(t, b, &v)
		}
		return v
	}
	if v := put(map[string]any{"max_in_flight": 5}, 200); v.MaxInFlight != 5 || v.MaxInFlightDefault || v.Ceiling != 5 || v.Headroom != 5 {
		t.Errorf("after max_in_flight 5: %+v", v)
	}
	for _, q := range []uint32{0, node.MaxQuota} {
		if v := put(map[string]any{"max_in_flight": q}, 200); v.MaxInFlight != q || v.Ceiling != q {
			t.Errorf("after max_in_flight %d: %+v", q, v)
		}
	}
	put(map[string]any{"max_in_flight": 7}, 200)
	for _, bad := range []struct {
		body  any
		field string
	}{
		{`{"max_in_flight":1000001}`, "max_in_flight"},
		{`{"max_in_flight":-1}`, "max_in_flight"},
		{`{"max_in_flight":1.5}`, "max_in_flight"},
		{`{"max_in_flight":"5"}`, "max_in_flight"},
		{`{"max_in_flight":true}`, "max_in_flight"},
		{`{"paused":"yes"}`, "paused"},
		{`{"paused":1}`, "paused"},
		{`{"max_in_flight":9,"paused":"no"}`, "paused"},
		{`{"quota":3}`, "quota"},
	} {
		st, b := n.do("PUT", "/v1/namespaces/quota", bad.body)
		wantError(t, st, b, http.StatusBadRequest, api.CodeInvalidField, bad.field)
	}
	for _, bad := range []string{`{"max_in_flight":`, `[1]`, `{"paused":true} x`} {
		st, b := n.do("PUT", "/v1/namespaces/quota", bad)
		wantError(t, st, b, http.StatusBadRequest, api.CodeInvalidJSON, "body")
	}
	if v := n.namespace("quota"); v.MaxInFlight != 7 || v.Paused {
		t.Errorf("after refused PUTs: %+v, want max_in_flight 7, not paused (unchanged)", v)
	}
	if v := put(map[string]any{"paused": true}, 200); !v.Paused || v.MaxInFlight != 7 || v.Ceiling != 0 || v.Headroom != 0 {
		t.Errorf("after paused true: %+v, want paused with max_in_flight kept, ceiling and headroom 0", v)
	}
	if v := put(map[string]any{"paused": false, "max_in_flight": nil}, 200); v.Paused || v.MaxInFlight != 64 || !v.MaxInFlightDefault {
		t.Errorf("after paused false and max_in_flight null: %+v, want the default 64 back", v)
	}

	// Headroom counts claimed rows only: quota 2 and a slow target leave
	// 2 claimed, 3 pending, headroom 0.
	tg := newTarget(t)
	tg.SetDelay(400 * time.Millisecond)
	n.setTarget("slow", "default", tg.URL())
	n.mustDo("PUT", "/v1/namespaces/slow", map[string]any{"max_in_flight": 2}, http.StatusOK, nil)
	for i := range 5 {
		n.appendRows(rowIn{"dispatch_key": fmt.Sprintf("slow-%d", i), "namespace": "slow"})
	}
	var last nsView
	poll.Eventually(t, 5*time.Second, "2 claimed and 3 pending rows in namespace slow", func() (bool, string) {
		last = n.namespace("slow")
		return last.Claimed == 2 && last.Pending == 3, fmt.Sprintf("last %+v", last)
	})
	if last.Ceiling != 2 || last.Headroom != 0 {
		t.Errorf("slow at its ceiling: %+v, want ceiling 2, headroom 0", last)
	}
	poll.Eventually(t, 10*time.Second, "the 5 slow rows to be delivered", func() (bool, string) { return tg.Distinct() == 5, "" })
	for _, ns := range tg.Namespaces() {
		if ns.MaxInFlight > 2 {
			t.Errorf("target saw %d concurrent deliveries of %s, quota is 2", ns.MaxInFlight, ns.Namespace)
		}
	}

	var list struct {
		Namespaces []nsView `json:"namespaces"`
	}
	n.mustDo("GET", "/v1/namespaces", nil, http.StatusOK, &list)
	var names []string
	for _, v := range list.Namespaces {
		names = append(names, v.Name)
	}
	if strings.Join(names, ",") != "quota,slow" {
		t.Errorf("GET /v1/namespaces lists %v, want [quota slow] (configured or holding rows, sorted)", names)
	}
}

// TestTargets covers PUT|DELETE target: bad values refused, delivery goes
// to the newest target, a route without one waits and says so.
func TestTargets(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	a, b := newTarget(t), newTarget(t)
	path := "/v1/namespaces/tgt/task-queues/q1/target"
	for _, bad := range []struct {
		body  any
		code  string
		field string
	}{
		{map[string]any{"url": ""}, api.CodeInvalidField, "url"},
		{map[string]any{"url": "not a url"}, api.CodeInvalidField, "url"},
		{map[string]any{"url": "ftp://example.com/x"}, api.CodeInvalidField, "url"},
		{map[string]any{"url": "http://"}, api.CodeInvalidField, "url"},
		{map[string]any{"url": "/relative"}, api.CodeInvalidField, "url"},
		{map[string]any{"url": a.URL(), "timeout_ms": -1}, api.CodeInvalidField, "timeout_ms"},
		{map[string]any{"url": a.URL(), "timeout_ms": node.MaxTargetTimeout.Milliseconds() + 1}, api.CodeInvalidField, "timeout_ms"},
		{map[string]any{"url": a.URL(), "extra": 1}, api.CodeInvalidJSON, "body"},
		{`{"url":`, api.CodeInvalidJSON, "body"},
	} {
		st, body := n.do("PUT", path, bad.body)
		wantError(t, st, body, http.StatusBadRequest, bad.code, bad.field)
	}

	n.mustDo("PUT", path, map[string]any{"url": a.URL(), "timeout_ms": 2000}, http.StatusOK, nil)
	n.appendRows(rowIn{"dispatch_key": "tgt-1", "namespace": "tgt", "task_queue": "q1"})
	n.waitStatus("tgt-1", "done", 10*time.Second)

	n.mustDo("PUT", path, map[string]any{"url": b.URL()}, http.StatusOK, nil)
	n.appendRows(rowIn{"dispatch_key": "tgt-2", "namespace": "tgt", "task_queue": "q1"})
	n.waitStatus("tgt-2", "done", 10*time.Second)
	if a.Count("tgt-1") != 1 || a.Count("tgt-2") != 0 || b.Count("tgt-2") != 1 {
		t.Errorf("deliveries: a got tgt-1 %d, tgt-2 %d times; b got tgt-2 %d times; want 1, 0, 1",
			a.Count("tgt-1"), a.Count("tgt-2"), b.Count("tgt-2"))
	}

	n.mustDo("DELETE", path, nil, http.StatusNoContent, nil)
	n.appendRows(rowIn{"dispatch_key": "tgt-3", "namespace": "tgt", "task_queue": "q1"})
	var v nsView
	poll.Eventually(t, 5*time.Second, "route tgt/q1 to be reported waiting for a target", func() (bool, string) {
		v = n.namespace("tgt")
		return len(v.WaitingRoutes) == 1 && v.WaitingRoutes[0] == "q1", fmt.Sprintf("last %+v", v)
	})
	if r, _ := n.getRow("tgt-3"); r.Status != "pending" || r.Attempt != 1 {
		t.Errorf("tgt-3 without a target = %s attempt %d, want pending attempt 1", r.Status, r.Attempt)
	}
	n.mustDo("PUT", path, map[string]any{"url": b.URL()}, http.StatusOK, nil)
	n.waitStatus("tgt-3", "done", 10*time.Second)
	if b.Count("tgt-3") != 1 {
		t.Errorf("tgt-3 delivered %d times to the restored target, want 1", b.Count("tgt-3"))
	}
}

// TestDefaultTarget: --default-target serves routes without their own
// target, with {namespace} and {task_queue} substituted.
func TestDefaultTarget(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		paths = append(paths, r.URL.Path)
		mu.Unlock()
	}))
	t.Cleanup(srv.Close)
	n := startNode(t, func(c *node.Config) { c.DefaultTarget = srv.URL + "/to/{namespace}/{task_queue}" })
	n.appendRows(rowIn{"dispatch_key": "dt-1", "namespace": "ns-a", "task_queue": "q.b"})
	n.waitStatus("dt-1", "done", 10*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if len(paths) != 1 || paths[0] != "/to/ns-a/q.b" {
		t.Errorf("default target got paths %v, want [/to/ns-a/q.b]", paths)
	}
}

// TestHold: a held workflow's rows stay pending while others deliver;
// released, they are delivered.
func TestHold(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	tg := newTarget(t)
	n.setTarget("hold", "default", tg.URL())
	var h struct {
		WorkflowID string `json:"workflow_id"`
		Held       bool   `json:"held"`
	}
	n.mustDo("PUT", "/v1/workflows/wf-held/hold", nil, http.StatusOK, &h)
	if h.WorkflowID != "wf-held" || !h.Held {
		t.Errorf("hold answered %+v", h)
	}
	n.appendRows(
		rowIn{"workflow_id": "wf-held", "ordinal": 1, "namespace": "hold"},
		rowIn{"workflow_id": "wf-free", "ordinal": 1, "namespace": "hold"},
		rowIn{"workflow_id": "wf-held", "ordinal": 2, "namespace": "hold"},
		rowIn{"workflow_id": "wf-free", "ordinal": 2, "namespace": "hold"},
	)
	n.waitStatus("wf-free:1", "done", 10*time.Second)
	n.waitStatus("wf-free:2", "done", 10*time.Second)
	// Twenty more sweeps: the held rows must still be untouched.
	sweeps := n.metric("fairshard_sweep_duration_seconds")
	poll.Eventually(t, 5*time.Second, "20 more sweeps", func() (bool, string) { return n.metric("fairshard_sweep_duration_seconds") >= sweeps+20, "" })
	for _, k := range []string{"wf-held:1", "wf-held:2"} {
		if v, _ := n.getRow(k); v.Status != "pending" || v.Attempt != 1 || tg.Count(k) != 0 {
			t.Errorf("held row %s = %s attempt %d, delivered %d times; want pending, attempt 1, never delivered", k, v.Status, v.Attempt, tg.Count(k))
		}
	}
	n.mustDo("DELETE", "/v1/workflows/wf-held/hold", nil, http.StatusOK, &h)
	if h.Held {
		t.Errorf("release answered %+v", h)
	}
	n.waitStatus("wf-held:1", "done", 10*time.Second)
	n.waitStatus("wf-held:2", "done", 10*time.Second)
}

// TestDeadLetters: a target answering 400 dead-letters the row; the list
// pages with limit/after; redrive (by key, then all) brings rows back and,
// with the target fixed, they are delivered.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	tg := newTarget(t)
	tg.SetStatus(http.StatusBadRequest)
	n.setTarget("dlq", "default", tg.URL())
	keys := []string{"dlq-1", "dlq-2", "dlq-3"}
	for _, k := range keys {
		n.appendRows(rowIn{"dispatch_key": k, "namespace": "dlq"})
	}
	for _, k := range keys {
		v := n.waitStatus(k, "failed", 10*time.Second)
		if !strings.Contains(v.LastError, "HTTP 400") || v.Attempt != 1 {
			t.Errorf("%s failed with last_error %q at attempt %d, want HTTP 400 at attempt 1", k, v.LastError, v.Attempt)
		}
	}
	if v := n.namespace("dlq"); v.DeadLetters != 3 || v.Pending != 0 {
		t.Errorf("namespace dlq = %+v, want 3 dead letters, 0 pending", v)
	}

	var page deadLettersView
	n.mustDo("GET", "/v1/namespaces/dlq/dead-letters?limit=2", nil, http.StatusOK, &page)
	if len(page.Rows) != 2 || page.Rows[0].DispatchKey != "dlq-1" || page.Rows[1].DispatchKey != "dlq-2" || page.Next != "dlq-2" {
		t.Fatalf("first page = %+v, want dlq-1, dlq-2 and next dlq-2", page)
	}
	if page.Rows[0].Status != "failed" || page.Rows[0].Node != n.Name() || page.Rows[0].LastError == "" {
		t.Errorf("dead letter view = %+v, want status failed, node %s, last_error", page.Rows[0], n.Name())
	}
	n.mustDo("GET", "/v1/namespaces/dlq/dead-letters?limit=2&after=dlq-2", nil, http.StatusOK, &page)
	if len(page.Rows) != 1 || page.Rows[0].DispatchKey != "dlq-3" || page.Next != "" {
		t.Fatalf("second page = %+v, want dlq-3 and no next", page)
	}
	n.mustDo("GET", "/v1/namespaces/other/dead-letters", nil, http.StatusOK, &page)
	if len(page.Rows) != 0 {
		t.Errorf("namespace other lists %d dead letters, want 0", len(page.Rows))
	}
	for _, q := range []string{"limit=0", "limit=abc", "limit=1001", "limit=-1"} {
		st, b := n.do("GET", "/v1/namespaces/dlq/dead-letters?"+q, nil)
		wantError(t, st, b, http.StatusBadRequest, api.CodeInvalidField, "limit")
	}
	for _, bad := range []any{map[string]any{"keys": []string{""}}, map[string]any{"keys": []string{"ok", strings.Repeat("k", node.MaxKeyBytes+1)}}} {
		st, b := n.do("POST", "/v1/namespaces/dlq/dead-letters/redrive", bad)
		e := wantError(t, st, b, http.StatusBadRequest, api.CodeInvalidField, "")
		if !strings.HasPrefix(e.Error.Field, "keys[") {
			t.Errorf("bad redrive keys: field %q, want keys[i]", e.Error.Field)
		}
	}

	tg.SetStatus(0)
	var rd struct {
		Redriven int `json:"redriven"`
	}
	n.mustDo("POST", "/v1/namespaces/dlq/dead-letters/redrive", map[string]any{"keys": []string{"dlq-2"}}, http.StatusOK, &rd)
	if rd.Redriven != 1 {
		t.Errorf("redrive of dlq-2 moved %d rows, want 1", rd.Redriven)
	}
	n.waitStatus("dlq-2", "done", 10*time.Second)
	if v, _ := n.getRow("dlq-1"); v.Status != "failed" {
		t.Errorf("dlq-1 = %s after a redrive of dlq-2 only, want failed", v.Status)
	}
	n.mustDo("POST", "/v1/namespaces/dlq/dead-letters/redrive", nil, http.StatusOK, &rd)
	if rd.Redriven != 2 {
		t.Errorf("redrive of all moved %d rows, want 2", rd.Redriven)
	}
	for _, k := range keys {
		n.waitStatus(k, "done", 10*time.Second)
		if c := tg.Count(k); c != 1 {
			t.Errorf("%s delivered %d times after redrive, want 1", k, c)
		}
	}
	n.mustDo("GET", "/v1/namespaces/dlq/dead-letters", nil, http.StatusOK, &page)
	if len(page.Rows) != 0 {
		t.Errorf("%d dead letters left after redrive, want 0", len(page.Rows))
	}
}
