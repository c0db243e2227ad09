package node_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/node"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
	"github.com/fairshard/fairshard/transfer"
)

// TestInternalInputValidated is issue #13 item 3: every node-to-node
// route refuses what the public API refuses (sizes, names, control
// characters, attempt and time bounds, statuses, versions), 4xx naming the
// row and field, and stores nothing of the batch (its valid first row
// included). Calls are signed with the cluster secret, as a member's: the
// checks hold even against a member. The reproducer (a handoff
// row marked done without a version) leaves the live row pending.
func TestInternalInputValidated(t *testing.T) {
	t.Parallel()
	const secret = "cluster-secret-0123456789"
	n := startNode(t, func(c *node.Config) { c.ClusterSecret = secret })
	signed := signedClient(t, secret)
	pause(t, []*tnode{n}, "ns")
	n.appendRows(rowIn{"dispatch_key": "K", "namespace": "ns"})

	// The reproducer: unsigned it is refused 401, signed 400.
	repro := `{"rows":[{"dispatch_key":"K","namespace":"ns","task_queue":"default","status":"done"}]}`
	if st, b := n.doAuth("POST", "/internal/v1/handoff", repro, ""); st != http.StatusUnauthorized {
		t.Errorf("unsigned handoff marking K done: %d %s, want 401", st, b)
	}
	st, b, err := signedDo(signed, "POST", n.base+"/internal/v1/handoff", repro)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, st, b, http.StatusBadRequest, node.CodeInvalidField, "rows[0].version")
	if r, ok := n.getRow("K"); !ok || r.Status != "pending" {
		t.Errorf("K after the reproducer: %+v (found %v), want pending", r, ok)
	}

	now := time.Now().UTC()
	good := func(key string) outbox.Row {
		return outbox.Row{DispatchKey: key, Namespace: "ns", TaskQueue: "q", Status: outbox.StatusPending, Attempt: 1,
			CreatedAt: now, VisibleAfter: now, Shard: shards.ShardOf(key, 1024), Version: outbox.FirstVersion}
	}
	type tc struct {
		name    string
		mutate  func(r *outbox.Row)
		status  int
		field   string
		handoff bool // only the handoff routes read it (status, version, shard)
	}
	cases := []tc{
		{"dispatch_key of 4000 bytes", func(r *outbox.Row) {
			r.DispatchKey = strings.Repeat("k", 4000)
			r.Shard = shards.ShardOf(r.DispatchKey, 1024)
		}, 400, "rows[1].dispatch_key", false},
		{"control character in dispatch_key", func(r *outbox.Row) { r.DispatchKey += "\x01"; r.Shard = shards.ShardOf(r.DispatchKey, 1024) }, 400, "rows[1].dispatch_key", false},
		{"namespace ../../x y\\r\\n", func(r *outbox.Row) { r.Namespace = "../../x y\r\n" }, 400, "rows[1].namespace", false},
		{"empty namespace", func(r *outbox.Row) { r.Namespace = "" }, 400, "rows[1].namespace", false},
		{"task_queue of 65 bytes", func(r *outbox.Row) { r.TaskQueue = strings.Repeat("q", 65) }, 400, "rows[1].task_queue", false},
		{"workflow_id of 200 bytes", func(r *outbox.Row) { r.WorkflowID = strings.Repeat("w", 200) }, 400, "rows[1].workflow_id", false},
		{"activity_type with a newline", func(r *outbox.Row) { r.ActivityType = "a\nb" }, 400, "rows[1].activity_type", false},
		{"content_type not a media type", func(r *outbox.Row) { r.ContentType = "not a type" }, 400, "rows[1].content_type", false},
		{"payload over 1 MiB", func(r *outbox.Row) { r.Payload = bytes.Repeat([]byte("x"), 1<<20+1) }, 413, "rows[1].payload", false},
		{"attempt 4e9", func(r *outbox.Row) { r.Attempt = 4_000_000_000 }, 400, "rows[1].attempt", false},
		{"visible_after in 9999", func(r *outbox.Row) { r.VisibleAfter = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC) }, 400, "rows[1].visible_after", false},
		{"created_at in 1970", func(r *outbox.Row) { r.CreatedAt = time.Unix(1, 0).UTC() }, 400, "rows[1].created_at", false},
		{"created_at next year", func(r *outbox.Row) { r.CreatedAt = now.AddDate(1, 0, 0) }, 400, "rows[1].created_at", false},
		{"last_error of 5000 bytes", func(r *outbox.Row) { r.LastError = strings.Repeat("e", 5000) }, 400, "rows[1].last_error", false},
		{"done without a version", func(r *outbox.Row) { r.Status, r.Version = outbox.StatusDone, outbox.Version{} }, 400, "rows[1].version", true},
		{"done at the first version", func(r *outbox.Row) { r.Status = outbox.StatusDone }, 400, "rows[1].status", true},
		{"wrong shard", func(r *outbox.Row) { r.Shard = (r.Shard + 1) % 1024 }, 400, "rows[1].shard", true},
	}
	for i, c := range cases {
		first, bad := good(fmt.Sprintf("iv-first-%d", i)), good(fmt.Sprintf("iv-bad-%d", i))
		c.mutate(&bad)
		rows := []outbox.Row{first, bad}
		views, _ := json.Marshal(map[string]any{"rows": viewsJSON(rows)})
		type route struct {
			path, ct string
			body     []byte
		}
		routes := []route{{"/internal/v1/handoff", "application/json", views},
			{"/internal/v1/handoff", transfer.ContentType, transfer.EncodeBatch(nil, rows)}}
		if !c.handoff {
			routes = append(routes, route{"/internal/v1/rows", "application/json", views})
		}
		for _, r := range routes {
			req, _ := http.NewRequest("POST", n.base+r.path, bytes.NewReader(r.body))
			req.Header.Set("Content-Type", r.ct)
			resp, err := signed.Do(req)
			if err != nil {
				t.Fatalf("%s %s (%s): %v", c.name, r.path, r.ct, err)
			}
			b := readAll(t, resp)
			resp.Body.Close()
			code := node.CodeInvalidField
			if c.status == 413 {
				code = node.CodeTooLarge
			}
			t.Run(c.name+" "+r.path+" "+r.ct, func(t *testing.T) { wantError(t, resp.StatusCode, b, c.status, code, c.field) })
		}
		wantNotStored(t, n, first.DispatchKey)
		if len(bad.DispatchKey) <= 512 { // a longer key cannot even be asked for
			wantNotStored(t, n, bad.DispatchKey)
		}
	}
	// Malformed bodies on every write route.
	for _, p := range []string{"/internal/v1/rows", "/internal/v1/handoff"} {
		for _, body := range []string{`{"rows":[`, `{"rows":[],"extra":1}`, `[1,2]`} {
			st, b, err := signedDo(signed, "POST", n.base+p, body)
			if err != nil {
				t.Fatal(err)
			}
			wantError(t, st, b, http.StatusBadRequest, node.CodeInvalidJSON, "")
		}
	}
	big := `{"rows":[{"dispatch_key":"iv-huge","payload_base64":"` + strings.Repeat("A", 30<<20) + `"}]}`
	st, b, err = signedDo(signed, "POST", n.base+"/internal/v1/rows", big)
	if err != nil {
		t.Fatal(err)
	}
	wantError(t, st, b, http.StatusRequestEntityTooLarge, node.CodeTooLarge, "body")
	wantNotStored(t, n, "iv-huge")
	for _, p := range []string{"/internal/v1/namespaces/..%2F..%2Fx%20y/dead-letters", "/internal/v1/rows/" + strings.Repeat("k", 600)} {
		st, b, err := signedDo(signed, "GET", n.base+p, nil)
		if err != nil {
			t.Fatal(err)
		}
		wantError(t, st, b, http.StatusBadRequest, node.CodeInvalidField, "")
	}
}

// viewsJSON is rows as peer.RowView JSON (what nodes send each other).
func viewsJSON(rows []outbox.Row) []map[string]any {
	var out []map[string]any
	for _, r := range rows {
		v := map[string]any{"dispatch_key": r.DispatchKey, "namespace": r.Namespace, "task_queue": r.TaskQueue,
			"status": r.Status, "attempt": r.Attempt, "visible_after": r.VisibleAfter, "created_at": r.CreatedAt,
			"shard": r.Shard, "payload_base64": r.Payload}
		for k, s := range map[string]string{"workflow_id": r.WorkflowID, "activity_type": r.ActivityType, "content_type": r.ContentType, "last_error": r.LastError} {
			if s != "" {
				v[k] = s
			}
		}
		if !r.Version.IsZero() {
			v["version"] = r.Version
		}
		out = append(out, v)
	}
	return out
}
