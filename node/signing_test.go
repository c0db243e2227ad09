package node_test

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/fairshard/fairshard/webhook"
)

// verifyingTarget is a real target that checks every delivery's
// signature with the Standard Webhooks reference library, against each
// secret it knows separately, and records what it saw per dispatch_key.
type verifyingTarget struct {
	mu       sync.Mutex
	secrets  map[string]*standardwebhooks.Webhook // name → verifier
	verified map[string]map[string]int            // secret name → key → verified deliveries
	failed   map[string]map[string]int            // secret name → key → refused deliveries
	ids      map[string][]string                  // key → webhook-id of each attempt
	auth     map[string][]string                  // key → Authorization of each attempt
	fail503  map[string]int                       // key → attempts to answer 503 first
	srv      *httptest.Server
}

func newVerifyingTarget(t *testing.T, secrets map[string]string) *verifyingTarget {
	vt := &verifyingTarget{secrets: map[string]*standardwebhooks.Webhook{}, verified: map[string]map[string]int{},
		failed: map[string]map[string]int{}, ids: map[string][]string{}, auth: map[string][]string{}, fail503: map[string]int{}}
	for name, s := range secrets {
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			t.Fatal(err)
		}
		vt.secrets[name] = wh
		vt.verified[name], vt.failed[name] = map[string]int{}, map[string]int{}
	}
	vt.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		key := r.Header.Get("Idempotency-Key")
		vt.mu.Lock()
		defer vt.mu.Unlock()
		for name, wh := range vt.secrets {
			if err := wh.Verify(body, r.Header); err != nil {
				vt.failed[name][key]++
			} else {
				vt.verified[name][key]++
			}
		}
		vt.ids[key] = append(vt.ids[key], r.Header.Get("webhook-id"))
		vt.auth[key] = append(vt.auth[key], r.Header.Get("Authorization"))
		if vt.fail503[key] > 0 {
			vt.fail503[key]--
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(vt.srv.Close)
	return vt
}

func (vt *verifyingTarget) counts(secret, key string) (verified, failed int) {
	vt.mu.Lock()
	defer vt.mu.Unlock()
	return vt.verified[secret][key], vt.failed[secret][key]
}

type targetAnswer struct {
	URL                       string   `json:"url"`
	SigningSecretFingerprints []string `json:"signing_secret_fingerprints"`
	HeaderNames               []string `json:"header_names"`
}

// TestSignedDeliveriesThroughANode: PUT .../target with a signing secret
// and an Authorization header makes every delivery to it signed (checked
// by the reference library on a real server) and authorized; a retried row
// keeps its webhook-id (the dispatch_key); the answer shows the secret by
// fingerprint and the header by name only, and no credential reaches the
// node's logs. Rotation: with [new, old] a target knowing either secret
// verifies; once old is dropped, deliveries fail verification against it.
func TestSignedDeliveriesThroughANode(t *testing.T) {
	oldS, newS := webhook.NewSecret(), webhook.NewSecret()
	const token = "Bearer tkn-4f1d9c-very-secret"
	vt := newVerifyingTarget(t, map[string]string{"old": oldS, "new": newS})
	n := startNode(t, nil)
	path := "/v1/namespaces/signed/task-queues/default/target"

	var ans targetAnswer
	n.mustDo(http.MethodPut, path, map[string]any{"url": vt.srv.URL + "/hook", "signing_secret": oldS,
		"headers": map[string]string{"authorization": token}}, http.StatusOK, &ans)
	oldSec, _ := webhook.ParseSecret(oldS)
	newSec, _ := webhook.ParseSecret(newS)
	if len(ans.SigningSecretFingerprints) != 1 || ans.SigningSecretFingerprints[0] != oldSec.Fingerprint() ||
		len(ans.HeaderNames) != 1 || ans.HeaderNames[0] != "Authorization" {
		t.Fatalf("PUT answered %+v; want the secret's fingerprint %s and the header name Authorization", ans, oldSec.Fingerprint())
	}
	vt.mu.Lock()
	vt.fail503["s-retried"] = 1
	vt.mu.Unlock()
	n.appendRows(rowIn{"dispatch_key": "s-1", "namespace": "signed", "payload": map[string]any{"n": 1}},
		rowIn{"dispatch_key": "s-retried", "namespace": "signed", "payload_base64": "AAEC/w=="})
	n.waitStatus("s-1", "done", 10*time.Second)
	n.waitStatus("s-retried", "done", 10*time.Second)
	for _, key := range []string{"s-1", "s-retried"} {
		if ok, bad := vt.counts("old", key); ok == 0 || bad != 0 {
			t.Errorf("%s: %d deliveries verified with the secret, %d refused; want all verified", key, ok, bad)
		}
	}
	vt.mu.Lock()
	if ids := vt.ids["s-retried"]; len(ids) != 2 || ids[0] != "s-retried" || ids[1] != "s-retried" {
		t.Errorf("webhook-id of the retried row's attempts: %q; want the dispatch_key on both", ids)
	}
	for key, a := range vt.auth {
		for _, v := range a {
			if v != token {
				t.Errorf("%s: Authorization %q, want the target's static header", key, v)
			}
		}
	}
	vt.mu.Unlock()

	// Rotation: both secrets sign; either verifies.
	n.mustDo(http.MethodPut, path, map[string]any{"url": vt.srv.URL + "/hook", "signing_secrets": []string{newS, oldS},
		"headers": map[string]string{"Authorization": token}}, http.StatusOK, &ans)
	if len(ans.SigningSecretFingerprints) != 2 || ans.SigningSecretFingerprints[0] != newSec.Fingerprint() {
		t.Fatalf("PUT with two secrets answered %+v", ans)
	}
	n.appendRows(rowIn{"dispatch_key": "s-rot", "namespace": "signed", "payload": "both"})
	n.waitStatus("s-rot", "done", 10*time.Second)
	for _, s := range []string{"old", "new"} {
		if ok, bad := vt.counts(s, "s-rot"); ok != 1 || bad != 0 {
			t.Errorf("during the rotation, the %s secret verified %d and refused %d deliveries; want 1 and 0", s, ok, bad)
		}
	}
	// The old secret is dropped: deliveries no longer verify against it.
	n.mustDo(http.MethodPut, path, map[string]any{"url": vt.srv.URL + "/hook", "signing_secrets": []string{newS}}, http.StatusOK, &ans)
	n.appendRows(rowIn{"dispatch_key": "s-new", "namespace": "signed", "payload": "new only"})
	n.waitStatus("s-new", "done", 10*time.Second)
	if ok, bad := vt.counts("new", "s-new"); ok != 1 || bad != 0 {
		t.Errorf("after the rotation the new secret verified %d, refused %d; want 1, 0", ok, bad)
	}
	if ok, bad := vt.counts("old", "s-new"); ok != 0 || bad != 1 {
		t.Errorf("after the rotation the dropped secret verified %d, refused %d; want 0, 1", ok, bad)
	}
	vt.mu.Lock()
	if a := vt.auth["s-new"]; len(a) != 1 || a[0] != "" {
		t.Errorf("Authorization after a PUT without headers: %q; want none (a PUT replaces the whole target)", a)
	}
	vt.mu.Unlock()

	logs := n.logs.String()
	for _, secret := range []string{oldS, newS, strings.TrimPrefix(oldS, "whsec_"), strings.TrimPrefix(newS, "whsec_"), "tkn-4f1d9c"} {
		if strings.Contains(logs, secret) {
			t.Errorf("the node's logs contain a credential (%.12s…)", secret)
		}
	}
}

// TestTargetCredentialsBadInput: every malformed secret or header is
// refused with 400 naming the field, the answer quotes no credential, and
// the stored target is unchanged (deliveries still carry the first
// target's secret and header).
func TestTargetCredentialsBadInput(t *testing.T) {
	good := webhook.NewSecret()
	vt := newVerifyingTarget(t, map[string]string{"good": good})
	n := startNode(t, nil)
	path := "/v1/namespaces/bad/task-queues/default/target"
	n.mustDo(http.MethodPut, path, map[string]any{"url": vt.srv.URL, "signing_secret": good,
		"headers": map[string]string{"X-Api-Key": "k-123"}}, http.StatusOK, nil)

	url := vt.srv.URL + "/other"
	short := "whsec_" + strings.Repeat("A", 30) // 22 bytes
	unpadded := "whsec_" + base64.RawStdEncoding.EncodeToString([]byte("twenty-five bytes of key!"))
	long := strings.Repeat("x", 700)
	cases := []struct {
		name  string
		body  map[string]any
		field string
		quote string // must not appear in the answer
	}{
		{"both secret fields", map[string]any{"url": url, "signing_secret": good, "signing_secrets": []string{good}}, "signing_secrets", good},
		{"no prefix", map[string]any{"url": url, "signing_secret": strings.TrimPrefix(good, "whsec_")}, "signing_secret", strings.TrimPrefix(good, "whsec_")},
		{"empty secret", map[string]any{"url": url, "signing_secret": ""}, "signing_secret", ""},
		{"key too short", map[string]any{"url": url, "signing_secret": short}, "signing_secret", short},
		// The reference library refuses to load an unpadded secret; a
		// trailing newline would be a second spelling of the same key.
		{"no base64 padding", map[string]any{"url": url, "signing_secret": unpadded}, "signing_secret", strings.TrimPrefix(unpadded, "whsec_")},
		{"trailing newline", map[string]any{"url": url, "signing_secret": good + "\n"}, "signing_secret", strings.TrimPrefix(good, "whsec_")},
		{"leading space", map[string]any{"url": url, "signing_secrets": []string{" " + good}}, "signing_secrets[0]", strings.TrimPrefix(good, "whsec_")},
		{"not base64", map[string]any{"url": url, "signing_secrets": []string{good, "whsec_***notbase64***notbase64***"}}, "signing_secrets[1]", "notbase64"},
		{"four secrets", map[string]any{"url": url, "signing_secrets": []string{webhook.NewSecret(), webhook.NewSecret(), webhook.NewSecret(), webhook.NewSecret()}}, "signing_secrets", ""},
		{"same secret twice", map[string]any{"url": url, "signing_secrets": []string{good, good}}, "signing_secrets[1]", good},
		{"hop-by-hop Connection", map[string]any{"url": url, "headers": map[string]string{"connection": "close"}}, "headers.Connection", ""},
		{"Transfer-Encoding", map[string]any{"url": url, "headers": map[string]string{"Transfer-Encoding": "chunked"}}, "headers.Transfer-Encoding", ""},
		{"TE", map[string]any{"url": url, "headers": map[string]string{"TE": "trailers"}}, "headers.Te", ""},
		{"Upgrade", map[string]any{"url": url, "headers": map[string]string{"Upgrade": "h2c"}}, "headers.Upgrade", ""},
		{"Host", map[string]any{"url": url, "headers": map[string]string{"Host": "evil"}}, "headers.Host", ""},
		{"Content-Length", map[string]any{"url": url, "headers": map[string]string{"Content-Length": "1"}}, "headers.Content-Length", ""},
		{"Idempotency-Key", map[string]any{"url": url, "headers": map[string]string{"idempotency-key": "x"}}, "headers.Idempotency-Key", ""},
		{"ours", map[string]any{"url": url, "headers": map[string]string{"Fairshard-Attempt": "1"}}, "headers.Fairshard-Attempt", ""},
		{"signature header", map[string]any{"url": url, "headers": map[string]string{"webhook-signature": "v1,x"}}, "headers.Webhook-Signature", ""},
		{"same name twice", map[string]any{"url": url, "headers": map[string]string{"Authorization": "a-1", "authorization": "a-2"}}, "headers.Authorization", "a-2"},
		{"bad name", map[string]any{"url": url, "headers": map[string]string{"X Bad": "v"}}, "headers", ""},
		{"header injection", map[string]any{"url": url, "headers": map[string]string{"X-A": "ok\r\nX-Evil: 1"}}, "headers.X-A", "X-Evil"},
		{"non-ASCII value", map[string]any{"url": url, "headers": map[string]string{"X-A": "café-token"}}, "headers.X-A", "café"},
		{"edge spaces", map[string]any{"url": url, "headers": map[string]string{"Authorization": " Bearer tok-9 "}}, "headers.Authorization", "tok-9"},
		{"empty value", map[string]any{"url": url, "headers": map[string]string{"X-A": ""}}, "headers.X-A", ""},
		{"too many headers", map[string]any{"url": url, "headers": manyHeaders(17)}, "headers", ""},
		{"too big together", map[string]any{"url": url, "signing_secret": good, "headers": map[string]string{"Authorization": "Bearer " + long[:500], "X-B": long[:400]}}, "headers", long[:100]},
	}
	for _, tc := range cases {
		st, body := n.do(http.MethodPut, path, tc.body)
		var e apiError
		_ = json.Unmarshal(body, &e)
		if st != http.StatusBadRequest || e.Error.Field != tc.field {
			t.Errorf("%s: HTTP %d field %q (%s); want 400 naming %q", tc.name, st, e.Error.Field, body, tc.field)
		}
		if tc.quote != "" && strings.Contains(string(body), tc.quote) {
			t.Errorf("%s: the answer quotes the credential: %s", tc.name, body)
		}
	}
	// Nothing changed: a delivery still goes to the first URL, signed with
	// the first secret, with its header.
	n.appendRows(rowIn{"dispatch_key": "after-bad", "namespace": "bad", "payload": 1})
	n.waitStatus("after-bad", "done", 10*time.Second)
	if ok, bad := vt.counts("good", "after-bad"); ok != 1 || bad != 0 {
		t.Errorf("after the refused PUTs: %d verified, %d refused deliveries; want the first target's signature", ok, bad)
	}
}

func manyHeaders(n int) map[string]string {
	out := map[string]string{}
	for i := range n {
		out["X-H"+strings.Repeat("a", i+1)] = "v"
	}
	return out
}
