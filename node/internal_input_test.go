package node_test

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/node"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/replication"
	"github.com/fairshard/fairshard/shards"
	"github.com/fairshard/fairshard/transfer"
)

// TestInternalInputValidated: every node-to-node route refuses what the
// public API refuses (sizes, names, control characters, attempt and time
// bounds, statuses, versions), 4xx naming the row and field, and stores
// nothing of the batch (its valid first row included). Calls are signed
// with the cluster secret, as a member's: the checks hold even against a
// member. A handoff row marked done without a version leaves the live row
// pending.
func TestInternalInputValidated(t *testing.T) {
	t.Parallel()
	const secret = "cluster-secret-0123456789"
	n := startNode(t, func(c *node.Config) { c.ClusterSecret = secret })
	signed := signedClient(t, secret)
	pause(t, []*tnode{n}, "ns")
	n.appendRows(rowIn{"dispatch_key": "K", "namespace": "ns"})

	// A copy marking K done without a version, on replication's merge
	// route: unsigned it is refused 401, signed 400.
	mergePath := replication.PathPrefix + "merge"
	repro := transfer.EncodeBatch(nil, []outbox.Row{{DispatchKey: "K", Namespace: "ns", TaskQueue: "default", Status: outbox.StatusDone,
		Attempt: 1, Shard: shards.ShardOf("K", 1024), CreatedAt: time.Now().UTC(), VisibleAfter: time.Now().UTC()}})
	req, _ := http.NewRequest("POST", n.base+mergePath, bytes.NewReader(repro))
	req.Header.Set("Content-Type", transfer.ContentType)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("unsigned merge marking K done: %v %v, want 401", resp, err)
	} else {
		resp.Body.Close()
	}
	req, _ = http.NewRequest("POST", n.base+mergePath, bytes.NewReader(repro))
	req.Header.Set("Content-Type", transfer.ContentType)
	resp, err := signed.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b := readAll(t, resp)
	resp.Body.Close()
	wantError(t, resp.StatusCode, b, http.StatusBadRequest, api.CodeInvalidField, "rows[0].version")
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
		handoff bool // only the copy routes read it (status, version, shard)
		// absolute: a created_at bound; forwarded rows carry relative
		// times (stamped by the receiver), so the forward route has none.
		absolute bool
	}
	cases := []tc{
		{"dispatch_key of 4000 bytes", func(r *outbox.Row) {
			r.DispatchKey = strings.Repeat("k", 4000)
			r.Shard = shards.ShardOf(r.DispatchKey, 1024)
		}, 400, "rows[1].dispatch_key", false, false},
		{"control character in dispatch_key", func(r *outbox.Row) { r.DispatchKey += "\x01"; r.Shard = shards.ShardOf(r.DispatchKey, 1024) }, 400, "rows[1].dispatch_key", false, false},
		{"namespace ../../x y\\r\\n", func(r *outbox.Row) { r.Namespace = "../../x y\r\n" }, 400, "rows[1].namespace", false, false},
		{"empty namespace", func(r *outbox.Row) { r.Namespace = "" }, 400, "rows[1].namespace", false, false},
		{"task_queue of 65 bytes", func(r *outbox.Row) { r.TaskQueue = strings.Repeat("q", 65) }, 400, "rows[1].task_queue", false, false},
		{"workflow_id of 200 bytes", func(r *outbox.Row) { r.WorkflowID = strings.Repeat("w", 200) }, 400, "rows[1].workflow_id", false, false},
		{"activity_type with a newline", func(r *outbox.Row) { r.ActivityType = "a\nb" }, 400, "rows[1].activity_type", false, false},
		{"content_type not a media type", func(r *outbox.Row) { r.ContentType = "not a type" }, 400, "rows[1].content_type", false, false},
		{"payload over 1 MiB", func(r *outbox.Row) { r.Payload = bytes.Repeat([]byte("x"), 1<<20+1) }, 413, "rows[1].payload", false, false},
		{"attempt 4e9", func(r *outbox.Row) { r.Attempt = 4_000_000_000 }, 400, "rows[1].attempt", false, false},
		{"visible_after in 9999", func(r *outbox.Row) { r.VisibleAfter = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC) }, 400, "rows[1].visible_after", false, false},
		{"created_at in 1970", func(r *outbox.Row) { r.CreatedAt = time.Unix(1, 0).UTC() }, 400, "rows[1].created_at", false, true},
		{"created_at next year", func(r *outbox.Row) { r.CreatedAt = now.AddDate(1, 0, 0) }, 400, "rows[1].created_at", false, true},
		{"last_error of 5000 bytes", func(r *outbox.Row) { r.LastError = strings.Repeat("e", 5000) }, 400, "rows[1].last_error", false, false},
		{"done without a version", func(r *outbox.Row) { r.Status, r.Version = outbox.StatusDone, outbox.Version{} }, 400, "rows[1].version", true, false},
		{"done at the first version", func(r *outbox.Row) { r.Status = outbox.StatusDone }, 400, "rows[1].status", true, false},
		{"wrong shard", func(r *outbox.Row) { r.Shard = (r.Shard + 1) % 1024 }, 400, "rows[1].shard", true, false},
	}
	for i, c := range cases {
		first, bad := good(fmt.Sprintf("iv-first-%d", i)), good(fmt.Sprintf("iv-bad-%d", i))
		c.mutate(&bad)
		rows := []outbox.Row{first, bad}
		type route struct {
			path, ct string
			body     []byte
		}
		batch := transfer.EncodeBatch(nil, rows)
		routes := []route{{replication.PathPrefix + "merge", transfer.ContentType, batch},
			{replication.PathPrefix + "append", transfer.ContentType, batch}}
		if !c.handoff && !c.absolute {
			routes = append(routes, route{replication.PathPrefix + "forward", transfer.ContentType, batch})
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
			code := api.CodeInvalidField
			if c.status == 413 {
				code = api.CodeTooLarge
			}
			t.Run(c.name+" "+r.path+" "+r.ct, func(t *testing.T) { wantError(t, resp.StatusCode, b, c.status, code, c.field) })
		}
		wantNotStored(t, n, first.DispatchKey)
		if len(bad.DispatchKey) <= 512 { // a longer key cannot even be asked for
			wantNotStored(t, n, bad.DispatchKey)
		}
	}
	// Malformed batches on every write route.
	for _, route := range []string{"forward", "append", "merge"} {
		for _, body := range []string{`{"rows":[`, "FSB\x00garbage", ""} {
			req, _ := http.NewRequest("POST", n.base+replication.PathPrefix+route, strings.NewReader(body))
			req.Header.Set("Content-Type", transfer.ContentType)
			resp, err := signed.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b := readAll(t, resp)
			resp.Body.Close()
			wantError(t, resp.StatusCode, b, http.StatusBadRequest, api.CodeInvalidField, "")
		}
	}
	// A forward over its body limit (16 MiB) is refused whole.
	huge := good("iv-huge")
	huge.Payload = bytes.Repeat([]byte("A"), 20<<20)
	req, _ = http.NewRequest("POST", n.base+replication.PathPrefix+"forward", bytes.NewReader(transfer.EncodeBatch(nil, []outbox.Row{huge})))
	req.Header.Set("Content-Type", transfer.ContentType)
	resp, err = signed.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b = readAll(t, resp)
	resp.Body.Close()
	wantError(t, resp.StatusCode, b, http.StatusRequestEntityTooLarge, api.CodeTooLarge, "")
	wantNotStored(t, n, "iv-huge")
	for _, p := range []string{"/internal/v1/namespaces/..%2F..%2Fx%20y/dead-letters", "/internal/v1/rows/" + strings.Repeat("k", 600)} {
		st, b, err := signedDo(signed, "GET", n.base+p, nil)
		if err != nil {
			t.Fatal(err)
		}
		wantError(t, st, b, http.StatusBadRequest, api.CodeInvalidField, "")
	}
}
