package node_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/node"
)

// badAppend is one refused POST /v1/rows: the body, the expected status,
// code and field, and the dispatch_keys of the batch's other (valid) rows,
// none of which may be stored.
type badAppend struct {
	name   string
	body   any
	status int
	code   string
	field  string
	keys   []string
}

// batch builds {"rows":[…]}: valid rows prefix-0 … prefix-(good-1), then
// bad (if not nil), then one more valid row, so a partial write would show.
func batch(prefix string, good int, bad rowIn) (map[string]any, []string) {
	var rows []rowIn
	var keys []string
	for i := range good {
		k := fmt.Sprintf("%s-%d", prefix, i)
		rows = append(rows, rowIn{"dispatch_key": k, "namespace": "val", "payload": map[string]int{"i": i}})
		keys = append(keys, k)
	}
	if bad != nil {
		rows = append(rows, bad)
	}
	last := prefix + "-last"
	rows = append(rows, rowIn{"dispatch_key": last})
	keys = append(keys, last)
	return map[string]any{"rows": rows}, keys
}

// rawBatch is batch with the bad row given as JSON text (large rows are
// cheaper to build this way than through encoding/json).
func rawBatch(prefix string, good int, bad string) ([]byte, []string) {
	body, keys := batch(prefix, good, rowIn{})
	b, err := json.Marshal(body)
	if err != nil {
		panic(err)
	}
	return bytes.Replace(b, []byte("{}"), []byte(bad), 1), keys
}

func invalidField(name string, good int, bad rowIn, field string) badAppend {
	body, keys := batch(name, good, bad)
	return badAppend{name: name, body: body, status: http.StatusBadRequest, code: api.CodeInvalidField, field: field, keys: keys}
}

// TestAppendRefusesBadBatches covers every rule of node/appendreq.go: each
// bad batch is answered 4xx with a JSON error naming the field, and none of
// its rows (valid ones included) is stored.
func TestAppendRefusesBadBatches(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)

	long := func(n int) string { return strings.Repeat("x", n) }
	cases := []badAppend{
		{name: "malformed JSON", body: `{"rows":[{"dispatch_key":"mal-0"},`, status: 400, code: api.CodeInvalidJSON, field: "body", keys: []string{"mal-0"}},
		{name: "empty body", body: ``, status: 400, code: api.CodeInvalidJSON, field: "body"},
		{name: "array body", body: `[{"dispatch_key":"arr-0"}]`, status: 400, code: api.CodeInvalidJSON, field: "body", keys: []string{"arr-0"}},
		{name: "trailing garbage", body: `{"rows":[{"dispatch_key":"tg-0"}]} xyz`, status: 400, code: api.CodeInvalidJSON, field: "body", keys: []string{"tg-0"}},
		{name: "second JSON value", body: `{"rows":[{"dispatch_key":"two-0"}]}{"rows":[]}`, status: 400, code: api.CodeInvalidJSON, field: "body", keys: []string{"two-0"}},
		{name: "unknown top-level field", body: `{"rows":[{"dispatch_key":"top-0"}],"extra":1}`, status: 400, code: api.CodeInvalidJSON, field: "extra", keys: []string{"top-0"}},
		{name: "rows not an array", body: `{"rows":{"dispatch_key":"obj-0"}}`, status: 400, code: api.CodeInvalidJSON, field: "rows", keys: []string{"obj-0"}},
		{name: "missing rows", body: `{}`, status: 400, code: api.CodeInvalidField, field: "rows"},
		{name: "null rows", body: `{"rows":null}`, status: 400, code: api.CodeInvalidField, field: "rows"},
		{name: "empty rows", body: `{"rows":[]}`, status: 400, code: api.CodeInvalidField, field: "rows"},
		{name: "row not an object", body: `{"rows":[{"dispatch_key":"rno-0"},7]}`, status: 400, code: api.CodeInvalidJSON, field: "rows[1]", keys: []string{"rno-0"}},
		func() badAppend {
			body, keys := batch("unk", 2, rowIn{"dispatch_key": "unk-x", "bogus": 1})
			return badAppend{name: "unknown row field", body: body, status: 400, code: api.CodeInvalidJSON, field: "rows[2].bogus", keys: keys}
		}(),
		func() badAppend {
			body, keys := batch("type", 1, rowIn{"dispatch_key": "type-x", "namespace": 5})
			return badAppend{name: "wrong field type", body: body, status: 400, code: api.CodeInvalidJSON, field: "rows[1].namespace", keys: keys}
		}(),
		func() badAppend {
			body, keys := batch("negord", 1, rowIn{"workflow_id": "wf", "ordinal": -1})
			return badAppend{name: "negative ordinal", body: body, status: 400, code: api.CodeInvalidJSON, field: "rows[1].ordinal", keys: keys}
		}(),
		invalidField("nokey", 2, rowIn{"namespace": "val"}, "rows[2].dispatch_key"),
		invalidField("wfnoord", 1, rowIn{"workflow_id": "wf-1"}, "rows[1].ordinal"),
		invalidField("ordnowf", 1, rowIn{"ordinal": 3}, "rows[1].dispatch_key"),
		invalidField("emptykey", 1, rowIn{"dispatch_key": ""}, "rows[1].dispatch_key"),
		invalidField("longkey", 1, rowIn{"dispatch_key": long(node.MaxKeyBytes + 1)}, "rows[1].dispatch_key"),
		invalidField("nlkey", 1, rowIn{"dispatch_key": "a\nb"}, "rows[1].dispatch_key"),
		invalidField("nulkey", 1, rowIn{"dispatch_key": "a\x00b"}, "rows[1].dispatch_key"),
		invalidField("delkey", 1, rowIn{"dispatch_key": "a\x7fb"}, "rows[1].dispatch_key"),
		// Keys must survive the trip in the Idempotency-Key header.
		invalidField("leadspacekey", 1, rowIn{"dispatch_key": " order-1"}, "rows[1].dispatch_key"),
		invalidField("trailspacekey", 1, rowIn{"dispatch_key": "order-1 "}, "rows[1].dispatch_key"),
		invalidField("leadtabkey", 1, rowIn{"dispatch_key": "\torder-1"}, "rows[1].dispatch_key"),
		invalidField("innertabkey", 1, rowIn{"dispatch_key": "order\t1"}, "rows[1].dispatch_key"),
		invalidField("crkey", 1, rowIn{"dispatch_key": "order-1\r"}, "rows[1].dispatch_key"),
		invalidField("nbspkey", 1, rowIn{"dispatch_key": "order-1\u00a0"}, "rows[1].dispatch_key"),
		invalidField("nelkey", 1, rowIn{"dispatch_key": "\u0085order-1"}, "rows[1].dispatch_key"),
		invalidField("blankkey", 1, rowIn{"dispatch_key": "   "}, "rows[1].dispatch_key"),
		invalidField("idsp", 1, rowIn{"dispatch_key": "\u3000"}, "rows[1].dispatch_key"),
		invalidField("derivedspace", 1, rowIn{"workflow_id": " wf-1", "ordinal": 1}, "rows[1].workflow_id"),
		invalidField("emptywf", 1, rowIn{"workflow_id": "", "ordinal": 1}, "rows[1].workflow_id"),
		invalidField("longwf", 1, rowIn{"workflow_id": long(node.MaxWorkflowIDBytes + 1), "ordinal": 1}, "rows[1].workflow_id"),
		invalidField("tabwf", 1, rowIn{"workflow_id": "w\tf", "ordinal": 1}, "rows[1].workflow_id"),
		invalidField("ctlact", 1, rowIn{"dispatch_key": "ctlact-x", "activity_type": "send\r"}, "rows[1].activity_type"),
		invalidField("longact", 1, rowIn{"dispatch_key": "longact-x", "activity_type": long(node.MaxLabelBytes + 1)}, "rows[1].activity_type"),
		invalidField("emptyns", 1, rowIn{"dispatch_key": "emptyns-x", "namespace": ""}, "rows[1].namespace"),
		invalidField("spacens", 1, rowIn{"dispatch_key": "spacens-x", "namespace": "has space"}, "rows[1].namespace"),
		invalidField("slashns", 1, rowIn{"dispatch_key": "slashns-x", "namespace": "a/b"}, "rows[1].namespace"),
		invalidField("longns", 1, rowIn{"dispatch_key": "longns-x", "namespace": long(65)}, "rows[1].namespace"),
		invalidField("unins", 1, rowIn{"dispatch_key": "unins-x", "namespace": "nämespace"}, "rows[1].namespace"),
		invalidField("badtq", 1, rowIn{"dispatch_key": "badtq-x", "task_queue": "q:1"}, "rows[1].task_queue"),
		invalidField("emptytq", 1, rowIn{"dispatch_key": "emptytq-x", "task_queue": ""}, "rows[1].task_queue"),
		invalidField("both", 1, rowIn{"dispatch_key": "both-x", "payload": map[string]int{"a": 1}, "payload_base64": "AAAA"}, "rows[1].payload"),
		invalidField("badb64", 1, rowIn{"dispatch_key": "badb64-x", "payload_base64": "not base64!"}, "rows[1].payload_base64"),
		invalidField("urlb64", 1, rowIn{"dispatch_key": "urlb64-x", "payload_base64": "-_-_"}, "rows[1].payload_base64"),
		invalidField("badct", 1, rowIn{"dispatch_key": "badct-x", "payload": 1, "content_type": "not a type"}, "rows[1].content_type"),
		invalidField("longct", 1, rowIn{"dispatch_key": "longct-x", "content_type": "text/" + long(300)}, "rows[1].content_type"),
		invalidField("negdelay", 1, rowIn{"dispatch_key": "negdelay-x", "delay_ms": -1}, "rows[1].delay_ms"),
		invalidField("bigdelay", 1, rowIn{"dispatch_key": "bigdelay-x", "delay_ms": node.MaxDelay.Milliseconds() + 1}, "rows[1].delay_ms"),
	}
	// Limits: 413 naming what is too large.
	{
		rows := make([]rowIn, node.MaxBatchRows+1)
		for i := range rows {
			rows[i] = rowIn{"dispatch_key": fmt.Sprintf("many-%d", i)}
		}
		cases = append(cases, badAppend{name: "too many rows", body: map[string]any{"rows": rows}, status: 413, code: api.CodeTooLarge, field: "rows",
			keys: []string{"many-0", "many-1000"}})
	}
	{
		// 900 rows of 12 KiB payload: a body just over 10 MiB.
		pad := strings.Repeat("p", 12<<10)
		var b bytes.Buffer
		b.WriteString(`{"rows":[`)
		for i := range 900 {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"dispatch_key":"huge-%d","payload":"%s"}`, i, pad)
		}
		b.WriteString(`]}`)
		if b.Len() <= node.MaxRequestBytes {
			t.Fatalf("test body is %d bytes, not above the limit", b.Len())
		}
		cases = append(cases, badAppend{name: "body over 10 MiB", body: b.Bytes(), status: 413, code: api.CodeTooLarge, field: "body",
			keys: []string{"huge-0", "huge-899"}})
	}
	{
		body, keys := rawBatch("bigjson", 3, `{"dispatch_key":"bigjson-x","payload":"`+strings.Repeat("j", node.MaxPayloadBytes)+`"}`)
		cases = append(cases, badAppend{name: "JSON payload over 1 MiB", body: body, status: 413, code: api.CodeTooLarge, field: "rows[3].payload", keys: keys})
	}
	{
		big := base64.StdEncoding.EncodeToString(make([]byte, 3*node.MaxPayloadBytes/2))
		body, keys := rawBatch("bigb64", 1, `{"dispatch_key":"bigb64-x","payload_base64":"`+big+`"}`)
		cases = append(cases, badAppend{name: "base64 payload far over 1 MiB", body: body, status: 413, code: api.CodeTooLarge, field: "rows[1].payload_base64", keys: keys})
	}
	{
		// One byte over: the decoded-length estimate lets it through, the
		// exact check must still name payload_base64.
		big := base64.StdEncoding.EncodeToString(make([]byte, node.MaxPayloadBytes+1))
		body, keys := rawBatch("b64plus1", 1, `{"dispatch_key":"b64plus1-x","payload_base64":"`+big+`"}`)
		cases = append(cases, badAppend{name: "base64 payload 1 MiB + 1", body: body, status: 413, code: api.CodeTooLarge, field: "rows[1].payload_base64", keys: keys})
	}

	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			n := n.at(t)
			st, b := n.do(http.MethodPost, "/v1/rows", c.body)
			e := wantError(t, st, b, c.status, c.code, c.field)
			if c.field != "" && !strings.Contains(e.Error.Message, c.field) {
				t.Errorf("message %q does not name the field %q", e.Error.Message, c.field)
			}
			wantNotStored(t, n, c.keys...)
		})
	}
}

// TestAppendAcceptsAndDefaults checks what valid rows become: the default
// dispatch_key, namespace and task_queue, payload forms and content types,
// delay_ms and names at the edge of the rules.
func TestAppendAcceptsAndDefaults(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	exact := make([]byte, node.MaxPayloadBytes)
	exact[0], exact[len(exact)-1] = 0xff, 0x01
	name64 := strings.Repeat("N", 64)
	before := time.Now()
	out := n.appendRows(
		rowIn{"workflow_id": "wf-a", "ordinal": 7},                                                                    // 0: key wf-a:7, defaults
		rowIn{"workflow_id": "wf-a", "ordinal": 0, "dispatch_key": "explicit-key"},                                    // 1: dispatch_key wins
		rowIn{"dispatch_key": "json-1", "payload": json.RawMessage(`{"a":[1,2]}`)},                                    // 2
		rowIn{"dispatch_key": "b64-1", "payload_base64": base64.StdEncoding.EncodeToString(exact)},                    // 3: exactly 1 MiB
		rowIn{"dispatch_key": "ct-1", "payload": "hi", "content_type": "text/plain; charset=utf-8"},                   // 4
		rowIn{"dispatch_key": "delay-1", "delay_ms": 60000},                                                           // 5
		rowIn{"dispatch_key": "names-1", "namespace": "Ab-9_.z", "task_queue": name64, "activity_type": "send-email"}, // 6
		rowIn{"dispatch_key": "nullpay-1", "payload": nil, "payload_base64": "AQI="},                                  // 7: payload null is absent
		rowIn{"dispatch_key": "ключ/✓ with space?#", "namespace": "val"},                                              // 8: any printable key
		rowIn{"dispatch_key": "maxdelay-1", "delay_ms": node.MaxDelay.Milliseconds()},                                 // 9
	)
	after := time.Now()
	wantKeys := []string{"wf-a:7", "explicit-key", "json-1", "b64-1", "ct-1", "delay-1", "names-1", "nullpay-1", "ключ/✓ with space?#", "maxdelay-1"}
	for i, r := range out.Rows {
		if r.DispatchKey != wantKeys[i] || r.Status != "created" || r.Node != n.Name() {
			t.Errorf("answer %d = %+v, want %q created on %s", i, r, wantKeys[i], n.Name())
		}
	}

	v, _ := n.getRow("wf-a:7")
	if v.WorkflowID != "wf-a" || v.Ordinal != 7 || v.Namespace != "default" || v.TaskQueue != "default" ||
		v.Status != "pending" || v.Attempt != 1 || v.Node != n.Name() || len(v.PayloadBase64) != 0 {
		t.Errorf("wf-a:7 = %+v, want workflow wf-a ordinal 7 in default/default, pending attempt 1 on %s, no payload", v, n.Name())
	}
	if v.VisibleAfter.Before(before.Add(-time.Second)) || v.VisibleAfter.After(after.Add(time.Second)) {
		t.Errorf("wf-a:7 visible_after %v, want about now (%v)", v.VisibleAfter, before)
	}
	if _, ok := n.getRow("wf-a:0"); ok {
		t.Error("row 1 was also stored under its derived key wf-a:0; dispatch_key must win")
	}
	if v, _ := n.getRow("explicit-key"); v.WorkflowID != "wf-a" || v.Ordinal != 0 {
		t.Errorf("explicit-key = %+v, want workflow_id wf-a ordinal 0", v)
	}
	if v, _ := n.getRow("json-1"); string(v.Payload) != `{"a":[1,2]}` || v.PayloadBase64 != nil || v.ContentType != "application/json" {
		t.Errorf("json-1 payload %q (base64 %q) content type %q, want the JSON value as payload and application/json", v.Payload, v.PayloadBase64, v.ContentType)
	}
	if v, _ := n.getRow("b64-1"); !bytes.Equal(v.PayloadBase64, exact) || v.ContentType != "application/octet-stream" {
		t.Errorf("b64-1: payload of %d bytes (equal: %v), content type %q; want the 1 MiB payload as application/octet-stream",
			len(v.PayloadBase64), bytes.Equal(v.PayloadBase64, exact), v.ContentType)
	}
	if v, _ := n.getRow("ct-1"); v.ContentType != "text/plain; charset=utf-8" || string(v.PayloadBase64) != `"hi"` {
		t.Errorf("ct-1 = payload %q content type %q, want \"hi\" as text/plain; charset=utf-8", v.PayloadBase64, v.ContentType)
	}
	if v, _ := n.getRow("delay-1"); v.VisibleAfter.Before(before.Add(59*time.Second)) || v.VisibleAfter.After(after.Add(61*time.Second)) {
		t.Errorf("delay-1 visible_after %v, want about %v (now + 60 s)", v.VisibleAfter, before.Add(time.Minute))
	}
	if v, _ := n.getRow("maxdelay-1"); v.VisibleAfter.Before(before.Add(node.MaxDelay - time.Second)) {
		t.Errorf("maxdelay-1 visible_after %v, want now + %v", v.VisibleAfter, node.MaxDelay)
	}
	if v, _ := n.getRow("names-1"); v.Namespace != "Ab-9_.z" || v.TaskQueue != name64 || v.ActivityType != "send-email" {
		t.Errorf("names-1 = %+v, want namespace Ab-9_.z, the 64-byte task_queue and activity_type send-email", v)
	}
	if v, _ := n.getRow("nullpay-1"); !bytes.Equal(v.PayloadBase64, []byte{1, 2}) {
		t.Errorf("nullpay-1 payload %v, want [1 2] from payload_base64", v.PayloadBase64)
	}
	if v, ok := n.getRow("ключ/✓ with space?#"); !ok || v.Namespace != "val" {
		t.Errorf("row with a slash, spaces and ?# in its key: found %v, %+v", ok, v)
	}

	// A JSON payload reads back as the same JSON value (whitespace is
	// not kept in the answer; the delivered body is the bytes as sent).
	n.mustDo(http.MethodPost, "/v1/rows", `{"rows":[{"dispatch_key":"json-2","payload": {"b" : [ 1, 2 ] } }]}`, http.StatusOK, nil)
	if v, _ := n.getRow("json-2"); string(v.Payload) != `{"b":[1,2]}` {
		t.Errorf("json-2 payload %q, want the JSON value sent", v.Payload)
	}
	// Bytes appended as base64 under a JSON content type that do not
	// parse stay base64.
	n.mustDo(http.MethodPost, "/v1/rows", `{"rows":[{"dispatch_key":"json-3","payload_base64":"e25vdA==","content_type":"application/json"}]}`, http.StatusOK, nil)
	if v, _ := n.getRow("json-3"); string(v.PayloadBase64) != `{not` || v.Payload != nil {
		t.Errorf("json-3 payload %q (JSON %q), want {not as payload_base64", v.PayloadBase64, v.Payload)
	}

	// Trailing whitespace after the JSON value is not garbage.
	n.mustDo(http.MethodPost, "/v1/rows", "{\"rows\":[{\"dispatch_key\":\"ws-1\"}]}\n \t\n", http.StatusOK, nil)
	if _, ok := n.getRow("ws-1"); !ok {
		t.Error("ws-1 (body with trailing whitespace) was not stored")
	}
}

// TestAppendIsIdempotent: a retried batch answers duplicate row by row, in
// order; a key repeated within a batch is created once; a key whose row was
// delivered (a tombstone) is still a duplicate.
func TestAppendIsIdempotent(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	tg := newTarget(t)
	n.setTarget("idem", "default", tg.URL())

	rows := []rowIn{
		{"dispatch_key": "idem-b", "namespace": "held"},
		{"dispatch_key": "idem-a", "namespace": "held"},
		{"workflow_id": "idem-wf", "ordinal": 3, "namespace": "held"},
		{"dispatch_key": "idem-b", "namespace": "held"},
	}
	first := n.appendRows(rows...)
	second := n.appendRows(rows...)
	wantStatus := func(out appendOut, want ...string) {
		t.Helper()
		for i, r := range out.Rows {
			key := []string{"idem-b", "idem-a", "idem-wf:3", "idem-b"}[i]
			if r.DispatchKey != key || r.Status != want[i] || r.Node != n.Name() {
				t.Errorf("row %d answered %+v, want %s %s on %s", i, r, key, want[i], n.Name())
			}
		}
	}
	wantStatus(first, "created", "created", "created", "duplicate")
	wantStatus(second, "duplicate", "duplicate", "duplicate", "duplicate")
	if v := n.namespace("held"); v.Pending != 3 {
		t.Errorf("namespace held has %d pending rows, want 3", v.Pending)
	}

	// A delivered row keeps its key: appending it again is a duplicate
	// and it is not delivered twice.
	out := n.appendRows(rowIn{"dispatch_key": "idem-done", "namespace": "idem"})
	if out.Rows[0].Status != "created" {
		t.Fatalf("idem-done answered %s, want created", out.Rows[0].Status)
	}
	n.waitStatus("idem-done", "done", 10*time.Second)
	out = n.appendRows(rowIn{"dispatch_key": "idem-done", "namespace": "idem", "payload": 1})
	if out.Rows[0].Status != "duplicate" {
		t.Errorf("re-append of a delivered row answered %s, want duplicate", out.Rows[0].Status)
	}
	if v, _ := n.getRow("idem-done"); v.Status != "done" || len(v.PayloadBase64) != 0 {
		t.Errorf("delivered row after re-append = %+v, want it unchanged (done, no payload)", v)
	}
	if c := tg.Count("idem-done"); c != 1 {
		t.Errorf("idem-done delivered %d times, want 1", c)
	}
}

// TestGetRowKeyEscaping: any dispatch_key can be read back when it is
// escaped as one path segment (url.PathEscape), even ones whose slashes
// would form empty or dot segments the router cleans; plain slashes work
// too.
func TestGetRowKeyEscaping(t *testing.T) {
	t.Parallel()
	n := startNode(t, nil)
	keys := []string{"a//b", "x/./y", "../z", "p/q/", "/lead", "dot/..", "%2F", "a%2Fb", "sp ace", "q?x=1#f", "+plus"}
	var rows []rowIn
	for _, k := range keys {
		rows = append(rows, rowIn{"dispatch_key": k})
	}
	n.appendRows(rows...)
	for _, k := range keys {
		var v rowView
		n.mustDo("GET", "/v1/rows/"+url.PathEscape(k), nil, http.StatusOK, &v)
		if v.DispatchKey != k {
			t.Errorf("GET of escaped %q found %q", k, v.DispatchKey)
		}
	}
	var v rowView
	n.mustDo("GET", "/v1/rows/p/q/", nil, http.StatusOK, &v)
	if v.DispatchKey != "p/q/" {
		t.Errorf("GET /v1/rows/p/q/ found %q", v.DispatchKey)
	}
}
