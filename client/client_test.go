package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshard/fairshard/client"
	"github.com/fairshard/fairshard/cluster/clustertest"
	"github.com/fairshard/fairshard/node"
)

// attempts records every attempt of a client's calls.
type attempts struct {
	mu   sync.Mutex
	list []client.Attempt
}

func (a *attempts) record(x client.Attempt) {
	a.mu.Lock()
	a.list = append(a.list, x)
	a.mu.Unlock()
}

func (a *attempts) get() []client.Attempt {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]client.Attempt(nil), a.list...)
}

func (a *attempts) nodes() []string {
	var out []string
	for _, x := range a.get() {
		out = append(out, x.Node)
	}
	return out
}

func newClient(t *testing.T, opts client.Options) (*client.Client, *attempts) {
	t.Helper()
	rec := &attempts{}
	opts.OnAttempt = rec.record
	c, err := client.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, rec
}

// deadURL returns the URL of a loopback port nothing listens on: a real
// connection refused.
func deadURL(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(clustertest.TakeIP(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// fakeNode answers every request with the statuses in order (then 200
// with body ok), recording the requests. A fake, because a real node cannot
// be made to answer 503 with a chosen Retry-After.
type fakeNode struct {
	*httptest.Server
	mu       sync.Mutex
	answers  []fakeAnswer
	requests []string
}

type fakeAnswer struct {
	status     int
	retryAfter string
	body       string
}

func newFake(t *testing.T, ok string, answers ...fakeAnswer) *fakeNode {
	f := &fakeNode{answers: answers}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.requests = append(f.requests, r.Method+" "+r.URL.RequestURI()+" "+string(body))
		var a fakeAnswer
		if len(f.answers) > 0 {
			a, f.answers = f.answers[0], f.answers[1:]
		}
		f.mu.Unlock()
		if a.status == 0 {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, ok)
			return
		}
		if a.retryAfter != "" {
			w.Header().Set("Retry-After", a.retryAfter)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(a.status)
		_, _ = io.WriteString(w, a.body)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeNode) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.requests)
}

const unavailable = `{"error":{"code":"unavailable","message":"node is draining; append through another node"}}`

func TestNewRefusesBadNodeURLs(t *testing.T) {
	for _, nodes := range [][]string{nil, {""}, {"127.0.0.1:8080"}, {"ftp://x"}, {"http://"}, {"http://x/?a=1"}, {"http://u:p@x"}} {
		if _, err := client.New(client.Options{Nodes: nodes}); err == nil {
			t.Errorf("New(%q) accepted", nodes)
		}
	}
	c, err := client.New(client.Options{Nodes: []string{"http://a:1/", " https://b:2/prefix/ "}})
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(c.Nodes()); got != "[http://a:1 https://b:2/prefix]" {
		t.Errorf("Nodes() = %s", got)
	}
}

// TestFailoverOnConnectionRefused: a node that is down costs one failed
// attempt; the call succeeds on the next node, and the next call skips the
// down node (it is cooling down).
func TestFailoverOnConnectionRefused(t *testing.T) {
	live := startNode(t, nil)
	dead := deadURL(t)
	c, rec := newClient(t, client.Options{Nodes: []string{dead, live}})
	ctx := context.Background()
	res, err := c.Append(ctx, client.Row{DispatchKey: "fo-1"})
	if err != nil || len(res) != 1 || res[0].Status != client.Created {
		t.Fatalf("Append = %+v, %v", res, err)
	}
	as := rec.get()
	if len(as) != 2 || as[0].Node != dead || as[0].Err == nil || as[0].StatusCode != 0 || !as[0].WillRetry ||
		as[1].Node != live || as[1].Err != nil || as[1].N != 2 {
		t.Fatalf("attempts %+v; want a refused one on the dead node, then success on the live one", as)
	}
	for i := range 4 {
		if _, err := c.Get(ctx, "fo-1"); err != nil {
			t.Fatalf("Get %d: %v", i, err)
		}
	}
	if got := rec.nodes()[2:]; fmt.Sprint(got) != fmt.Sprint([]string{live, live, live, live}) {
		t.Errorf("calls after the failure went to %v; want the live node only while the dead one cools down", got)
	}
}

// TestRoundRobin: calls are spread over healthy nodes.
func TestRoundRobin(t *testing.T) {
	a, b := startNode(t, nil), startNode(t, nil)
	c, rec := newClient(t, client.Options{Nodes: []string{a, b}})
	for range 6 {
		if _, err := c.Cluster(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	count := map[string]int{}
	for _, n := range rec.nodes() {
		count[n]++
	}
	if count[a] != 3 || count[b] != 3 {
		t.Errorf("6 calls went %v; want 3 to each node", count)
	}
}

// TestRetryOn503HonoursRetryAfter: a 503 is retried; Retry-After lengthens
// the wait (but only up to MaxRetryAfter), never shortens it.
func TestRetryOn503HonoursRetryAfter(t *testing.T) {
	for _, c := range []struct {
		name          string
		retryAfter    string
		maxRetryAfter time.Duration
		min, max      time.Duration
	}{
		{"1 s lengthens a 10 ms backoff", "1", 0, time.Second, 3 * time.Second},
		{"capped by MaxRetryAfter", "3600", 300 * time.Millisecond, 300 * time.Millisecond, 2 * time.Second},
		{"0 keeps the backoff", "0", 0, 5 * time.Millisecond, 900 * time.Millisecond},
		{"a past date keeps the backoff", "Mon, 02 Jan 2006 15:04:05 GMT", 0, 5 * time.Millisecond, 900 * time.Millisecond},
		{"ignored when MaxRetryAfter < 0", "3600", -1, 5 * time.Millisecond, 900 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFake(t, `{"node":"f","shard_count":1,"ownership_version":1,"members":[],"handoff":{"shards_pending":0}}`,
				fakeAnswer{status: 503, retryAfter: c.retryAfter, body: unavailable})
			cl, rec := newClient(t, client.Options{Nodes: []string{f.URL},
				Retry: client.RetryConfig{BaseDelay: 10 * time.Millisecond, MaxDelay: 10 * time.Millisecond, MaxRetryAfter: c.maxRetryAfter}})
			start := time.Now()
			got, err := cl.Cluster(context.Background())
			took := time.Since(start)
			if err != nil || got.Node != "f" {
				t.Fatalf("Cluster = %+v, %v", got, err)
			}
			if f.count() != 2 || len(rec.get()) != 2 || rec.get()[0].StatusCode != 503 {
				t.Fatalf("%d requests, attempts %+v; want a 503 then a 200", f.count(), rec.get())
			}
			if took < c.min || took > c.max {
				t.Errorf("the call took %v; want between %v and %v", took, c.min, c.max)
			}
		})
	}
}

// TestGivesUpAfterMaxAttempts: the final error wraps the last *Error and
// says how many attempts were made.
func TestGivesUpAfterMaxAttempts(t *testing.T) {
	f := newFake(t, `{}`, fakeAnswer{status: 503, body: unavailable}, fakeAnswer{status: 503, body: unavailable},
		fakeAnswer{status: 503, body: unavailable})
	c, _ := newClient(t, client.Options{Nodes: []string{f.URL}, Retry: client.RetryConfig{MaxAttempts: 3, BaseDelay: time.Millisecond}})
	_, err := c.Append(context.Background(), client.Row{DispatchKey: "k"})
	var ae *client.Error
	if !errors.As(err, &ae) || ae.StatusCode != 503 || ae.Code != client.CodeUnavailable || !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("err = %v; want a wrapped 503 unavailable *Error", err)
	}
	if !strings.Contains(err.Error(), "gave up after 3 attempts") || f.count() != 3 {
		t.Errorf("err %q after %d requests; want 3 attempts", err, f.count())
	}
}

// TestNoRetryOnClientErrors: a 400 is the caller's problem: one attempt,
// and the *Error carries code and field.
func TestNoRetryOnClientErrors(t *testing.T) {
	url := startNode(t, nil)
	c, rec := newClient(t, client.Options{Nodes: []string{url}})
	_, err := c.UpdateNamespace(context.Background(), "acme", client.NamespaceUpdate{Retry: &client.NamespaceRetry{Factor: 50}})
	var ae *client.Error
	if !errors.As(err, &ae) || ae.StatusCode != 400 || ae.Code != client.CodeInvalidField || ae.Field != "retry.factor" ||
		!strings.HasPrefix(ae.Message, "retry.factor: ") || ae.Method != http.MethodPut || ae.Path != "/v1/namespaces/acme" || ae.Node != url {
		t.Fatalf("err = %#v", err)
	}
	if !errors.Is(err, client.ErrInvalidField) || errors.Is(err, client.ErrNotFound) ||
		!errors.Is(err, &client.Error{Code: client.CodeInvalidField, Field: "retry.factor"}) ||
		errors.Is(err, &client.Error{Code: client.CodeInvalidField, Field: "max_in_flight"}) {
		t.Errorf("errors.Is does not compare code and field: %v", err)
	}
	if want := "fairshard: PUT /v1/namespaces/acme on " + url + ": HTTP 400 invalid_field: retry.factor: "; !strings.HasPrefix(err.Error(), want) {
		t.Errorf("Error() = %q, want it to start %q", err, want)
	}
	if n := len(rec.get()); n != 1 {
		t.Errorf("%d attempts of a 400; want 1", n)
	}
}

// TestRedriveIsNotRetriedOn503: a POST that changes state is retried only
// when the connection was refused.
func TestRedriveIsNotRetriedOn503(t *testing.T) {
	f := newFake(t, `{"redriven":1,"unreachable_nodes":[]}`, fakeAnswer{status: 503, body: unavailable})
	c, _ := newClient(t, client.Options{Nodes: []string{f.URL}, Retry: client.RetryConfig{BaseDelay: time.Millisecond}})
	if _, err := c.Redrive(context.Background(), "ns"); !errors.Is(err, client.ErrUnavailable) || f.count() != 1 {
		t.Fatalf("Redrive after a 503: %v after %d requests; want the 503 after 1", err, f.count())
	}
	live := startNode(t, nil)
	c2, rec := newClient(t, client.Options{Nodes: []string{deadURL(t), live}, Retry: client.RetryConfig{BaseDelay: time.Millisecond}})
	res, err := c2.Redrive(context.Background(), "ns", "k1")
	if err != nil || res.Redriven != 0 || len(rec.get()) != 2 {
		t.Fatalf("Redrive with the first node down: %+v, %v, attempts %+v; want success on the second", res, err, rec.get())
	}
}

// TestAttemptTimeoutFailsOver: a node that accepts the connection and never
// answers is cut off after Options.Timeout and the call goes elsewhere.
func TestAttemptTimeoutFailsOver(t *testing.T) {
	release := make(chan struct{})
	hung := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer hung.Close()
	defer close(release)
	live := startNode(t, nil)
	c, rec := newClient(t, client.Options{Nodes: []string{hung.URL, live}, Timeout: 200 * time.Millisecond,
		Retry: client.RetryConfig{BaseDelay: time.Millisecond}})
	start := time.Now()
	if _, err := c.Append(context.Background(), client.Row{DispatchKey: "hung-1"}); err != nil {
		t.Fatal(err)
	}
	as := rec.get()
	if len(as) != 2 || as[0].Node != hung.URL || !errors.Is(as[0].Err, context.DeadlineExceeded) || as[1].Node != live {
		t.Fatalf("attempts %+v; want a timeout on the hung node then the live node", as)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v", took)
	}
}

// TestContextEndsTheWait: the caller's context bounds retries and waits.
func TestContextEndsTheWait(t *testing.T) {
	f := newFake(t, `{}`, fakeAnswer{status: 503, retryAfter: "30", body: unavailable})
	c, _ := newClient(t, client.Options{Nodes: []string{f.URL}})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Cluster(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, client.ErrUnavailable) {
		t.Fatalf("err = %v; want the context's deadline, wrapping the last 503", err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("returned after %v; the context ended after 200 ms", took)
	}
}

// TestAttemptHookPerCall: WithAttemptHook sees only its own call's
// attempts.
func TestAttemptHookPerCall(t *testing.T) {
	live := startNode(t, nil)
	c, _ := newClient(t, client.Options{Nodes: []string{deadURL(t), live}, Retry: client.RetryConfig{BaseDelay: time.Millisecond}})
	var mine []client.Attempt
	ctx := client.WithAttemptHook(context.Background(), func(a client.Attempt) { mine = append(mine, a) })
	if _, err := c.Append(ctx, client.Row{DispatchKey: "hook-1"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get(context.Background(), "hook-1"); err != nil {
		t.Fatal(err)
	}
	if len(mine) != 2 || mine[0].Method != http.MethodPost || mine[0].Path != "/v1/rows" || mine[0].Err == nil || mine[1].Err != nil {
		t.Errorf("hook saw %+v; want the append's failed and successful attempts only", mine)
	}
}

// TestAppendSplitsLargeCalls: more than 1,000 rows, or more than 10 MiB,
// go as several requests; results come back in order, and a bad row is
// named by its index in the caller's slice.
func TestAppendSplitsLargeCalls(t *testing.T) {
	url := startNode(t, nil)
	c, rec := newClient(t, client.Options{Nodes: []string{url}})
	ctx := context.Background()
	rows := make([]client.Row, 2500)
	for i := range rows {
		rows[i] = client.Row{DispatchKey: fmt.Sprintf("split-%04d", i), Namespace: "split"}
	}
	res, err := c.Append(ctx, rows...)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 2500 || len(rec.get()) != 3 {
		t.Fatalf("%d results in %d requests; want 2500 in 3", len(res), len(rec.get()))
	}
	for i, r := range res {
		if r.DispatchKey != rows[i].DispatchKey || r.Status != client.Created {
			t.Fatalf("result %d = %+v", i, r)
		}
	}

	big := make([]client.Row, 20) // 20 × 600 KiB: over 10 MiB in one body
	pad := strings.Repeat("x", 600<<10)
	for i := range big {
		big[i] = client.Row{DispatchKey: fmt.Sprintf("big-%d", i), Payload: json.RawMessage(`"` + pad + `"`)}
	}
	before := len(rec.get())
	if res, err := c.Append(ctx, big...); err != nil || len(res) != 20 {
		t.Fatalf("Append of 20 × 600 KiB: %d results, %v", len(res), err)
	}
	if n := len(rec.get()) - before; n != 2 {
		t.Errorf("20 × 600 KiB went in %d requests; want 2 (each under 10 MiB)", n)
	}

	bad := make([]client.Row, 1500)
	for i := range bad {
		bad[i] = client.Row{DispatchKey: fmt.Sprintf("bad-%04d", i)}
	}
	bad[1003].Namespace = "no spaces allowed"
	res, err = c.Append(ctx, bad...)
	var ae *client.Error
	if !errors.As(err, &ae) || ae.Field != "rows[1003].namespace" || !strings.HasPrefix(ae.Message, "rows[1003].namespace: ") {
		t.Fatalf("err = %v (field %q); want rows[1003].namespace", err, func() string {
			if ae != nil {
				return ae.Field
			}
			return ""
		}())
	}
	if len(res) != 1000 {
		t.Errorf("%d results returned with the error; want the first request's 1000", len(res))
	}
	if _, err := c.Get(ctx, "bad-1002"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("bad-1002 (in the refused request) was stored: %v", err)
	}
}

// TestRowEncoding: the wire form of rows and settings.
func TestRowEncoding(t *testing.T) {
	for _, c := range []struct {
		v    any
		want string
	}{
		{client.Row{DispatchKey: "k"}, `{"dispatch_key":"k"}`},
		{client.Row{WorkflowID: "wf", Ordinal: 0}, `{"workflow_id":"wf","ordinal":0}`},
		{client.Row{DispatchKey: "k", Ordinal: 5}, `{"dispatch_key":"k","ordinal":5}`},
		{client.Row{DispatchKey: "k", PayloadBytes: []byte("hi"), Delay: 1500 * time.Microsecond}, `{"dispatch_key":"k","payload_base64":"aGk=","delay_ms":2}`},
		{client.Row{DispatchKey: "k", PayloadBytes: []byte{}}, `{"dispatch_key":"k","payload_base64":""}`},
		{client.Row{DispatchKey: "k", Payload: json.RawMessage(`{"a":1}`), Delay: 2 * time.Second}, `{"dispatch_key":"k","payload":{"a":1},"delay_ms":2000}`},
		{client.NamespaceUpdate{}, `{}`},
		{client.NamespaceUpdate{DefaultMaxInFlight: true, DefaultRetry: true}, `{"max_in_flight":null,"retry":null}`},
		{client.NamespaceUpdate{MaxInFlight: new(uint32(0)), Paused: new(false)}, `{"max_in_flight":0,"paused":false}`},
		{client.NamespaceUpdate{Retry: &client.NamespaceRetry{Base: time.Second, Factor: 1.5}}, `{"retry":{"base_ms":1000,"factor":1.5}}`},
		{client.Target{URL: "http://t/{namespace}"}, `{"url":"http://t/{namespace}"}`},
		{client.Target{URL: "http://t", SigningSecrets: []string{"whsec_a", "whsec_b"}, Headers: map[string]string{"Authorization": "x"}, HeaderNames: []string{"ignored"}},
			`{"url":"http://t","signing_secrets":["whsec_a","whsec_b"],"headers":{"Authorization":"x"}}`},
	} {
		b, err := json.Marshal(c.v)
		if err != nil || string(b) != c.want {
			t.Errorf("%+v encodes as %s (%v), want %s", c.v, b, err, c.want)
		}
	}
	if _, err := json.Marshal(client.NamespaceUpdate{MaxInFlight: new(uint32(1)), DefaultMaxInFlight: true}); err == nil {
		t.Error("an update setting MaxInFlight and DefaultMaxInFlight was encoded")
	}
}

// TestDeadLetterPagesStopsWhenTheLoopBreaks: breaking out of the range
// loop fetches no further page; an error is yielded once and ends it.
func TestDeadLetterPagesStopsWhenTheLoopBreaks(t *testing.T) {
	f := newFake(t, `{"rows":[{"dispatch_key":"a","ordinal":0,"namespace":"n","task_queue":"q","status":"failed","attempt":1,"visible_after":"2026-01-01T00:00:00Z","created_at":"2026-01-01T00:00:00Z","shard":1}],"next":"a","unreachable_nodes":[]}`)
	c, _ := newClient(t, client.Options{Nodes: []string{f.URL}})
	pages := 0
	for page, err := range c.DeadLetterPages(context.Background(), "n", 1) {
		if err != nil || page.Rows[0].DispatchKey != "a" {
			t.Fatal(page, err)
		}
		if pages++; pages == 3 {
			break
		}
	}
	if f.count() != 3 || !strings.Contains(f.requests[2], "after=a&limit=1") {
		t.Errorf("%d requests (%q) for 3 pages; want 3, following next", f.count(), f.requests)
	}
	bad := newFake(t, `{}`, fakeAnswer{status: 400, body: `{"error":{"code":"invalid_field","field":"limit","message":"limit: must be an integer from 1 to 1000"}}`})
	c2, _ := newClient(t, client.Options{Nodes: []string{bad.URL}})
	errs := 0
	for page, err := range c2.DeadLetterPages(context.Background(), "n", 5000) {
		if page != nil || !errors.Is(err, &client.Error{Code: client.CodeInvalidField, Field: "limit"}) {
			t.Fatalf("page %v, err %v", page, err)
		}
		errs++
	}
	if errs != 1 {
		t.Errorf("%d errors yielded, want 1", errs)
	}
}

// TestNonJSONErrorAnswer: a proxy's HTML error page still becomes an
// *Error, with the status and the start of the body.
func TestNonJSONErrorAnswer(t *testing.T) {
	f := newFake(t, `{}`, fakeAnswer{status: 418, body: "<html>teapot</html>"})
	c, _ := newClient(t, client.Options{Nodes: []string{f.URL}})
	_, err := c.Shards(context.Background())
	var ae *client.Error
	if !errors.As(err, &ae) || ae.StatusCode != 418 || ae.Code != "" || ae.Message != "<html>teapot</html>" {
		t.Fatalf("err = %#v", err)
	}
}

// TestTokenIsSent: with Options.Token the calls pass a node's --api-token
// check; without it they get ErrUnauthorized.
func TestTokenIsSent(t *testing.T) {
	url := startNode(t, func(c *node.Config) { c.APIToken = "tok" })
	open, _ := newClient(t, client.Options{Nodes: []string{url}})
	if _, err := open.Cluster(context.Background()); !errors.Is(err, client.ErrUnauthorized) {
		t.Errorf("without the token: %v, want unauthorized", err)
	}
	authed, _ := newClient(t, client.Options{Nodes: []string{url}, Token: "tok"})
	if _, err := authed.Cluster(context.Background()); err != nil {
		t.Errorf("with the token: %v", err)
	}
}

// TestConcurrentUse: one client shared by many goroutines (run with -race).
func TestConcurrentUse(t *testing.T) {
	a, b := startNode(t, nil), startNode(t, nil)
	c, _ := newClient(t, client.Options{Nodes: []string{a, deadURL(t), b}, Retry: client.RetryConfig{BaseDelay: time.Millisecond}})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for g := range 8 {
		wg.Go(func() {
			for i := range 20 {
				if _, err := c.Append(context.Background(), client.Row{DispatchKey: fmt.Sprintf("cc-%d-%d", g, i)}); err != nil {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Errorf("%d appends failed with two of three nodes up", failed.Load())
	}
}

// TestTargetStringRedacts: a Target printed by mistake shows no secret
// and no header value.
func TestTargetStringRedacts(t *testing.T) {
	tg := client.Target{URL: "http://t", SigningSecrets: []string{"whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQtc2VjcmV0"}, Headers: map[string]string{"Authorization": "Bearer tok-77"}}
	for _, out := range []string{tg.String(), fmt.Sprintf("%v %+v %#v", tg, tg, &tg)} {
		if strings.Contains(out, "c2VjcmV0") || strings.Contains(out, "tok-77") {
			t.Errorf("printed target shows a credential: %s", out)
		}
	}
}

// TestDeadLetterPageBudget: against a real node, MaxBytes bounds a page's
// rows by their JSON size (at least one row a page) and OmitPayload leaves
// the payloads out, giving their sizes instead.
func TestDeadLetterPageBudget(t *testing.T) {
	c, _ := newClient(t, client.Options{Nodes: []string{startNode(t, nil)}})
	ctx := context.Background()
	payload := bytes.Repeat([]byte("x"), 10_000)
	var rows []client.Row
	for i := range 6 {
		rows = append(rows, client.Row{DispatchKey: fmt.Sprintf("big-%d", i), Namespace: "budget", TaskQueue: "rejected", PayloadBytes: payload})
	}
	if _, err := c.Append(ctx, rows...); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		page, err := c.DeadLetters(ctx, "budget", client.DeadLetterQuery{})
		if err == nil && len(page.Rows) == 6 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("6 dead letters never listed: %+v, %v", page, err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// A budget of 20,000 bytes holds one 10 KB row's JSON (base64: ~13.4 KB)
	// but not two: six pages of one row.
	var pages, seen int
	for page, err := range c.DeadLetterPagesOf(ctx, "budget", client.DeadLetterQuery{MaxBytes: 20_000}) {
		if err != nil {
			t.Fatal(err)
		}
		pages++
		for _, r := range page.Rows {
			seen++
			if len(r.Payload) != len(payload) {
				t.Fatalf("row %s payload %d bytes; want %d", r.DispatchKey, len(r.Payload), len(payload))
			}
		}
		if len(page.Rows) > 1 {
			t.Fatalf("a page of %d rows within a 20,000-byte budget; want 1", len(page.Rows))
		}
	}
	if seen != 6 || pages < 6 {
		t.Fatalf("walked %d rows in %d pages; want 6 in at least 6", seen, pages)
	}

	page, err := c.DeadLetters(ctx, "budget", client.DeadLetterQuery{OmitPayload: true, MaxBytes: 20_000})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Rows) != 6 {
		t.Fatalf("a page without payloads held %d rows within 20,000 bytes; want all 6", len(page.Rows))
	}
	for _, r := range page.Rows {
		if r.Payload != nil || r.PayloadSize != len(payload) {
			t.Fatalf("row %s: payload %d bytes, payload_bytes %d; want none and %d", r.DispatchKey, len(r.Payload), r.PayloadSize, len(payload))
		}
	}
}

// Shard reads GET /v1/shards/{shard}: on a one-node cluster every shard's
// set is that node, primary, synced, agreeing with itself; a shard past
// the shard count is a 400 naming the field.
func TestShardReadsOneShardsReplicas(t *testing.T) {
	url := startNode(t, nil)
	c, _ := newClient(t, client.Options{Nodes: []string{url}})
	ctx := context.Background()
	table, err := c.Shards(ctx)
	if err != nil {
		t.Fatal(err)
	}
	last := table.ShardCount - 1
	s, err := c.Shard(ctx, last)
	if err != nil {
		t.Fatal(err)
	}
	if s.Shard != last || !s.InSync || len(s.Replicas) != 1 || s.Replicas[0].Node != table.Shards[last].Owner ||
		s.Replicas[0].Role != "primary" || !s.Replicas[0].Reachable || !s.Replicas[0].Synced {
		t.Errorf("shard %d: %+v, want one reachable synced primary %s", last, s, table.Shards[last].Owner)
	}
	_, err = c.Shard(ctx, table.ShardCount)
	var ae *client.Error
	if !errors.As(err, &ae) || ae.StatusCode != http.StatusBadRequest {
		t.Errorf("shard %d of %d: err = %v, want a 400", table.ShardCount, table.ShardCount, err)
	}
}
