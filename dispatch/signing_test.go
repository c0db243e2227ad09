package dispatch

import (
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/webhook"
)

// TestSignedDeliveries: a target with signing secrets gets every attempt
// signed per Standard Webhooks, checked by the specification's own Go
// library on a real server; webhook-id is the dispatch_key on every
// attempt (a retry keeps it) while each attempt carries its own
// timestamp; with two secrets (rotation) a receiver knowing either one
// verifies. The target's static headers arrive; none can override the
// dispatcher's own (the dispatcher sets them after).
func TestSignedDeliveries(t *testing.T) {
	newS, oldS := webhook.NewSecret(), webhook.NewSecret()
	verifiers := map[string]*standardwebhooks.Webhook{}
	for name, s := range map[string]string{"new": newS, "old": oldS} {
		v, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			t.Fatal(err)
		}
		verifiers[name] = v
	}
	var failures []string
	tg := newTarget(t, nil) // 200 to everything
	// The "retried" row's first attempt goes to a target answering 503.
	fail := newTarget(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusServiceUnavailable) })
	var useFail sync.Map
	useFail.Store("retried", true)
	headers := map[string]string{"Authorization": "Bearer s3cr3t-token", "X-Tenant": "acme"}
	cfg := testConfig(TargetsFunc(func(r outbox.ClaimScope) (Target, bool) {
		u := tg.URL()
		if r.TaskQueue == "flaky" {
			if _, ok := useFail.Load("retried"); ok {
				u = fail.URL()
			}
		}
		return Target{URL: u + "/hook", Headers: headers, SigningSecrets: []string{newS, oldS}}, true
	}))
	d, b := setup(t, cfg)
	payloads := map[string]string{"plain": `{"order":42}`, "binary": "\x00\x01\xff", "retried": `{"retry":true}`}
	for key, p := range payloads {
		r := mkRow(key, "ns", "q", time.Now())
		if key == "retried" {
			r.TaskQueue = "flaky"
		}
		r.Payload = []byte(p)
		mustAppend(t, b.store, r)
	}
	sweep(t, d)
	waitIdle(t, d)
	useFail.Delete("retried")
	// The retry waits its backoff (500 ms ± 20 %); sweep until it is done.
	poll.Eventually(t, 10*time.Second, "the retried row delivered", func() (bool, string) {
		sweep(t, d)
		waitIdle(t, d)
		return statusIs(b.store, "retried", outbox.StatusDone), ""
	})
	drain(t, d)

	all := append(fail.requests(), tg.requests()...)
	if len(all) < 4 {
		t.Fatalf("%d requests, want 4 (3 rows, one retried)", len(all))
	}
	stamps := map[string][]string{}
	for _, rq := range all {
		key := rq.header.Get(HeaderDispatchKey)
		if id := rq.header.Get("webhook-id"); id != key {
			t.Errorf("webhook-id %q, want the dispatch_key %q", id, key)
		}
		if sigs := strings.Fields(rq.header.Get("webhook-signature")); len(sigs) != 2 {
			t.Errorf("%s: webhook-signature %q, want 2 signatures (two secrets)", key, rq.header.Get("webhook-signature"))
		}
		for name, v := range verifiers {
			if err := v.Verify(rq.body, rq.header); err != nil {
				failures = append(failures, key+" with the "+name+" secret: "+err.Error())
			}
		}
		if string(rq.body) != payloads[key] {
			t.Errorf("%s: body %q, want %q", key, rq.body, payloads[key])
		}
		for h, v := range headers {
			if got := rq.header.Get(h); got != v {
				t.Errorf("%s: static header %s = %q, want %q", key, h, got, v)
			}
		}
		stamps[key] = append(stamps[key], rq.header.Get("webhook-timestamp"))
	}
	for _, f := range failures {
		t.Errorf("signature refused by the reference library: %s", f)
	}
	if n := len(stamps["retried"]); n != 2 {
		t.Errorf("the retried row was sent %d times, want 2", n)
	}
}

// TestDispatcherHeadersWinOverStaticOnes: a static header under one of
// the dispatcher's names (which the node refuses, see ReservedHeader)
// would not replace the dispatcher's value.
func TestDispatcherHeadersWinOverStaticOnes(t *testing.T) {
	row := mkRow("k", "ns", "q", time.Now())
	req, err := newDeliveryRequest(t.Context(), &row, Target{URL: "http://h/x", Headers: map[string]string{
		HeaderIdempotencyKey: "forged", "Webhook-Id": "forged", "User-Agent": "forged", "Content-Type": "text/forged",
	}, SigningSecrets: []string{webhook.NewSecret()}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{HeaderIdempotencyKey, "Webhook-Id", "User-Agent", "Content-Type"} {
		if strings.Contains(req.Header.Get(h), "forged") {
			t.Errorf("%s = %q: a static header replaced the dispatcher's", h, req.Header.Get(h))
		}
	}
	// A bad secret never reaches the wire, and the error does not quote it.
	_, err = newDeliveryRequest(t.Context(), &row, Target{URL: "http://h/x", SigningSecrets: []string{"whsec_c2hvcnQ="}}, time.Now())
	if err == nil || strings.Contains(err.Error(), "c2hvcnQ") {
		t.Fatalf("bad secret: %v; want an error that does not quote it", err)
	}
}

// TestReservedHeader: hop-by-hop, framing and our own headers, in any
// case, are reserved; ordinary ones are not.
func TestReservedHeader(t *testing.T) {
	for _, h := range []string{"connection", "Keep-Alive", "TE", "te", "Trailer", "transfer-encoding", "Upgrade", "Proxy-Authorization",
		"Proxy-Connection", "host", "Content-Length", "Content-Type", "User-Agent", "idempotency-key", "Fairshard-Attempt",
		"fairshard-anything", "webhook-id", "Webhook-Signature", "webhook-timestamp", "Expect"} {
		if !ReservedHeader(h) {
			t.Errorf("ReservedHeader(%q) = false, want true", h)
		}
	}
	for _, h := range []string{"Authorization", "X-Api-Key", "Cookie", "X-Fairshard", "Webhooks"} {
		if ReservedHeader(h) {
			t.Errorf("ReservedHeader(%q) = true, want false", h)
		}
	}
}

// TestStoredSecretOfAnOlderSpellingStillSigns: a signing secret stored
// before the API refused unpadded base64 and edge line breaks still signs
// deliveries, with its key: a receiver that loaded the padded form (the
// only one the reference library loads) verifies them.
func TestStoredSecretOfAnOlderSpellingStillSigns(t *testing.T) {
	padded := webhook.NewSecret() // 32 bytes: one "=" of padding
	stored := strings.TrimRight(padded, "=") + "\n"
	row := mkRow("old-spelling", "ns", "q", time.Now())
	row.Payload = []byte(`{"n":1}`)
	req, err := newDeliveryRequest(t.Context(), &row, Target{URL: "http://127.0.0.1:1/hook", SigningSecrets: []string{stored}}, time.Now())
	if err != nil {
		t.Fatalf("a stored secret of the older spelling: %v", err)
	}
	v, err := standardwebhooks.NewWebhook(padded)
	if err != nil {
		t.Fatal(err)
	}
	if err := v.Verify(row.Payload, req.Header); err != nil {
		t.Errorf("the reference library with the padded secret refuses the signature: %v", err)
	}
}
