package node_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/node"
)

// waitingView is GET /v1/rows/{key} with its `waiting` object.
type waitingView struct {
	DispatchKey string `json:"dispatch_key"`
	Status      string `json:"status"`
	Node        string `json:"node"`
	Waiting     *struct {
		Reason       string     `json:"reason"`
		Also         []string   `json:"also"`
		Message      string     `json:"message"`
		Node         string     `json:"node"`
		Owner        string     `json:"owner"`
		Attempt      uint32     `json:"attempt"`
		LastError    string     `json:"last_error"`
		VisibleAfter *time.Time `json:"visible_after"`
		ClaimedAt    *time.Time `json:"claimed_at"`
		Claimed      *int       `json:"claimed"`
		Ceiling      *uint32    `json:"ceiling"`
		Quota        *uint32    `json:"quota"`
		QuotaMode    string     `json:"quota_mode"`
		Coordinator  string     `json:"coordinator"`
		Wants        *uint32    `json:"wants"`
		Host         string     `json:"host"`
		HostLimit    *int       `json:"host_limit"`
		HostInFlight *int       `json:"host_in_flight"`
	} `json:"waiting"`
}

func (n *tnode) waiting(key string) waitingView {
	n.t.Helper()
	var v waitingView
	n.mustDo(http.MethodGet, "/v1/rows/"+escapeKey(key), nil, http.StatusOK, &v)
	return v
}

// waitReason polls the row's lookup until its waiting reason is want.
func (n *tnode) waitReason(key, want string) waitingView {
	n.t.Helper()
	var v waitingView
	poll.Eventually(n.t, 10*time.Second, fmt.Sprintf("row %q to wait for %q", key, want), func() (bool, string) {
		v = n.waiting(key)
		return v.Waiting != nil && v.Waiting.Reason == want, fmt.Sprintf("last: %+v", v.Waiting)
	})
	if v.Waiting.Message == "" || v.Waiting.Node != n.Name() {
		n.t.Fatalf("row %q: waiting %+v: want a message and node %s", key, v.Waiting, n.Name())
	}
	return v
}

// TestRowWaiting puts a row in each state a real node (boltstore, real
// HTTP targets) can hold it in and asserts the reason its lookup gives.
// The claimable and in-transfer states last one sweep or one handoff on a
// live node; internal/waiting's table test covers them.
func TestRowWaiting(t *testing.T) {
	t.Parallel()
	// One connection per target host: the host ceiling shows with 2 rows.
	n := startNode(t, func(c *node.Config) { c.Dispatch.MaxConnsPerHost = 1 })
	ok := newTarget(t)
	failing := newTarget(t)
	failing.SetStatus(http.StatusInternalServerError)
	release := make(chan struct{})
	blocking := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(blocking.Close)
	t.Cleanup(func() { close(release) }) // runs before blocking.Close and the node's close

	// No target: the route has none and the node no default.
	n.appendRows(rowIn{"dispatch_key": "nt:1", "namespace": "notarget"})
	v := n.waitReason("nt:1", "no_target")
	if v.Status != "pending" || v.Waiting.Ceiling == nil {
		t.Fatalf("no_target row: %+v (want pending, with the ceiling numbers)", v)
	}

	// Paused namespace (with a target): paused is checked first.
	n.setTarget("pz", "default", ok.URL())
	pause(t, []*tnode{n}, "pz")
	n.appendRows(rowIn{"dispatch_key": "pz:1", "namespace": "pz"})
	if v := n.waitReason("pz:1", "namespace_paused"); len(v.Waiting.Also) != 0 {
		t.Errorf("paused row: also %v, want nothing (the pause zeroes the ceiling; it is not a second cause)", v.Waiting.Also)
	}

	// Held workflow.
	n.setTarget("hw", "default", ok.URL())
	n.mustDo(http.MethodPut, "/v1/workflows/wf-held/hold", nil, http.StatusOK, nil)
	n.appendRows(rowIn{"workflow_id": "wf-held", "ordinal": 1, "namespace": "hw"})
	n.waitReason("wf-held:1", "workflow_held")
	// Released, it is delivered.
	n.mustDo(http.MethodDelete, "/v1/workflows/wf-held/hold", nil, http.StatusOK, nil)
	n.waitStatus("wf-held:1", "done", 10*time.Second)
	if v := n.waiting("wf-held:1"); v.Waiting != nil {
		t.Fatalf("a done row has waiting %+v", v.Waiting)
	}

	// Delayed.
	n.setTarget("late", "default", ok.URL())
	n.appendRows(rowIn{"dispatch_key": "late:1", "namespace": "late", "delay_ms": 600_000})
	v = n.waitReason("late:1", "delayed")
	if v.Waiting.VisibleAfter == nil || time.Until(*v.Waiting.VisibleAfter) < 9*time.Minute {
		t.Fatalf("delayed row: visible_after %v, want ~10 min ahead", v.Waiting.VisibleAfter)
	}
	if len(v.Waiting.Also) != 0 {
		t.Errorf("delayed row: also %v, want nothing (its node asks no lease for it)", v.Waiting.Also)
	}

	// Retry backoff: the target answers 500, the next attempt is a minute out.
	n.setTarget("retry", "default", failing.URL())
	n.mustDo(http.MethodPut, "/v1/namespaces/retry", map[string]any{"retry": map[string]any{"base_ms": 60_000, "max_attempts": 5}}, http.StatusOK, nil)
	n.appendRows(rowIn{"dispatch_key": "retry:1", "namespace": "retry"})
	v = n.waitReason("retry:1", "retry_backoff")
	if v.Waiting.Attempt != 2 || v.Waiting.LastError == "" || v.Waiting.VisibleAfter == nil {
		t.Fatalf("retry row: %+v, want attempt 2, the last error and the next attempt's time", v.Waiting)
	}

	// Claimed, then the namespace at its ceiling (quota 1, one node: 1).
	n.setTarget("cap", "default", blocking.URL)
	n.mustDo(http.MethodPut, "/v1/namespaces/cap", map[string]any{"max_in_flight": 1}, http.StatusOK, nil)
	n.appendRows(rowIn{"dispatch_key": "cap:1", "namespace": "cap"})
	v = n.waitReason("cap:1", "claimed")
	if v.Status != "claimed" || v.Waiting.ClaimedAt == nil {
		t.Fatalf("claimed row: %+v", v)
	}
	n.appendRows(rowIn{"dispatch_key": "cap:2", "namespace": "cap"})
	v = n.waitReason("cap:2", "namespace_at_ceiling")
	if *v.Waiting.Claimed != 1 || *v.Waiting.Ceiling != 1 || *v.Waiting.Quota != 1 {
		t.Fatalf("at-ceiling row: claimed %d ceiling %d quota %d, want 1, 1, 1", *v.Waiting.Claimed, *v.Waiting.Ceiling, *v.Waiting.Quota)
	}
	// The default mode is exact: the ceiling is this node's lease grant
	// from itself (the one member coordinates every namespace), and the
	// sentence gives the grant, not the proportional formula.
	if w := v.Waiting; w.QuotaMode != "exact" || w.Coordinator != n.Name() || w.Wants == nil || *w.Wants < 1 ||
		!strings.Contains(w.Message, "lease grant is 1 of the exact quota 1 (coordinator "+n.Name()+";") {
		t.Fatalf("at-ceiling row in exact mode: mode %q coordinator %q wants %v message %q", w.QuotaMode, w.Coordinator, w.Wants, w.Message)
	}

	// The target host's slots: the blocking host (limit 1) holds cap:1; a
	// second namespace gets its guaranteed share of it (hf:1, in flight),
	// then its next row waits for a slot at the host.
	n.setTarget("hf", "default", blocking.URL)
	n.appendRows(rowIn{"dispatch_key": "hf:1", "namespace": "hf"})
	n.waitReason("hf:1", "claimed")
	n.appendRows(rowIn{"dispatch_key": "hf:2", "namespace": "hf"})
	v = n.waitReason("hf:2", "host_slots_full")
	if v.Waiting.Host == "" || v.Waiting.HostLimit == nil || *v.Waiting.HostLimit != 1 || *v.Waiting.HostInFlight != 2 {
		t.Fatalf("host-full row: %+v, want the host, limit 1 and 2 in flight", v.Waiting)
	}
}

// TestRowWaitingThroughPeer: a lookup through a node that does not hold
// the row answers the holder's explanation.
func TestRowWaitingThroughPeer(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 2, nil)
	pause(t, nodes, "pp")
	var key string
	for i := 0; key == ""; i++ {
		k := "pp:" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		out := nodes[0].appendRows(rowIn{"dispatch_key": k, "namespace": "pp"})
		if out.Rows[0].Node == nodes[1].Name() {
			key = k
		}
	}
	v := nodes[0].waiting(key)
	if v.Waiting == nil || v.Waiting.Reason != "namespace_paused" || v.Waiting.Node != nodes[1].Name() || v.Waiting.Owner != nodes[1].Name() {
		t.Fatalf("lookup through %s of a row on %s: %+v", nodes[0].Name(), nodes[1].Name(), v.Waiting)
	}
}
