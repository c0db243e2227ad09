package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/loadgen"
)

// Scenario 6, bad input: malformed JSON, missing keys, bad names, oversize
// payloads and batches get a 4xx JSON error {"error":{"code","message"}}
// whose field and message name what is wrong, and store nothing: no key of
// a refused request is found through GET /v1/rows/{key} on any node, even
// when the other rows of the batch were valid. Runtime settings refuse bad
// values the same way and keep their old value.
func TestBadInput(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	for i := range 3 {
		c.startNode(fmt.Sprintf("bad-%d", i))
	}
	c.waitConverged(20 * time.Second)

	row := func(key string, extra string) string {
		k, _ := json.Marshal(key)
		return fmt.Sprintf(`{"dispatch_key":%s,"namespace":"bad-ns","task_queue":"q"%s}`, k, extra)
	}
	batch := func(rows ...string) []byte { return []byte(`{"rows":[` + strings.Join(rows, ",") + `]}`) }
	manyRows := make([]string, 1001)
	for i := range manyRows {
		manyRows[i] = row(fmt.Sprintf("bad-many-%d", i), "")
	}
	// Eleven rows of just under 1 MiB each: every payload is allowed, the
	// request (> 10 MiB) is not.
	big := `,"payload":"` + strings.Repeat("x", 1_000_000) + `"`
	hugeRows := make([]string, 11)
	for i := range hugeRows {
		hugeRows[i] = row(fmt.Sprintf("bad-huge-%d", i), big)
	}

	cases := []struct {
		name   string
		body   []byte
		keys   []string // dispatch_keys the request carried: none may exist
		status int
		code   string
		field  string // the error's field, also named in its message
	}{
		{"truncated JSON", []byte(`{"rows":[` + row("bad-trunc", "")), []string{"bad-trunc"}, 400, "invalid_json", "body"},
		{"not an object", []byte(`[1,2,3]`), nil, 400, "invalid_json", "body"},
		{"trailing data", []byte(string(batch(row("bad-trail", ""))) + ` {}`), []string{"bad-trail"}, 400, "invalid_json", "body"},
		{"unknown top-level field", []byte(`{"rows":[` + row("bad-top", "") + `],"extra":1}`), []string{"bad-top"}, 400, "invalid_json", "extra"},
		{"no rows", []byte(`{}`), nil, 400, "invalid_field", "rows"},
		{"empty rows", []byte(`{"rows":[]}`), nil, 400, "invalid_field", "rows"},
		{"missing dispatch_key", batch(`{"namespace":"bad-ns","task_queue":"q"}`), nil, 400, "invalid_field", "rows[0].dispatch_key"},
		{"empty dispatch_key", batch(row("", "")), nil, 400, "invalid_field", "rows[0].dispatch_key"},
		{"workflow_id without ordinal", batch(`{"workflow_id":"bad-wf","namespace":"bad-ns"}`), []string{"bad-wf:0"}, 400, "invalid_field", "rows[0].ordinal"},
		{"dispatch_key too long", batch(row("bad-"+strings.Repeat("k", 600), "")), []string{"bad-" + strings.Repeat("k", 600)}, 400, "invalid_field", "rows[0].dispatch_key"},
		{"control character in dispatch_key", batch(row("bad-ctl\u0001", "")), []string{"bad-ctl\u0001"}, 400, "invalid_field", "rows[0].dispatch_key"},
		{"unknown row field", batch(row("bad-unknown", `,"colour":"red"`)), []string{"bad-unknown"}, 400, "invalid_json", "rows[0].colour"},
		{"dispatch_key not a string", batch(`{"dispatch_key":5,"namespace":"bad-ns"}`), nil, 400, "invalid_json", "rows[0].dispatch_key"},
		{"rows not an array", []byte(`{"rows":{"dispatch_key":"bad-obj"}}`), []string{"bad-obj"}, 400, "invalid_json", "rows"},
		{"bad namespace", batch(`{"dispatch_key":"bad-ns-name","namespace":"has space"}`), []string{"bad-ns-name"}, 400, "invalid_field", "rows[0].namespace"},
		{"bad task_queue", batch(`{"dispatch_key":"bad-tq-name","task_queue":"` + strings.Repeat("q", 65) + `"}`), []string{"bad-tq-name"}, 400, "invalid_field", "rows[0].task_queue"},
		{"good row then a bad one", batch(row("bad-good-first", ""), `{"dispatch_key":"bad-second","namespace":"bad/ns"}`), []string{"bad-good-first", "bad-second"}, 400, "invalid_field", "rows[1].namespace"},
		{"negative delay_ms", batch(row("bad-delay", `,"delay_ms":-5`)), []string{"bad-delay"}, 400, "invalid_field", "rows[0].delay_ms"},
		{"payload and payload_base64", batch(row("bad-both", `,"payload":{"a":1},"payload_base64":"AAAA"`)), []string{"bad-both"}, 400, "invalid_field", "rows[0].payload"},
		{"bad payload_base64", batch(row("bad-b64", `,"payload_base64":"%%%"`)), []string{"bad-b64"}, 400, "invalid_field", "rows[0].payload_base64"},
		{"payload over 1 MiB", batch(row("bad-ok-before-big", ""), row("bad-bigpayload", `,"payload":"`+strings.Repeat("x", 1<<20)+`"`)),
			[]string{"bad-ok-before-big", "bad-bigpayload"}, 413, "too_large", "rows[1].payload"},
		{"more than 1000 rows", batch(manyRows...), []string{"bad-many-0", "bad-many-500", "bad-many-1000"}, 413, "too_large", "rows"},
		{"request over 10 MiB", batch(hugeRows...), []string{"bad-huge-0", "bad-huge-10"}, 413, "too_large", "body"},
	}
	ms := c.members()
	var refused []string
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := ms[i%len(ms)]
			code, body, err := c.do(http.MethodPost, p.baseURL()+"/v1/rows", tc.body, nil)
			if err != nil {
				t.Fatalf("POST /v1/rows on %s: %v", p.name, err)
			}
			checkAPIError(t, code, body, tc.status, tc.code, tc.field)
		})
		refused = append(refused, tc.keys...)
	}

	// Settings: bad values are refused and change nothing.
	c.setNamespace("bad-ns", map[string]any{"max_in_flight": 7})
	for _, tc := range []struct {
		name, path, body string
		field            string
	}{
		{"negative quota", "/v1/namespaces/bad-ns", `{"max_in_flight":-1}`, "max_in_flight"},
		{"quota not a number", "/v1/namespaces/bad-ns", `{"max_in_flight":"lots"}`, "max_in_flight"},
		{"paused not a bool", "/v1/namespaces/bad-ns", `{"paused":"yes"}`, "paused"},
		{"unknown setting", "/v1/namespaces/bad-ns", `{"max_in_flight":3,"colour":"red"}`, "colour"},
		{"bad namespace in path", "/v1/namespaces/bad%20ns", `{"max_in_flight":3}`, "namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body, err := c.do(http.MethodPut, ms[0].baseURL()+tc.path, []byte(tc.body), nil)
			if err != nil {
				t.Fatal(err)
			}
			checkAPIError(t, code, body, 400, "invalid_field", tc.field)
		})
	}

	// Nothing was stored: every key is unknown to every node, and no node
	// holds a row of the namespace; its quota is still 7 everywhere.
	for _, p := range c.members() {
		for _, k := range refused {
			code, body, err := c.do(http.MethodGet, p.baseURL()+"/v1/rows/"+url.PathEscape(k), nil, nil)
			if err != nil {
				t.Fatalf("GET /v1/rows/%q on %s: %v", k, p.name, err)
			}
			if code != http.StatusNotFound && !(code == 400 && len(k) > 512) {
				t.Errorf("GET /v1/rows/%.40q on %s: HTTP %d %s; want 404: the refused request stored it", k, p.name, code, body)
			}
		}
		v, err := c.namespace(p, "bad-ns")
		if err != nil {
			t.Fatal(err)
		}
		if v.Pending+v.Claimed+v.DeadLetters != 0 || v.MaxInFlight != 7 {
			t.Errorf("%s: namespace bad-ns has %d pending, %d claimed, %d dead, quota %d; want nothing stored and quota 7",
				p.name, v.Pending, v.Claimed, v.DeadLetters, v.MaxInFlight)
		}
	}

	// The internal routes take only calls signed with the cluster secret.
	// A handoff marking a row done is refused unsigned, and so is any
	// internal call; nothing changes.
	repro := []byte(`{"rows":[{"dispatch_key":"bad-good-first","namespace":"bad-ns","task_queue":"default","status":"done"}]}`)
	for _, path := range []string{"/internal/v1/handoff", "/internal/v1/rows", "/internal/v1/namespaces/bad-ns/dead-letters/redrive"} {
		code, body, err := c.do(http.MethodPost, ms[0].baseURL()+path, repro, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkAPIError(t, code, body, http.StatusUnauthorized, "unauthorized", "")
	}

	// The nodes still work: a valid batch through each is delivered.
	l := newLedger()
	recv := c.receiver()
	rep := runLoad(t, c.generator(l, loadgen.Config{Rows: 300, BatchSize: 50, KeyPrefix: "good-"}))
	if rep.Appended != 300 {
		t.Fatalf("appended %d of 300 valid rows", rep.Appended)
	}
	c.waitDelivered(l, recv, 30*time.Second)
	if got := recv.Delivered(); got != 300 {
		t.Errorf("target saw %d deliveries; want 300 (and none of a refused request)", got)
	}
}

// checkAPIError asserts a JSON error answer: the status, Content-Type,
// {"error":{"code","message","field"}} with the given code and field, and a
// message naming the field.
func checkAPIError(t *testing.T, status int, body []byte, wantStatus int, wantCode, wantField string) {
	t.Helper()
	if status != wantStatus {
		t.Errorf("HTTP %d; want %d (body %.300s)", status, wantStatus, body)
	}
	var e struct {
		Error *struct {
			Code    string `json:"code"`
			Field   string `json:"field"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil {
		t.Fatalf("answer is not a JSON error: %v: %.300s", err, body)
	}
	if e.Error.Code != wantCode {
		t.Errorf("error code %q; want %q (message %q)", e.Error.Code, wantCode, e.Error.Message)
	}
	if e.Error.Field != wantField {
		t.Errorf("error field %q; want %q (message %q)", e.Error.Field, wantField, e.Error.Message)
	}
	if e.Error.Message == "" || !strings.Contains(e.Error.Message, wantField) {
		t.Errorf("error message %q does not name the field %q", e.Error.Message, wantField)
	}
}
