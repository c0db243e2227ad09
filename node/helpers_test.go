package node_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/client"
	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/internal/testmetrics"
	"github.com/fairshard/fairshard/internal/testnode"
	"github.com/fairshard/fairshard/loadgen"
	"github.com/fairshard/fairshard/node"
)

// httpClient is every test's API client; TestMain closes its idle
// connections before goleak looks for leftover goroutines.
var httpClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), Timeout: 30 * time.Second}

func TestMain(m *testing.M) { testnode.Main(m, httpClient.CloseIdleConnections) }

// testConfig is a node config for an in-process test node
// (testnode.Config in a fresh data dir) with one copy per shard, a short
// repair interval and a short lease.
func testConfig(t testing.TB) node.Config {
	t.Helper()
	cfg := testnode.Config(t.TempDir())
	// One copy per shard: these tests check placement, handoff and the
	// API per node; the replicated behaviour (R = 2, the default) has its
	// own tests (replication_test.go) and the e2e scenarios.
	cfg.ReplicationFactor = 1
	cfg.Replication.PollInterval = 200 * time.Millisecond
	// Exact quota mode: a short lease, so a coordinator that moves with a
	// join learns for 1 s, not the production 10 s.
	cfg.Lease.LeaseLength = time.Second
	cfg.Lease.Refresh = 50 * time.Millisecond
	return cfg
}

// tnode is one running in-process node plus what the tests need to talk
// to it.
type tnode struct {
	*node.Node
	t     testing.TB
	cfg   node.Config
	base  string // http://host:port of its real listener
	token string // bearer token sent by do (the API token)
	logs  *testnode.LogBuffer
}

// startNode builds a node from testConfig (edited by mutate), starts it
// and closes it at cleanup.
func startNode(t testing.TB, mutate func(*node.Config)) *tnode {
	t.Helper()
	cfg := testConfig(t)
	if mutate != nil {
		mutate(&cfg)
	}
	return startConfig(t, cfg)
}

func startConfig(t testing.TB, cfg node.Config) *tnode {
	t.Helper()
	return startWith(t, cfg, node.New)
}

// startWith is startConfig with the constructor to use (node.New, or
// NewWithStore around another store).
func startWith(t testing.TB, cfg node.Config, build testnode.Constructor) *tnode {
	t.Helper()
	n := testnode.StartWith(t, cfg, build)
	return &tnode{Node: n.Node, t: t, cfg: cfg, base: n.URL, token: cfg.APIToken, logs: n.Logs}
}

// startCluster starts size nodes, each joining the first, and waits until
// every node sees all of them with the same shard table.
func startCluster(t testing.TB, size int, mutate func(i int, cfg *node.Config)) []*tnode {
	t.Helper()
	var nodes []*tnode
	for i := range size {
		nodes = append(nodes, startNode(t, func(c *node.Config) {
			if i > 0 {
				c.Join = []string{nodes[0].GossipAddr()}
			}
			if mutate != nil {
				mutate(i, c)
			}
		}))
	}
	waitConverged(t, nodes)
	return nodes
}

// waitConverged waits until every node lists exactly these members as
// active and they all answer the same shard table; it returns the table.
func waitConverged(t testing.TB, nodes []*tnode) map[uint32]string {
	t.Helper()
	var table map[uint32]string
	poll.Eventually(t, 15*time.Second, fmt.Sprintf("cluster of %d nodes to converge", len(nodes)), func() (bool, string) {
		table = nil
		for _, n := range nodes {
			var c clusterView
			if st, _ := n.getJSON("/v1/cluster", &c); st != http.StatusOK || len(c.Members) != len(nodes) {
				return false, ""
			}
			for _, m := range c.Members {
				if m.State != "active" {
					return false, ""
				}
			}
			tab := n.shardTable()
			if table == nil {
				table = tab
			} else if !sameTable(table, tab) {
				return false, ""
			}
		}
		return true, ""
	})
	return table
}

func sameTable(a, b map[uint32]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// ---- HTTP helpers ----

// do sends body (string and []byte as is, anything else as JSON, nil: no
// body) with the node's token and returns the status and response body.
func (n *tnode) do(method, path string, body any) (int, []byte) {
	n.t.Helper()
	return n.doAuth(method, path, body, n.token)
}

// doAuth is do with an explicit bearer token ("" sends none).
func (n *tnode) doAuth(method, path string, body any, token string) (int, []byte) {
	n.t.Helper()
	status, b, _ := request(n.t, method, n.base+path, body, token)
	return status, b
}

func request(t testing.TB, method, u string, body any, token string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, u, bodyReader(t, body))
	if err != nil {
		t.Fatalf("new request %s %s: %v", method, u, err)
	}
	if body != nil || (method != http.MethodGet && method != http.MethodHead) {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	return resp.StatusCode, readAll(t, resp), resp.Header
}

// bodyReader turns a request body into a reader: string and []byte as is,
// nil as no body, anything else as JSON.
func bodyReader(t testing.TB, body any) io.Reader {
	t.Helper()
	switch b := body.(type) {
	case nil:
		return nil
	case string:
		return strings.NewReader(b)
	case []byte:
		return bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			t.Fatalf("marshal request: %v", err)
		}
		return bytes.NewReader(j)
	}
}

func readAll(t testing.TB, resp *http.Response) []byte {
	t.Helper()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: read answer: %v", resp.Request.Method, resp.Request.URL, err)
	}
	return b
}

func mustUnmarshal(t testing.TB, b []byte, v any) {
	t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}

// getJSON GETs path and decodes a 200 answer into out.
func (n *tnode) getJSON(path string, out any) (int, []byte) {
	n.t.Helper()
	st, b := n.do(http.MethodGet, path, nil)
	if st == http.StatusOK && out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			n.t.Fatalf("GET %s: decode %s: %v", path, b, err)
		}
	}
	return st, b
}

// mustDo sends a request, requires want and decodes the answer into out.
func (n *tnode) mustDo(method, path string, body any, want int, out any) []byte {
	n.t.Helper()
	st, b := n.do(method, path, body)
	if st != want {
		n.t.Fatalf("%s %s on %s: status %d, want %d: %s", method, path, n.Name(), st, want, b)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			n.t.Fatalf("%s %s: decode %s: %v", method, path, b, err)
		}
	}
	return b
}

// apiError is the API's JSON error body.
type apiError struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
		Field   string `json:"field"`
	} `json:"error"`
}

// wantError requires a JSON error with status, code and (when field is
// not "") field; it returns the decoded error.
func wantError(t testing.TB, status int, body []byte, wantStatus int, code, field string) apiError {
	t.Helper()
	var e apiError
	if status != wantStatus {
		t.Fatalf("status %d, want %d: %s", status, wantStatus, body)
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body is not JSON: %v: %q", err, body)
	}
	if e.Error.Code != code {
		t.Errorf("error code %q, want %q: %s", e.Error.Code, code, body)
	}
	if e.Error.Message == "" {
		t.Errorf("error without a message: %s", body)
	}
	if field != "" && e.Error.Field != field {
		t.Errorf("error field %q, want %q: %s", e.Error.Field, field, body)
	}
	return e
}

// ---- API shapes ----

type rowIn = map[string]any

type appendOut struct {
	Rows []struct {
		DispatchKey string `json:"dispatch_key"`
		Status      string `json:"status"`
		Shard       uint32 `json:"shard"`
		Node        string `json:"node"`
		Copies      int    `json:"copies"`
	} `json:"rows"`
}

type rowView struct {
	DispatchKey   string `json:"dispatch_key"`
	WorkflowID    string `json:"workflow_id"`
	Ordinal       uint64 `json:"ordinal"`
	Namespace     string `json:"namespace"`
	TaskQueue     string `json:"task_queue"`
	ActivityType  string `json:"activity_type"`
	PayloadBase64 []byte `json:"payload_base64"`
	// Payload is a JSON payload as the JSON value it is.
	Payload      json.RawMessage `json:"payload"`
	ContentType  string          `json:"content_type"`
	Status       string          `json:"status"`
	Attempt      uint32          `json:"attempt"`
	VisibleAfter time.Time       `json:"visible_after"`
	CreatedAt    time.Time       `json:"created_at"`
	LastError    string          `json:"last_error"`
	Shard        uint32          `json:"shard"`
	Node         string          `json:"node"`
}

// nsView is GET /v1/namespaces/{ns}, decoded as the Go client does.
type nsView = client.Namespace

// clusterView is GET /v1/cluster, decoded as the Go client does.
type clusterView = client.Cluster

// shardsView is GET /v1/shards, decoded as the Go client does.
type shardsView = client.ShardTable

type deadLettersView struct {
	Rows             []rowView `json:"rows"`
	Next             string    `json:"next"`
	UnreachableNodes []string  `json:"unreachable_nodes"`
}

// appendRows POSTs rows and requires a 200.
func (n *tnode) appendRows(rows ...rowIn) appendOut {
	n.t.Helper()
	var out appendOut
	n.mustDo(http.MethodPost, "/v1/rows", map[string]any{"rows": rows}, http.StatusOK, &out)
	if len(out.Rows) != len(rows) {
		n.t.Fatalf("append of %d rows answered %d", len(rows), len(out.Rows))
	}
	return out
}

// getRow GETs a row by dispatch_key; ok is false on 404.
func (n *tnode) getRow(key string) (rowView, bool) {
	n.t.Helper()
	var v rowView
	st, b := n.getJSON("/v1/rows/"+escapeKey(key), &v)
	switch st {
	case http.StatusOK:
		return v, true
	case http.StatusNotFound:
		wantError(n.t, st, b, http.StatusNotFound, api.CodeNotFound, "")
		return v, false
	}
	n.t.Fatalf("GET row %q: status %d: %s", key, st, b)
	return v, false
}

// escapeKey escapes each path segment of a dispatch_key (slashes stay).
func escapeKey(key string) string {
	parts := strings.Split(key, "/")
	for i, p := range parts {
		parts[i] = url.PathEscape(p)
	}
	return strings.Join(parts, "/")
}

// wantNotStored requires that none of keys is stored on any node.
func wantNotStored(t testing.TB, n *tnode, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if v, ok := n.getRow(k); ok {
			t.Errorf("row %q was stored (status %s on %s) though its batch was refused", k, v.Status, v.Node)
		}
	}
}

func (n *tnode) namespace(ns string) nsView {
	n.t.Helper()
	var v nsView
	n.mustDo(http.MethodGet, "/v1/namespaces/"+ns, nil, http.StatusOK, &v)
	return v
}

func (n *tnode) shardTable() map[uint32]string {
	n.t.Helper()
	var s shardsView
	n.mustDo(http.MethodGet, "/v1/shards", nil, http.StatusOK, &s)
	out := make(map[uint32]string, len(s.Shards))
	for _, e := range s.Shards {
		out[e.Shard] = e.Owner
	}
	return out
}

// metric sums every sample of the named counter or gauge (for a
// histogram: its observation count) in the node's registry.
func (n *tnode) metric(name string) float64 {
	n.t.Helper()
	return testmetrics.Sum(n.t, n.Registry(), name)
}

// pause pauses ns (PUT through n) and waits until every node sees it, so
// no node claims the namespace's rows.
func pause(t testing.TB, nodes []*tnode, ns string) {
	t.Helper()
	nodes[0].mustDo(http.MethodPut, "/v1/namespaces/"+ns, map[string]any{"paused": true}, http.StatusOK, nil)
	poll.Eventually(t, 5*time.Second, fmt.Sprintf("pause of %s to reach every node", ns), func() (bool, string) {
		for _, n := range nodes {
			if !n.namespace(ns).Paused {
				return false, ""
			}
		}
		return true, ""
	})
}

// target is a real delivery target recording deliveries.
type target struct {
	*loadgen.Receiver
	srv *httptest.Server
}

func newTarget(t testing.TB) *target {
	t.Helper()
	r := loadgen.NewReceiver(0)
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	return &target{Receiver: r, srv: srv}
}

func (tg *target) URL() string { return tg.srv.URL }

// setTarget points (ns, tq) at url through n.
func (n *tnode) setTarget(ns, tq, u string) {
	n.t.Helper()
	n.mustDo(http.MethodPut, "/v1/namespaces/"+ns+"/task-queues/"+tq+"/target", map[string]any{"url": u}, http.StatusOK, nil)
}

// waitStatus waits until the row is found through n with status.
func (n *tnode) waitStatus(key, status string, timeout time.Duration) rowView {
	n.t.Helper()
	var v rowView
	poll.Eventually(n.t, timeout, fmt.Sprintf("row %q to be %s", key, status), func() (bool, string) {
		var ok bool
		v, ok = n.getRow(key)
		return ok && v.Status == status, fmt.Sprintf("last seen %q", v.Status)
	})
	return v
}

// at returns n bound to t, for use inside subtests.
func (n *tnode) at(t *testing.T) *tnode {
	c := *n
	c.t = t
	return &c
}
