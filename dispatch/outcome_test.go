package dispatch

import (
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/outbox"
)

// TestDeliveryRequest checks what a target receives: method, body, content
// type, every documented header and the URL placeholders.
func TestDeliveryRequest(t *testing.T) {
	tg := newTarget(t, nil)
	clock := newFakeClock(t0)
	cfg := testConfig(TargetsFunc(func(outbox.ClaimScope) (Target, bool) {
		return Target{URL: tg.URL() + "/hooks/{namespace}/{task_queue}"}, true
	}))
	cfg.Now = clock.Now
	d, b := setup(t, cfg)
	defer drain(t, d)

	r := mkRow("wf-9:3", "acme corp", "emails/eu", t0)
	r.WorkflowID, r.Ordinal, r.ActivityType = "wf-9", 3, "send_email"
	r.Payload = []byte{0x00, 0x01, 'x', 0xff}
	r.ContentType = "application/x-custom"
	noCT := mkRow("k2", "acme corp", "emails/eu", t0)
	noCT.ContentType = ""
	mustAppend(t, b.store, r, noCT)
	sweep(t, d)

	wantStatus(t, b.store, "wf-9:3", outbox.StatusDone)
	reqs := tg.requests()
	if len(reqs) != 2 {
		t.Fatalf("target received %d requests, want 2", len(reqs))
	}
	var got received
	for _, rq := range reqs {
		if rq.header.Get(HeaderDispatchKey) == "wf-9:3" {
			got = rq
		} else if ct := rq.header.Get("Content-Type"); ct != "application/octet-stream" {
			t.Errorf("row without content type sent Content-Type %q, want application/octet-stream", ct)
		}
	}
	if got.path != "/hooks/acme%20corp/emails%2Feu" {
		t.Errorf("path %q, want placeholders substituted and path-escaped", got.path)
	}
	if string(got.body) != string(r.Payload) {
		t.Errorf("body %x, want the payload %x byte for byte", got.body, r.Payload)
	}
	want := map[string]string{
		"Content-Type":       "application/x-custom",
		HeaderIdempotencyKey: "wf-9:3",
		HeaderDispatchKey:    "wf-9:3",
		HeaderNamespace:      "acme corp",
		HeaderTaskQueue:      "emails/eu",
		HeaderWorkflowID:     "wf-9",
		HeaderOrdinal:        "3",
		HeaderActivityType:   "send_email",
		HeaderAttempt:        "1",
		"User-Agent":         "fairshard-dispatch",
	}
	for h, v := range want {
		if g := got.header.Get(h); g != v {
			t.Errorf("header %s = %q, want %q", h, g, v)
		}
	}
}

// TestOutcomes runs each outcome class against a real HTTP target and
// checks the settled row: status, attempt, visible_after and last_error.
func TestOutcomes(t *testing.T) {
	const base = 500 * time.Millisecond // the default backoff of attempt 1
	type want = outcomeWant
	reply := func(code int, body string, hdr ...string) func(http.ResponseWriter, *http.Request) {
		return func(w http.ResponseWriter, _ *http.Request) {
			for i := 0; i+1 < len(hdr); i += 2 {
				w.Header().Set(hdr[i], hdr[i+1])
			}
			w.WriteHeader(code)
			_, _ = w.Write([]byte(body))
		}
	}
	retryAt := func(n uint32) want {
		return want{status: outbox.StatusPending, attempt: n + 1, minDelay: base * 8 / 10, maxDelay: base * 12 / 10}
	}
	cases := []struct {
		name    string
		handler func(http.ResponseWriter, *http.Request)
		url     string // overrides the target URL ("" = the test target)
		timeout time.Duration
		attempt uint32 // the row's attempt before delivery (0 = 1)
		policy  *RetryPolicy
		want    want
	}{
		{name: "200 done", handler: reply(200, "ok"), want: want{status: outbox.StatusDone, attempt: 1}},
		{name: "204 done", handler: reply(204, ""), want: want{status: outbox.StatusDone, attempt: 1}},
		{name: "500 retry", handler: reply(500, "boom"), want: with(retryAt(1), "HTTP 500: boom")},
		{name: "503 retry", handler: reply(503, "busy"), want: with(retryAt(1), "HTTP 503: busy")},
		{name: "429 retry", handler: reply(429, "slow down"), want: with(retryAt(1), "HTTP 429: slow down")},
		{name: "408 retry", handler: reply(408, ""), want: with(retryAt(1), "HTTP 408")},
		{name: "425 retry", handler: reply(425, "early"), want: with(retryAt(1), "HTTP 425: early")},
		// Retry-After in every form: TestRetryAfter.
		{name: "503 on attempt 3 backs off 2s", handler: reply(503, ""), attempt: 3,
			want: want{status: outbox.StatusPending, attempt: 4, minDelay: 1600 * time.Millisecond, maxDelay: 2400 * time.Millisecond}},
		{name: "400 fails at once", handler: reply(400, `{"error":"bad field"}`),
			want: want{status: outbox.StatusFailed, attempt: 1, exactPrefix: `HTTP 400: {"error":"bad field"}`}},
		{name: "404 fails at once", handler: reply(404, "no such hook"),
			want: want{status: outbox.StatusFailed, attempt: 1, exactPrefix: "HTTP 404: no such hook"}},
		{name: "410 fails at once", handler: reply(410, "gone"),
			want: want{status: outbox.StatusFailed, attempt: 1, exactPrefix: "HTTP 410: gone"}},
		{name: "401 fails at once even on a late attempt", handler: reply(401, "who"), attempt: 4,
			want: want{status: outbox.StatusFailed, attempt: 4, exactPrefix: "HTTP 401: who"}},
		{name: "302 fails, redirect not followed", handler: reply(302, "", "Location", "/elsewhere"),
			want: want{status: outbox.StatusFailed, attempt: 1, exactPrefix: "HTTP 302"}},
		{name: "connection refused retries", url: refusedURL(t),
			want: with(retryAt(1), "connection refused")},
		{name: "timeout retries with backoff, outcome unknown", handler: func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
			timeout: 100 * time.Millisecond, want: with(retryAt(1), OutcomeUnknownPrefix+"no answer within 100ms of the request going out")},
		{name: "attempts exhausted fails", handler: reply(503, "still down"), attempt: 10,
			want: want{status: outbox.StatusFailed, attempt: 10, exactPrefix: "attempts exhausted (10 of 10): HTTP 503: still down"}},
		{name: "per-namespace override: one attempt", handler: reply(500, "x"), policy: &RetryPolicy{MaxAttempts: 1},
			want: want{status: outbox.StatusFailed, attempt: 1, exactPrefix: "attempts exhausted (1 of 1): HTTP 500: x"}},
		{name: "per-namespace override: base 1 min", handler: reply(500, "x"), policy: &RetryPolicy{Base: time.Minute, Jitter: -1},
			want: want{status: outbox.StatusPending, attempt: 2, minDelay: time.Minute, maxDelay: time.Minute}},
		{name: "invalid override ignored", handler: reply(500, "x"), policy: &RetryPolicy{Factor: 0.1}, want: retryAt(1)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.url
			if url == "" {
				url = newTarget(t, tc.handler).URL()
			}
			clock := newFakeClock(t0)
			cfg := testConfig(TargetsFunc(func(outbox.ClaimScope) (Target, bool) {
				return Target{URL: url, Timeout: tc.timeout}, true
			}))
			cfg.Now = clock.Now
			if tc.policy != nil {
				cfg.RetryPolicyFor = func(ns string) (RetryPolicy, bool) { return *tc.policy, ns == "ns" }
			}
			d, b := setup(t, cfg)
			defer drain(t, d)
			r := mkRow("k", "ns", "q", t0)
			r.Attempt = tc.attempt
			mustAppend(t, b.store, r)
			sweep(t, d)

			got := wantStatus(t, b.store, "k", tc.want.status)
			if got.Attempt != tc.want.attempt {
				t.Errorf("attempt %d, want %d", got.Attempt, tc.want.attempt)
			}
			if tc.want.status == outbox.StatusPending {
				delay := got.VisibleAfter.Sub(t0)
				if delay < tc.want.minDelay || delay > tc.want.maxDelay {
					t.Errorf("visible_after = now + %v, want within [%v, %v]", delay, tc.want.minDelay, tc.want.maxDelay)
				}
			}
			if tc.want.status == outbox.StatusFailed && !got.FinishedAt.Equal(t0) {
				t.Errorf("finished_at %v, want the clock %v", got.FinishedAt, t0)
			}
			for _, s := range tc.want.lastErrHas {
				if !strings.Contains(got.LastError, s) {
					t.Errorf("last_error %q lacks %q", got.LastError, s)
				}
			}
			if tc.want.exactPrefix != "" && got.LastError != tc.want.exactPrefix {
				t.Errorf("last_error %q, want %q", got.LastError, tc.want.exactPrefix)
			}
			if tc.want.status == outbox.StatusDone && got.LastError != "" {
				t.Errorf("done row has last_error %q", got.LastError)
			}
		})
	}
}

// outcomeWant is what TestOutcomes expects of the settled row.
type outcomeWant struct {
	status      outbox.Status
	attempt     uint32
	minDelay    time.Duration // visible_after − now, for pending rows
	maxDelay    time.Duration
	lastErrHas  []string
	exactPrefix string // the whole last_error, when set
}

// with adds a substring last_error must contain.
func with(w outcomeWant, has string) outcomeWant {
	w.lastErrHas = append(w.lastErrHas, has)
	return w
}

// refusedURL returns the URL of a loopback port nothing listens on.
func refusedURL(t *testing.T) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	_ = l.Close()
	return "http://" + addr + "/x"
}

// TestLastErrorBounded: a huge error body is cut to LastErrorMax bytes,
// and the retry carries the attempt to the target's header.
func TestLastErrorBounded(t *testing.T) {
	big := strings.Repeat("é", 5000) // 10,000 bytes, multi-byte runes
	tg := newTarget(t, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(404)
		_, _ = w.Write([]byte(big))
	})
	cfg := testConfig(static(tg.URL()))
	cfg.LastErrorMax = 100
	d, b := setup(t, cfg)
	defer drain(t, d)
	mustAppend(t, b.store, mkRow("k", "ns", "q", time.Now()))
	sweep(t, d)
	got := wantStatus(t, b.store, "k", outbox.StatusFailed)
	if len(got.LastError) > 100 || !strings.HasPrefix(got.LastError, "HTTP 404: éé") {
		t.Fatalf("last_error (%d bytes) %q: want ≤ 100 bytes starting with the status", len(got.LastError), got.LastError)
	}
	if !strings.HasSuffix(got.LastError, "é") {
		t.Fatalf("last_error cut inside a rune: %q", got.LastError)
	}
}

// TestRetryCarriesAttemptHeader: a row retried twice reaches the target
// with Fairshard-Attempt 1, 2, 3 and is done on the third.
func TestRetryCarriesAttemptHeader(t *testing.T) {
	var n int
	tg := newTarget(t, func(w http.ResponseWriter, r *http.Request) {
		n++ // serialised: one row, one request at a time
		if n < 3 {
			w.WriteHeader(503)
			return
		}
		w.WriteHeader(200)
	})
	clock := newFakeClock(t0)
	cfg := testConfig(static(tg.URL()))
	cfg.Now = clock.Now
	d, b := setup(t, cfg)
	defer drain(t, d)
	mustAppend(t, b.store, mkRow("k", "ns", "q", t0))
	for range 3 {
		sweep(t, d)
		clock.Advance(time.Hour) // past any backoff
	}
	wantStatus(t, b.store, "k", outbox.StatusDone)
	var attempts []string
	for _, rq := range tg.requests() {
		attempts = append(attempts, rq.header.Get(HeaderAttempt))
	}
	if strings.Join(attempts, ",") != "1,2,3" {
		t.Fatalf("attempt headers %v, want 1,2,3", attempts)
	}
}

// TestUnsendableRowFails: a row whose workflow_id cannot travel as a
// header is a dead letter at once; it never reaches the target.
func TestUnsendableRowFails(t *testing.T) {
	tg := newTarget(t, nil)
	d, b := setup(t, testConfig(static(tg.URL())))
	defer drain(t, d)
	r := mkRow("k", "ns", "q", time.Now())
	r.WorkflowID = "wf\nInjected: yes"
	mustAppend(t, b.store, r)
	sweep(t, d)
	got := wantStatus(t, b.store, "k", outbox.StatusFailed)
	if !strings.Contains(got.LastError, "workflow_id") {
		t.Fatalf("last_error %q does not name the field", got.LastError)
	}
	if tg.total() != 0 {
		t.Fatalf("target received %d requests, want 0", tg.total())
	}
}

// TestConnectionsBoundedAndReused: with MaxConnsPerHost 2, a backlog of
// 20 rows goes out at most 2 at a time (the planner claims only what the
// host has slots for) over a few reused connections.
func TestConnectionsBoundedAndReused(t *testing.T) {
	tg := newTarget(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(5 * time.Millisecond)
	})
	cfg := testConfig(static(tg.URL()))
	cfg.MaxConnsPerHost = 2
	d, b := setup(t, cfg)
	var rows []outbox.Row
	for i := range 20 {
		rows = append(rows, mkRow("k"+strconv.Itoa(i), "ns", "q", time.Now()))
	}
	mustAppend(t, b.store, rows...)
	run(t, d)
	d.Wake()
	poll.Eventually(t, 10*time.Second, "20 rows done", func() (bool, string) {
		for _, r := range rows {
			if !statusIs(b.store, r.DispatchKey, outbox.StatusDone) {
				return false, ""
			}
		}
		return true, ""
	})
	// Reused: a handful of connections for 20 requests (MaxConnsPerHost
	// bounds the open ones at 2; one closed while idle on a loaded machine
	// is replaced), never one per request.
	if c := tg.conns.Load(); c > 5 || c < 1 {
		t.Fatalf("target saw %d connections for 20 requests, want 1..5 (bounded and reused)", c)
	}
	if p := tg.peak.Load(); p > 2 {
		t.Fatalf("target saw %d concurrent requests, want ≤ 2", p)
	}
	if n := tg.total(); n != 20 {
		t.Fatalf("target received %d requests, want 20 (each row once)", n)
	}
}
