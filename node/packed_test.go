package node_test

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/poll"
)

// TestFinishedRowsPackedAnswerAsBefore: a node packs its finished rows
// into bundles within seconds (so the data file stops growing),
// and a packed row still answers GET /v1/rows/{key} with its status,
// times, attempts, identity and last error (a cancel reason, or the API's
// default one), and still dedupes an append of its key: nothing is
// delivered twice.
func TestFinishedRowsPackedAnswerAsBefore(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	tg := newTarget(t)
	n.setTarget("pk", "q", tg.URL())
	pause(t, []*tnode{n}, "pkc")
	var rows []rowIn
	var keys []string
	for i := range 40 {
		k := fmt.Sprintf("pk-wf-%d:%d", i%4, i)
		rows = append(rows, rowIn{"dispatch_key": k, "workflow_id": fmt.Sprintf("pk-wf-%d", i%4), "ordinal": i,
			"namespace": "pk", "task_queue": "q", "payload": map[string]int{"i": i}})
		keys = append(keys, k)
	}
	for i := range 3 {
		k := fmt.Sprintf("pkc-%d", i)
		rows = append(rows, rowIn{"dispatch_key": k, "namespace": "pkc", "task_queue": "q", "payload": map[string]int{"i": i}})
	}
	n.appendRows(rows...)
	for _, k := range keys {
		n.waitStatus(k, "done", 20*time.Second)
	}
	n.mustDo(http.MethodPost, "/v1/rows/cancel", map[string]any{"dispatch_key": "pkc-0", "reason": "not needed"}, http.StatusOK, nil)
	n.mustDo(http.MethodPost, "/v1/rows/cancel", map[string]any{"dispatch_key": "pkc-1"}, http.StatusOK, nil)
	poll.Eventually(t, 20*time.Second, "the node to pack its 42 finished rows", func() (bool, string) {
		return n.metric("fairshard_store_tombstones_packed_total") >= 42, fmt.Sprintf("packed: %v", n.metric("fairshard_store_tombstones_packed_total"))
	})

	get := func(k string) api.Row {
		t.Helper()
		var v api.Row
		n.mustDo(http.MethodGet, "/v1/rows/"+escapeKey(k), nil, http.StatusOK, &v)
		return v
	}
	for i, k := range keys {
		v := get(k)
		if v.Status != "done" || v.Attempt != 1 || v.CreatedAt.IsZero() || v.FinishedAt == nil || v.FinishedAt.Before(v.CreatedAt) ||
			v.Namespace != "pk" || v.TaskQueue != "q" || v.WorkflowID != fmt.Sprintf("pk-wf-%d", i%4) || v.Ordinal != uint64(i) ||
			v.Payload != nil || v.Version == nil || v.Version.Seq != 2 {
			t.Fatalf("packed done row %s answers %+v", k, v)
		}
	}
	if v := get("pkc-0"); v.Status != "cancelled" || v.LastError != "not needed" || v.FinishedAt == nil {
		t.Fatalf("packed cancelled row with a reason answers %+v", v)
	}
	if v := get("pkc-1"); v.Status != "cancelled" || v.LastError != "cancelled by an operator" || v.FinishedAt == nil {
		t.Fatalf("packed cancelled row answers %+v", v)
	}
	if v := get("pkc-2"); v.Status != "pending" {
		t.Fatalf("the paused row: %+v", v)
	}
	var again []rowIn
	for _, k := range append(keys, "pkc-0", "pkc-1") {
		again = append(again, rowIn{"dispatch_key": k, "namespace": "pk", "task_queue": "q"})
	}
	for _, r := range n.appendRows(again...).Rows {
		if r.Status != "duplicate" {
			t.Fatalf("append of the packed row %s: %s", r.DispatchKey, r.Status)
		}
	}
	if got := tg.Delivered(); got != int64(len(keys)) {
		t.Fatalf("target received %d deliveries, want %d (a packed row must not be delivered again)", got, len(keys))
	}
}
