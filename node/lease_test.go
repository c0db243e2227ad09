package node_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/lease"
	"github.com/fairshard/fairshard/node"
	"github.com/fairshard/fairshard/shards"
)

// leaseNSView is GET /v1/namespaces/{ns} with the exact-mode fields.
type leaseNSView struct {
	nsView
	Mode        string `json:"mode"`
	ModeDefault bool   `json:"mode_default"`
	Lease       *struct {
		Coordinator  string                 `json:"coordinator"`
		Wants        uint32                 `json:"wants"`
		Grant        uint32                 `json:"grant"`
		Expires      time.Time              `json:"expires"`
		GrantedBy    string                 `json:"granted_by"`
		Learning     bool                   `json:"learning"`
		Cluster      *lease.NamespaceStatus `json:"cluster"`
		ClusterError string                 `json:"cluster_error"`
	} `json:"lease"`
}

// TestExactModeAcrossNodes checks exact mode on three in-process nodes:
// a namespace with quota 3 whose rows sit on every node is delivered with
// never more than 3 at the target at once (the proportional ceilings would
// allow ceil(3/3) × 3 = 3 here but 5 at 5 nodes; the lease is what is
// asserted: every node's ceiling is its grant and the grants never sum
// above 3), and its view names the coordinator (the primary of shard
// xxhash64(ns) mod S), this node's grant and wants, and the coordinator's
// record of every node.
func TestExactModeAcrossNodes(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 3, nil)
	table := waitConverged(t, nodes)
	tg := newTarget(t)
	tg.SetDelay(40 * time.Millisecond)
	const ns, q, rows = "exact", 3, 90
	nodes[0].setTarget(ns, "default", tg.URL())
	nodes[0].mustDo("PUT", "/v1/namespaces/"+ns, map[string]any{"max_in_flight": q}, http.StatusOK, nil)
	poll.Eventually(t, 5*time.Second, "the target and quota to reach every node", func() (bool, string) {
		for _, n := range nodes {
			// The target and the quota, beside the cluster's replication
			// factor.
			if n.metric("fairshard_cluster_config_entries") != 3 {
				return false, ""
			}
		}
		return true, ""
	})
	coordinator := table[shards.ShardOf(ns, 1024)]
	// Wait for the coordinator's learning period (one lease, 1 s in these
	// tests) to end, so the drain below measures the steady protocol.
	poll.Eventually(t, 10*time.Second, fmt.Sprintf("the coordinator of %s to stop learning", ns), func() (bool, string) {
		var v leaseNSView
		nodes[0].mustDo(http.MethodGet, "/v1/namespaces/"+ns, nil, http.StatusOK, &v)
		return v.Lease != nil && v.Lease.Cluster != nil && !v.Lease.Cluster.Learning, ""
	})

	var in []rowIn
	for i := range rows {
		in = append(in, rowIn{"dispatch_key": fmt.Sprintf("exact-%03d", i), "namespace": ns})
	}
	nodes[1].appendRows(in...)
	// Midway, every node's view agrees on the coordinator, and the
	// coordinator's record never holds more than q.
	poll.Eventually(t, 10*time.Second, "a third of the rows to be delivered", func() (bool, string) { return tg.Delivered() >= rows/3, "" })
	for _, n := range nodes {
		var v leaseNSView
		n.mustDo(http.MethodGet, "/v1/namespaces/"+ns, nil, http.StatusOK, &v)
		if v.Mode != "exact" || !v.ModeDefault || v.Lease == nil || v.Lease.Coordinator != coordinator {
			t.Fatalf("%s's view: mode %q (default %v), lease %+v; want exact by default, coordinator %s", n.Name(), v.Mode, v.ModeDefault, v.Lease, coordinator)
		}
		if v.Ceiling != v.Lease.Grant || v.Ceiling > q {
			t.Errorf("%s: ceiling %d, grant %d: want the ceiling to be the grant, ≤ %d", n.Name(), v.Ceiling, v.Lease.Grant, q)
		}
		if c := v.Lease.Cluster; c == nil || c.Outstanding > q {
			t.Errorf("%s: coordinator's view %+v (error %q): want it, outstanding ≤ %d", n.Name(), c, v.Lease.ClusterError, q)
		}
	}
	poll.Eventually(t, 30*time.Second, fmt.Sprintf("all %d rows to be delivered", rows), func() (bool, string) { return tg.Distinct() == rows, fmt.Sprintf("got %d", tg.Distinct()) })
	for _, r := range tg.Namespaces() {
		if r.Namespace == ns && (r.MaxInFlight > q || r.MaxInFlight < 2) {
			t.Errorf("the target saw up to %d rows of %s at once, want at most the quota %d (and more than 1: the quota is used)", r.MaxInFlight, ns, q)
		}
	}
	var calls float64
	for _, n := range nodes {
		calls += n.metric("fairshard_lease_calls_total")
	}
	if calls == 0 {
		t.Error("no lease call was counted (fairshard_lease_calls_total)")
	}
}

// TestQuotaModeSetting covers the mode field of PUT /v1/namespaces/{ns}:
// "exact" and "proportional" are stored and shown, null returns to the
// node default, anything else is a 400 naming "mode" that changes nothing.
// In proportional mode the ceiling is the seed's ceil(quota × owned/total)
// and the view has no lease.
func TestQuotaModeSetting(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(c *node.Config) { c.DefaultMaxInFlight = 64 })
	put := func(body string, want int) leaseNSView {
		t.Helper()
		var v leaseNSView
		st, b := n.do("PUT", "/v1/namespaces/m", body)
		if st != want {
			t.Fatalf("PUT %s: status %d, want %d: %s", body, st, want, b)
		}
		if want == http.StatusOK {
			mustUnmarshal(t, b, &v)
		} else if !strings.Contains(string(b), `"field":"mode"`) {
			t.Fatalf("PUT %s: error %s does not name the field mode", body, b)
		}
		return v
	}
	if v := put(`{"mode":"proportional","max_in_flight":8}`, 200); v.Mode != "proportional" || v.ModeDefault || v.Ceiling != 8 || v.Lease != nil {
		t.Fatalf("proportional: %+v", v)
	}
	for _, bad := range []string{`{"mode":"Exact"}`, `{"mode":""}`, `{"mode":3}`, `{"mode":"exact ","max_in_flight":9}`} {
		put(bad, http.StatusBadRequest)
	}
	if v := n.namespace("m"); v.MaxInFlight != 8 {
		t.Fatalf("a refused PUT changed max_in_flight: %+v", v)
	}
	var v leaseNSView
	n.mustDo(http.MethodGet, "/v1/namespaces/m", nil, http.StatusOK, &v)
	if v.Mode != "proportional" {
		t.Fatalf("mode after refused PUTs: %q", v.Mode)
	}
	if v := put(`{"mode":"exact"}`, 200); v.Mode != "exact" || v.ModeDefault || v.Lease == nil || v.Lease.Coordinator != n.Name() {
		t.Fatalf("exact: %+v lease %+v", v, v.Lease)
	}
	if v := put(`{"mode":null}`, 200); v.Mode != "exact" || !v.ModeDefault {
		t.Fatalf("mode null: %+v, want the node default (exact)", v)
	}
}

// TestInternalLeaseRoute covers POST /internal/v1/leases: an unsigned
// call is refused (node-to-node authentication), a signed malformed
// request is a 400 naming the field, and a signed valid one is answered
// for every namespace asked.
func TestInternalLeaseRoute(t *testing.T) {
	t.Parallel()
	const secret = "cluster-secret-0123456789"
	n := startNode(t, func(c *node.Config) { c.ClusterSecret = secret })
	signed := signedClient(t, secret)
	if st, _ := n.doAuth("POST", "/internal/v1/leases", `{"node":"x","epoch":0,"namespaces":[]}`, ""); st != http.StatusUnauthorized {
		t.Fatalf("unsigned: status %d, want 401", st)
	}
	for body, field := range map[string]string{
		`{"node":"","epoch":0,"namespaces":[]}`:                                                                         "node",
		`{"node":"x","epoch":0,"namespaces":[{"namespace":"a/b","wants":1,"has":0}]}`:                                   "namespaces[0].namespace",
		`{"node":"x","epoch":0,"namespaces":[{"namespace":"a","wants":1,"has":0},{"namespace":"a","wants":1,"has":0}]}`: "namespaces[1].namespace",
		`{"node":"x","epoch":0,"namespaces":[{"namespace":"a","wants":-1,"has":0}]}`:                                    "namespaces[0].wants",
		`{"node":"x","epoch":0,"namespaces":[],"extra":1}`:                                                              "extra",
		`{"node":"x"`: "body",
	} {
		st, b, err := signedDo(signed, "POST", n.base+"/internal/v1/leases", body)
		var e struct {
			Error struct{ Field string } `json:"error"`
		}
		_ = json.Unmarshal(b, &e)
		if err != nil || st != http.StatusBadRequest || e.Error.Field != field {
			t.Errorf("POST %s: status %d field %q (%v), want 400 naming %q: %s", body, st, e.Error.Field, err, field, b)
		}
	}
	req := lease.Request{Node: "peer", Asks: []lease.Ask{{Namespace: "a", Wants: 3}, {Namespace: "b", Wants: 0, Has: 0}}}
	body, _ := lease.EncodeRequest(req)
	st, b, err := signedDo(signed, "POST", n.base+"/internal/v1/leases", string(body))
	if err != nil || st != http.StatusOK {
		t.Fatalf("valid call: status %d (%v): %s", st, err, b)
	}
	resp, err := lease.DecodeResponse(strings.NewReader(string(b)), req)
	if err != nil {
		t.Fatalf("answer %s: %v", b, err)
	}
	// A lone node founded the cluster: it coordinates everything and need
	// not learn, so "a" gets its wants.
	if len(resp.Leases) != 2 || resp.Leases[0].Grant != 3 {
		t.Fatalf("answer %+v, want both namespaces leased, a granted 3", resp)
	}
}
