package dispatch

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/egress"
	"github.com/fairshard/fairshard/outbox"
)

// TestEgressPolicyAtDialTime: a target URL naming the cloud metadata
// address is refused by the default policy before any connection
// (last_error names the policy); a real loopback target is refused under
// --target-allow without loopback, even through the name "localhost"
// (resolved at dial time), and receives nothing.
func TestEgressPolicyAtDialTime(t *testing.T) {
	cfg := testConfig(static("http://169.254.169.254/latest/meta-data/iam"))
	d, b := setup(t, cfg)
	mustAppend(t, b.store, mkRow("meta", "ns", "q", time.Now()))
	start := time.Now()
	sweep(t, d)
	got := wantStatus(t, b.store, "meta", outbox.StatusPending)
	drain(t, d)
	if !strings.Contains(got.LastError, "egress policy") || got.Attempt != 2 {
		t.Errorf("metadata target: attempt %d last_error %q, want a retry naming the egress policy", got.Attempt, got.LastError)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("refusal took %v: the check must precede the connect", took)
	}

	tg := newTarget(t, func(w http.ResponseWriter, _ *http.Request) {})
	port := tg.URL()[strings.LastIndex(tg.URL(), ":"):]
	policy, err := egress.Parse([]string{"10.0.0.0/8"})
	if err != nil {
		t.Fatal(err)
	}
	cfg = testConfig(static("http://localhost" + port + "/deliver"))
	cfg.Egress = policy
	d, b = setup(t, cfg)
	defer drain(t, d)
	mustAppend(t, b.store, mkRow("lo", "ns", "q", time.Now()))
	sweep(t, d)
	got = wantStatus(t, b.store, "lo", outbox.StatusPending)
	if !strings.Contains(got.LastError, "not in --target-allow") {
		t.Errorf("loopback target under --target-allow 10.0.0.0/8: last_error %q", got.LastError)
	}
	if n := tg.total(); n != 0 {
		t.Errorf("the refused target received %d requests", n)
	}
}

// TestLastErrorExcerptBounded: a target's error answer reaches last_error
// (and so the dead-letters API) as at most BodyExcerptMax bytes, control
// characters blanked: a secret further in the body never does.
func TestLastErrorExcerptBounded(t *testing.T) {
	secret := "AKIA-SECRET-TOKEN-VALUE"
	body := "denied\r\n" + strings.Repeat("-", 80) + secret
	tg := newTarget(t, func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(403)
		_, _ = w.Write([]byte(body))
	})
	d, b := setup(t, testConfig(static(tg.URL())))
	defer drain(t, d)
	mustAppend(t, b.store, mkRow("k", "ns", "q", time.Now()))
	sweep(t, d)
	got := wantStatus(t, b.store, "k", outbox.StatusFailed)
	if strings.Contains(got.LastError, "SECRET") || !strings.HasPrefix(got.LastError, "HTTP 403: denied") ||
		len(got.LastError) > len("HTTP 403: ")+DefaultBodyExcerptMax || strings.ContainsAny(got.LastError, "\r\n") {
		t.Errorf("last_error %q (%d bytes): want the status and at most %d clean bytes of the body", got.LastError, len(got.LastError), DefaultBodyExcerptMax)
	}
}

// TestListedNameStillCheckedWhereTheDispatcherDials: the dispatcher's own
// transport judges what a listed name resolves to, as every dial does
// (a name in --target-allow allows the name, not its addresses). "localhost", listed alone, resolves (for real, at dial
// time) to loopback, which a name may not reach unless a CIDR lists it:
// refused, the target receives nothing; with 127.0.0.0/8 listed too it
// is delivered. The metadata address in NAT64 form is refused by the
// default policy.
func TestListedNameStillCheckedWhereTheDispatcherDials(t *testing.T) {
	tg := newTarget(t, func(w http.ResponseWriter, _ *http.Request) {})
	port := tg.URL()[strings.LastIndex(tg.URL(), ":"):]
	for _, c := range []struct {
		allow     []string
		delivered bool
	}{
		{[]string{"localhost"}, false},
		{[]string{"localhost", "127.0.0.0/8", "::1"}, true},
	} {
		policy, err := egress.Parse(c.allow)
		if err != nil {
			t.Fatal(err)
		}
		cfg := testConfig(static("http://localhost" + port + "/deliver"))
		cfg.Egress = policy
		d, b := setup(t, cfg)
		key := "lo-" + strings.Join(c.allow, "-")
		mustAppend(t, b.store, mkRow(key, "ns", "q", time.Now()))
		sweep(t, d)
		waitIdle(t, d)
		drain(t, d)
		if c.delivered {
			wantStatus(t, b.store, key, outbox.StatusDone)
			continue
		}
		got := wantStatus(t, b.store, key, outbox.StatusPending)
		if !strings.Contains(got.LastError, "egress policy") || !strings.Contains(got.LastError, "public addresses only") {
			t.Errorf("--target-allow localhost: last_error %q, want the refusal of a loopback address for a listed name", got.LastError)
		}
	}
	if n := tg.total(); n != 1 {
		t.Errorf("the target received %d requests, want 1 (only with loopback listed)", n)
	}

	cfg := testConfig(static("http://[64:ff9b::a9fe:a9fe]/latest/meta-data/"))
	d, b := setup(t, cfg)
	defer drain(t, d)
	mustAppend(t, b.store, mkRow("nat64", "ns", "q", time.Now()))
	sweep(t, d)
	got := wantStatus(t, b.store, "nat64", outbox.StatusPending)
	if !strings.Contains(got.LastError, "egress policy") || !strings.Contains(got.LastError, "169.254.169.254") {
		t.Errorf("NAT64 metadata target: last_error %q, want the egress refusal naming 169.254.169.254", got.LastError)
	}
}
