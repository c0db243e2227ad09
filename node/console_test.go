package node_test

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/node"
)

type rowsPageView struct {
	Rows             []rowView `json:"rows"`
	Next             string    `json:"next"`
	UnreachableNodes []string  `json:"unreachable_nodes"`
}

type nsClusterView struct {
	nsView
	Cluster struct {
		Pending          int      `json:"pending"`
		Claimed          int      `json:"claimed"`
		DeadLetters      int      `json:"dead_letters"`
		DeliveredTotal   uint64   `json:"delivered_total"`
		UnreachableNodes []string `json:"unreachable_nodes"`
		Nodes            []struct {
			Node               string  `json:"node"`
			Pending            int     `json:"pending"`
			DeadLetters        int     `json:"dead_letters"`
			DeliveredTotal     uint64  `json:"delivered_total"`
			DeliveryP99Seconds float64 `json:"delivery_p99_seconds"`
		} `json:"nodes"`
	} `json:"cluster"`
}

// TestReadBack: on a real 2-node cluster, targets (redacted) and holds
// read back and list, a namespace's rows list across both nodes with
// cursor paging and filters, a pending row held by the other node is
// cancelled, dead letters on both nodes are purged with one count, the
// namespace view sums both nodes, and a row lookup shows its attempts.
func TestReadBack(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 2, nil)
	a, b := nodes[0], nodes[1]
	ok := newTarget(t)

	// Targets read back, secrets redacted; holds too.
	// Credentials (a signing secret, an Authorization header) read back by
	// fingerprint and name only.
	const signingSecret = "whsec_a2tra2tra2tra2tra2tra2tra2tra2tr"
	a.mustDo(http.MethodPut, "/v1/namespaces/rb/task-queues/q/target", map[string]any{"url": ok.URL() + "/x?token=s3cret&page=1", "timeout_ms": 1500,
		"signing_secret": signingSecret, "headers": map[string]string{"Authorization": "Bearer hdr-s3cret"}}, http.StatusOK, nil)
	var tv struct {
		URL          string   `json:"url"`
		TimeoutMS    int64    `json:"timeout_ms"`
		Fingerprints []string `json:"signing_secret_fingerprints"`
		HeaderNames  []string `json:"header_names"`
		Source       string   `json:"source"`
	}
	poll.Eventually(t, 5*time.Second, fmt.Sprintf("the target to reach %s", b.Name()), func() (bool, string) {
		st, _ := b.getJSON("/v1/namespaces/rb/task-queues/q/target", &tv)
		return st == http.StatusOK, ""
	})
	if strings.Contains(tv.URL, "s3cret") || !strings.Contains(tv.URL, "token=REDACTED") || tv.TimeoutMS != 1500 || tv.Source != "route" ||
		len(tv.Fingerprints) != 1 || len(tv.Fingerprints[0]) != 8 || len(tv.HeaderNames) != 1 || tv.HeaderNames[0] != "Authorization" {
		t.Fatalf("target read back: %+v", tv)
	}
	for _, path := range []string{"/v1/namespaces/rb/task-queues/q/target", "/v1/targets"} {
		_, raw := b.do(http.MethodGet, path, nil)
		if strings.Contains(string(raw), "s3cret") || strings.Contains(string(raw), "a2tra2tr") {
			t.Fatalf("GET %s shows a credential: %s", path, raw)
		}
	}
	st, body := a.do(http.MethodGet, "/v1/namespaces/rb/task-queues/none/target", nil)
	wantError(t, st, body, http.StatusNotFound, "not_found", "")
	var tl struct {
		Targets []struct{ Namespace, TaskQueue, URL string } `json:"targets"`
	}
	a.mustDo(http.MethodGet, "/v1/targets", nil, http.StatusOK, &tl)
	if len(tl.Targets) != 1 || strings.Contains(tl.Targets[0].URL, "s3cret") {
		t.Fatalf("targets: %+v", tl)
	}
	a.mustDo(http.MethodPut, "/v1/workflows/wf-rb/hold", nil, http.StatusOK, nil)
	var holds struct {
		Holds []struct {
			WorkflowID string `json:"workflow_id"`
		} `json:"holds"`
	}
	poll.Eventually(t, 5*time.Second, fmt.Sprintf("the hold to list on %s", b.Name()), func() (bool, string) {
		b.mustDo(http.MethodGet, "/v1/holds", nil, http.StatusOK, &holds)
		return len(holds.Holds) == 1 && holds.Holds[0].WorkflowID == "wf-rb", ""
	})

	// 40 pending rows (the namespace is paused) over both nodes.
	pause(t, nodes, "rb")
	var want []string
	var rows []rowIn
	onB := ""
	for i := range 40 {
		k := fmt.Sprintf("rb-%02d", i)
		want = append(want, k)
		rows = append(rows, rowIn{"dispatch_key": k, "namespace": "rb", "task_queue": []string{"q", "r"}[i%2], "workflow_id": "wf-" + []string{"x", "y", "z"}[i%3], "ordinal": i})
	}
	for _, r := range a.appendRows(rows...).Rows {
		if r.Node == b.Name() && onB == "" {
			onB = r.DispatchKey
		}
	}
	if onB == "" {
		t.Fatal("no row of 40 landed on the second node")
	}
	var seen []string
	after, pages := "", 0
	for {
		var p rowsPageView
		a.mustDo(http.MethodGet, "/v1/namespaces/rb/rows?limit=7&after="+after, nil, http.StatusOK, &p)
		pages++
		for _, r := range p.Rows {
			seen = append(seen, r.DispatchKey)
		}
		if p.Next == "" {
			break
		}
		after = p.Next
	}
	if !slices.Equal(seen, want) || pages != 6 {
		t.Fatalf("paging by 7: %d pages, rows %v; want 6 pages of %v", pages, seen, want)
	}
	var p rowsPageView
	b.mustDo(http.MethodGet, "/v1/namespaces/rb/rows?task_queue=r&workflow_id=wf-y&status=pending", nil, http.StatusOK, &p)
	for _, r := range p.Rows {
		if r.TaskQueue != "r" || r.WorkflowID != "wf-y" || r.Status != "pending" {
			t.Fatalf("filtered listing gave %+v", r)
		}
	}
	if len(p.Rows) != 7 { // i odd and i%3 == 1: 1, 7, 13, 19, 25, 31, 37
		t.Fatalf("filtered listing: %d rows, want 7", len(p.Rows))
	}
	st, body = a.do(http.MethodGet, "/v1/namespaces/rb/rows?status=lost", nil)
	wantError(t, st, body, http.StatusBadRequest, "invalid_field", "status")

	// Cancel, through a, a row held by b.
	var cr struct {
		Cancelled bool    `json:"cancelled"`
		Message   string  `json:"message"`
		Row       rowView `json:"row"`
	}
	a.mustDo(http.MethodPost, "/v1/rows/cancel", map[string]any{"dispatch_key": onB, "reason": "not needed"}, http.StatusOK, &cr)
	if !cr.Cancelled || cr.Row.Status != "cancelled" || cr.Row.Node != b.Name() || cr.Row.LastError != "not needed" {
		t.Fatalf("cancel of %s (on %s): %+v", onB, b.Name(), cr)
	}
	a.mustDo(http.MethodPost, "/v1/rows/cancel", map[string]any{"dispatch_key": onB}, http.StatusOK, &cr)
	if cr.Cancelled || !strings.Contains(cr.Message, "cancelled") {
		t.Fatalf("second cancel: %+v, want not cancelled, saying why", cr)
	}
	st, body = a.do(http.MethodPost, "/v1/rows/cancel", map[string]any{"dispatch_key": "rb-missing"})
	wantError(t, st, body, http.StatusNotFound, "not_found", "")

	// Dead letters on both nodes (the target answers 400), purged at once.
	bad := newTarget(t)
	bad.SetStatus(http.StatusBadRequest)
	a.setTarget("dl", "default", bad.URL())
	var dlRows []rowIn
	for i := range 20 {
		dlRows = append(dlRows, rowIn{"dispatch_key": fmt.Sprintf("dl-%02d", i), "namespace": "dl"})
	}
	a.appendRows(dlRows...)
	var ns nsClusterView
	poll.Eventually(t, 15*time.Second, "20 dead letters cluster-wide", func() (bool, string) {
		a.mustDo(http.MethodGet, "/v1/namespaces/dl", nil, http.StatusOK, &ns)
		return ns.Cluster.DeadLetters == 20, fmt.Sprintf("have %+v", ns.Cluster)
	})
	if len(ns.Cluster.Nodes) != 2 || ns.Cluster.Nodes[0].DeadLetters+ns.Cluster.Nodes[1].DeadLetters != 20 ||
		ns.Cluster.Nodes[0].DeadLetters == 0 || ns.Cluster.Nodes[1].DeadLetters == 0 || ns.DeadLetters == 20 || len(ns.Cluster.UnreachableNodes) != 0 {
		t.Fatalf("namespace view: node %s has %d, cluster %+v; want both nodes' dead letters summed", ns.Node, ns.DeadLetters, ns.Cluster)
	}
	var lookup struct {
		Attempts []struct {
			Attempt    uint32 `json:"attempt"`
			Outcome    string `json:"outcome"`
			StatusCode int    `json:"status_code"`
			Error      string `json:"error"`
		} `json:"attempts"`
	}
	a.mustDo(http.MethodGet, "/v1/rows/dl-00", nil, http.StatusOK, &lookup)
	if len(lookup.Attempts) != 1 || lookup.Attempts[0].Outcome != "failed" || lookup.Attempts[0].Attempt != 1 || lookup.Attempts[0].Error == "" ||
		lookup.Attempts[0].StatusCode != http.StatusBadRequest {
		t.Fatalf("attempts of a dead letter: %+v", lookup.Attempts)
	}
	var purged struct {
		Purged           int      `json:"purged"`
		UnreachableNodes []string `json:"unreachable_nodes"`
	}
	b.mustDo(http.MethodPost, "/v1/namespaces/dl/dead-letters/purge", nil, http.StatusOK, &purged)
	if purged.Purged != 20 || len(purged.UnreachableNodes) != 0 {
		t.Fatalf("purge: %+v, want 20", purged)
	}
	a.mustDo(http.MethodGet, "/v1/namespaces/dl", nil, http.StatusOK, &ns)
	if ns.Cluster.DeadLetters != 0 {
		t.Fatalf("after the purge: %+v", ns.Cluster)
	}
	if v, _ := a.getRow("dl-03"); v.Status != "cancelled" || !strings.HasPrefix(v.LastError, "purged: ") {
		t.Fatalf("a purged row: %+v", v)
	}
}

// TestCancelReachesTheBackups: with R = 2, a row cancelled through the API
// is cancelled on both replicas, so a failover to the backup cannot
// deliver it. The digest repair would mend the backup eventually; with it
// an hour apart here, only shipping the change can.
func TestCancelReachesTheBackups(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 2, func(_ int, c *node.Config) { c.ReplicationFactor, c.Replication.PollInterval = 2, time.Hour })
	a := nodes[0]
	pause(t, nodes, "cb")
	a.appendRows(rowIn{"dispatch_key": "cb-1", "namespace": "cb"})
	a.mustDo(http.MethodPost, "/v1/rows/cancel", map[string]any{"dispatch_key": "cb-1"}, http.StatusOK, nil)
	for _, n := range nodes {
		poll.Eventually(t, 10*time.Second, fmt.Sprintf("%s's copy of cb-1 to be cancelled", n.Name()), func() (bool, string) {
			var v struct {
				Status string `json:"status"`
			}
			st, _ := n.getJSON("/internal/v1/rows/cb-1", &v)
			return st == http.StatusOK && v.Status == "cancelled", ""
		})
	}
}
