package replication_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/replication"
	"github.com/fairshard/fairshard/shards"
	"github.com/fairshard/fairshard/transfer"
)

// rowsOf makes n rows whose shards' primary is member in c's current
// view (keys prefix-i, skipping the others).
func rowsOf(c *tcluster, member, prefix string, n int) []outbox.Row {
	c.t.Helper()
	v := c.view(member)
	var out []outbox.Row
	for i := 0; len(out) < n; i++ {
		r := rowsFor(fmt.Sprintf("%s%d", prefix, i), 1, time.Now().UTC())[0]
		if v.Sets[shards.ShardOf(r.DispatchKey, c.shards)][0] == member {
			out = append(out, r)
		}
	}
	return out
}

// TestWriteRefusesWhatItDoesNotCoordinate: Write takes only rows whose
// replica sets include this node, answers an empty batch with nothing,
// and a node that is leaving coordinates no write.
func TestWriteRefusesWhatItDoesNotCoordinate(t *testing.T) {
	c := newTCluster(t, 16, 1, "a", "b")
	waitSynced(t, c)
	ctx := context.Background()
	a := c.nodes["a"].repl
	out, err := a.Write(ctx, nil)
	if err != nil || out != nil {
		t.Fatalf("Write(nil) = %v, %v; want nothing", out, err)
	}
	rows := rowsOf(c, "b", "elsewhere", 1)
	s := shards.ShardOf(rows[0].DispatchKey, c.shards)
	_, err = a.Write(ctx, rows)
	want := fmt.Sprintf("row %q: shard %d's replica set is [b]", rows[0].DispatchKey, s)
	if !errors.Is(err, replication.ErrNotReplica) || !strings.Contains(err.Error(), want) {
		t.Fatalf("Write of b's row on a: %v, want ErrNotReplica naming %s", err, want)
	}
	if h := c.holders(rows[0].DispatchKey); len(h) != 0 {
		t.Fatalf("refused row held by %v", h)
	}
	mine := rowsOf(c, "a", "here", 3)
	out, err = a.Write(ctx, mine)
	if err != nil || len(out) != 3 || out[0].Copies != 1 || out[0].Node != "a" || out[0].Status != outbox.AppendCreated {
		t.Fatalf("Write of a's rows: %+v, %v", out, err)
	}
	c.leave("a", []string{"b"})
	_, err = a.Write(ctx, rowsOf(c, "b", "late", 1))
	if !errors.Is(err, replication.ErrNotReplica) || !strings.Contains(err.Error(), "this node is not serving a membership view") {
		t.Fatalf("Write on a leaving node: %v, want ErrNotReplica", err)
	}
}

// closedGate refuses every storing call.
type closedGate struct{}

func (closedGate) Enter() bool { return false }
func (closedGate) Exit()       {}

// serve sends one call to h and returns the answer's status and error
// code ("" for a success).
func serve(t *testing.T, h http.Handler, route, contentType, body string) (int, string) {
	t.Helper()
	req := httptest.NewRequest("POST", replication.PathPrefix+route, strings.NewReader(body))
	req.Header.Set("Content-Type", contentType)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req)
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	if w.Code >= 300 {
		if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
			t.Fatalf("%s answered %d with %q: not a JSON error", route, w.Code, w.Body.String())
		}
	}
	return w.Code, e.Error.Code
}

// TestRoutesAnswerRefusalsAsTheAPIDoes: every route's refusals carry the
// status and code the senders act on (retry, next replica, give up).
func TestRoutesAnswerRefusalsAsTheAPIDoes(t *testing.T) {
	c := newTCluster(t, 16, 1, "a", "b")
	waitSynced(t, c)
	a := c.nodes["a"].repl
	open := replication.Handler(a, nil, nil)
	batch := func(rows []outbox.Row) string {
		for i := range rows {
			rows[i].Status = outbox.StatusPending
		}
		return string(transfer.EncodeBatch(nil, rows))
	}
	refuse := func(w http.ResponseWriter, _ []outbox.Row, _ bool) bool {
		http.Error(w, `{"error":{"code":"checked","message":"refused by the check"}}`, http.StatusBadRequest)
		return false
	}
	for _, tc := range []struct {
		name      string
		h         http.Handler
		route, ct string
		body      string
		status    int
		code      string
	}{
		{"closed gate, forward", replication.Handler(a, closedGate{}, nil), "forward", transfer.ContentType, batch(rowsOf(c, "a", "g", 1)), 503, "unavailable"},
		{"closed gate, append", replication.Handler(a, closedGate{}, nil), "append", transfer.ContentType, batch(rowsOf(c, "a", "g", 1)), 503, "unavailable"},
		{"closed gate, merge", replication.Handler(a, closedGate{}, nil), "merge", transfer.ContentType, batch(rowsOf(c, "a", "g", 1)), 503, "unavailable"},
		{"forward, wrong content type", open, "forward", "application/json", "[]", 415, "invalid_field"},
		{"append, not a batch", open, "append", transfer.ContentType, "junk", 400, "invalid_field"},
		{"merge, wrong content type", open, "merge", "text/plain", "x", 415, "invalid_field"},
		{"forward, refused by the check", replication.Handler(a, nil, refuse), "forward", transfer.ContentType, batch(rowsOf(c, "a", "f", 1)), 400, "checked"},
		{"append, refused by the check", replication.Handler(a, nil, refuse), "append", transfer.ContentType, batch(rowsOf(c, "a", "f", 1)), 400, "checked"},
		{"merge, refused by the check", replication.Handler(a, nil, refuse), "merge", transfer.ContentType, batch(rowsOf(c, "a", "f", 1)), 400, "checked"},
		{"forward, not a replica", open, "forward", transfer.ContentType, batch(rowsOf(c, "b", "n", 1)), 409, "not_replica"},
		{"forward, stored", open, "forward", transfer.ContentType, batch(rowsOf(c, "a", "ok", 2)), 200, ""},
		{"states, not JSON", open, "states", "application/json", "{", 400, "invalid_json"},
		{"states, unknown field", open, "states", "application/json", `{"nope":1}`, 400, "invalid_json"},
		{"read, not JSON", open, "read", "application/json", "[", 400, "invalid_json"},
		{"read, too many shards", open, "read", "application/json", `{"reads":[` + strings.Repeat(`{"shard":1},`, 4096) + `{"shard":2}],"max_rows":1,"max_bytes":1}`, 400, "invalid_field"},
		{"keys, not JSON", open, "keys", "application/json", "x", 400, "invalid_json"},
		{"rows, not JSON", open, "rows", "application/json", "x", 400, "invalid_json"},
		{"missing, not JSON", open, "missing", "application/json", "x", 400, "invalid_json"},
	} {
		status, code := serve(t, tc.h, tc.route, tc.ct, tc.body)
		if status != tc.status || code != tc.code {
			t.Errorf("%s: %d %q, want %d %q", tc.name, status, code, tc.status, tc.code)
		}
	}
}
