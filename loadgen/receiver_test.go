package loadgen

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/webhook"
)

// TestReceiverCountsEveryRequest: Requests counts every request per key,
// answered or not (a 503 on purpose, a sender that gave up mid-request),
// while Delivered and Count see successes only; MaxInFlight is the most
// requests held at once.
func TestReceiverCountsEveryRequest(t *testing.T) {
	r := NewReceiver(time.Second)
	srv := httptest.NewServer(r)
	defer srv.Close()
	post := func(ctx context.Context, key string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader(`{}`))
		req.Header.Set(HeaderDispatchKey, key)
		req.Header.Set(HeaderNamespace, "ns")
		resp, err := srv.Client().Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
		}
	}
	var wg sync.WaitGroup
	for _, k := range []string{"a", "b", "c"} {
		wg.Go(func() { post(context.Background(), k) })
	}
	waitFor("three requests held at once", func() bool { return r.MaxInFlight() == 3 })
	wg.Wait()

	// A sender that gives up while the request is held.
	ctx, cancel := context.WithCancel(context.Background())
	wg.Go(func() { post(ctx, "a") })
	waitFor("the second request of a", func() bool { return r.Requests()["a"] == 2 })
	cancel()
	wg.Wait()

	r.SetStatus(503)
	r.SetDelay(0)
	if code := post(context.Background(), "b"); code != 503 {
		t.Fatalf("got HTTP %d, want the injected 503", code)
	}
	if got := r.Requests(); got["a"] != 2 || got["b"] != 2 || got["c"] != 1 {
		t.Fatalf("Requests() = %v, want a:2 b:2 c:1", got)
	}
	if r.Delivered() != 3 || r.Count("a") != 1 || r.Count("b") != 1 {
		t.Fatalf("Delivered %d, Count(a) %d, Count(b) %d: want 3, 1, 1 (successes only)", r.Delivered(), r.Count("a"), r.Count("b"))
	}
	if m := r.MaxInFlight(); m != 3 {
		t.Fatalf("MaxInFlight() = %d, want 3", m)
	}
}

// TestReceiverVerifiesSignatures: with signing secrets the receiver
// accepts a request signed with any of them, answers 401 to one unsigned
// or signed with another secret, and counts both.
func TestReceiverVerifiesSignatures(t *testing.T) {
	a, b, other := webhook.NewSecret(), webhook.NewSecret(), webhook.NewSecret()
	secrets, err := webhook.ParseSecrets([]string{a, b})
	if err != nil {
		t.Fatal(err)
	}
	r := NewReceiver(0)
	r.SetSigningSecrets(secrets)
	srv := httptest.NewServer(r)
	defer srv.Close()
	send := func(key string, sign ...string) int {
		body := []byte(`{"k":"` + key + `"}`)
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(body))
		req.Header.Set(HeaderDispatchKey, key)
		ss, _ := webhook.ParseSecrets(sign)
		webhook.Sign(req.Header, key, time.Now(), body, ss...)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for key, tc := range map[string]struct {
		sign []string
		want int
	}{"with-a": {[]string{a}, 200}, "with-b": {[]string{b}, 200}, "rotating": {[]string{other, a}, 200},
		"unsigned": {nil, 401}, "other": {[]string{other}, 401}} {
		if got := send(key, tc.sign...); got != tc.want {
			t.Errorf("%s: HTTP %d, want %d", key, got, tc.want)
		}
	}
	if r.Verified() != 3 || r.SignatureFailures() != 2 || r.Distinct() != 3 {
		t.Fatalf("verified %d, failures %d, delivered %d distinct; want 3, 2, 3", r.Verified(), r.SignatureFailures(), r.Distinct())
	}
}
