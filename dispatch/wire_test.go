package dispatch

import (
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/outbox"
)

// TestRetryAfter: a target may only lengthen a wait. Every form of
// Retry-After, sent by a real server on a real answer: the row's next
// visible_after is max(our backoff, Retry-After), capped by the retry cap;
// zero, negative, past, fractional and unparsable values, and any
// Retry-After on a status other than 429 and 503, leave our backoff.
func TestRetryAfter(t *testing.T) {
	const backoff = 2 * time.Second // Base, no jitter, attempt 1
	policy := RetryPolicy{Base: backoff, Factor: 2, Cap: time.Minute, MaxAttempts: 10, Jitter: -1}
	cases := []struct {
		name    string
		status  int
		value   string // "" sends no Retry-After
		attempt uint32
		want    time.Duration
	}{
		{"503 delta-seconds longer than the backoff", 503, "7", 1, 7 * time.Second},
		{"429 delta-seconds longer than the backoff", 429, "7", 1, 7 * time.Second},
		{"delta-seconds shorter than the backoff", 503, "1", 1, backoff},
		{"shorter than a later attempt's backoff", 503, "5", 3, 8 * time.Second},
		{"zero", 503, "0", 1, backoff},
		{"zero on 429", 429, "0", 1, backoff},
		{"negative", 503, "-5", 1, backoff},
		{"plus sign", 503, "+7", 1, backoff},
		{"fractional", 503, "1.5", 1, backoff},
		{"fractional above the backoff", 503, "7.5", 1, backoff},
		{"unparsable", 429, "soon", 1, backoff},
		{"padded", 503, "  7  ", 1, 7 * time.Second},
		{"leading zeros", 503, "007", 1, 7 * time.Second},
		{"absent", 503, "", 1, backoff},
		{"above the cap", 503, "86400", 1, time.Minute},
		{"enormous", 429, "99999999999999999999", 1, time.Minute},
		{"IMF-fixdate ahead", 503, t0.Add(42 * time.Second).Format(http.TimeFormat), 1, 42 * time.Second},
		{"IMF-fixdate on 429", 429, t0.Add(42 * time.Second).Format(http.TimeFormat), 1, 42 * time.Second},
		{"IMF-fixdate now", 503, t0.Format(http.TimeFormat), 1, backoff},
		{"date in the past (target clock behind)", 503, t0.Add(-time.Hour).Format(http.TimeFormat), 1, backoff},
		{"date past the cap", 503, t0.Add(24 * time.Hour).Format(http.TimeFormat), 1, time.Minute},
		{"RFC 850 date", 503, t0.Add(30 * time.Second).Format(time.RFC850), 1, 30 * time.Second},
		{"asctime date", 429, t0.Add(20 * time.Second).Format(time.ANSIC), 1, 20 * time.Second},
		{"date with a numeric zone", 503, t0.Add(time.Hour).Format(time.RFC1123Z), 1, backoff},
		{"ignored on 500", 500, "30", 1, backoff},
		{"ignored on 502", 502, "30", 1, backoff},
		{"ignored on 408", 408, "30", 1, backoff},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tg := newTarget(t, func(w http.ResponseWriter, _ *http.Request) {
				if tc.value != "" {
					w.Header()["Retry-After"] = []string{tc.value}
				}
				w.WriteHeader(tc.status)
			})
			clock := newFakeClock(t0)
			cfg := testConfig(static(tg.URL()))
			cfg.Now, cfg.Retry = clock.Now, policy
			d, b := setup(t, cfg)
			defer drain(t, d)
			r := mkRow("k", "ns", "q", t0)
			r.Attempt = tc.attempt
			mustAppend(t, b.store, r)
			sweep(t, d)
			got := wantStatus(t, b.store, "k", outbox.StatusPending)
			if got.Attempt != max(tc.attempt, 1)+1 {
				t.Errorf("attempt %d, want %d", got.Attempt, max(tc.attempt, 1)+1)
			}
			if delay := got.VisibleAfter.Sub(t0); delay != tc.want {
				t.Errorf("HTTP %d with Retry-After %q: retried after %v, want %v", tc.status, tc.value, delay, tc.want)
			}
		})
	}
}

// TestOutcomeUnknown: an attempt that went out in full and then timed out
// or lost its connection may have been delivered: it is retried with
// backoff (never at once) and the row records that the outcome was
// unknown. One that never went out (connection refused) is an ordinary
// retry.
func TestOutcomeUnknown(t *testing.T) {
	cases := []struct {
		name    string
		handler func(http.ResponseWriter, *http.Request)
		url     string
		unknown bool
		has     string
	}{
		{name: "no answer within the timeout", handler: func(_ http.ResponseWriter, r *http.Request) { <-r.Context().Done() },
			unknown: true, has: "no answer within 150ms of the request going out"},
		{name: "connection cut off after the request", handler: func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
		}, unknown: true, has: "connection lost after the request went out"},
		{name: "connection refused", url: refusedURL(t), has: "connection refused"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := tc.url
			if u == "" {
				u = newTarget(t, tc.handler).URL()
			}
			clock := newFakeClock(t0)
			cfg := testConfig(TargetsFunc(func(outbox.ClaimScope) (Target, bool) {
				return Target{URL: u, Timeout: 150 * time.Millisecond}, true
			}))
			cfg.Now = clock.Now
			d, b := setup(t, cfg)
			defer drain(t, d)
			mustAppend(t, b.store, mkRow("k", "ns", "q", t0))
			sweep(t, d)
			got := wantStatus(t, b.store, "k", outbox.StatusPending)
			if got.Attempt != 2 {
				t.Errorf("attempt %d, want 2", got.Attempt)
			}
			if delay := got.VisibleAfter.Sub(t0); delay < 400*time.Millisecond {
				t.Errorf("retried after %v: want the backoff (500 ms ±20 %%), never at once", delay)
			}
			if strings.HasPrefix(got.LastError, OutcomeUnknownPrefix) != tc.unknown || !strings.Contains(got.LastError, tc.has) {
				t.Errorf("last_error %q: want unknown=%v and %q", got.LastError, tc.unknown, tc.has)
			}
			want := 0.0
			if tc.unknown {
				want = 1
			}
			if v := testutil.ToFloat64(d.m.outcomeUnknown.WithLabelValues("ns")); v != want {
				t.Errorf("fairshard_delivery_outcome_unknown_total{ns} = %v, want %v", v, want)
			}
		})
	}
}

// TestNoClaimedRowWaitsForAConnection: the slow-target scenario in
// miniature. A host with one slot and a target that holds each request
// 300 ms against a 1.5 s delivery timeout (1.2 s of margin for a loaded
// machine): before, 10 rows claimed at once queued 3 s for the one
// connection inside their timeout and were cut off and retried although the
// target had them. Now the planner claims only what the host has slots for
// and the timeout runs on the wire: every row is received exactly once, on
// its first attempt.
func TestNoClaimedRowWaitsForAConnection(t *testing.T) {
	tg := newTarget(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(300 * time.Millisecond):
		case <-r.Context().Done():
		}
	})
	cfg := testConfig(static(tg.URL()))
	cfg.MaxConnsPerHost, cfg.DeliveryTimeout = 1, 1500*time.Millisecond
	d, b := setup(t, cfg)
	var rows []outbox.Row
	for i := range 10 {
		rows = append(rows, mkRow(fmt.Sprintf("k%d", i), "ns", "q", time.Now()))
	}
	mustAppend(t, b.store, rows...)
	run(t, d)
	d.Wake()
	poll.Eventually(t, 20*time.Second, fmt.Sprintf("10 rows done (target saw %d requests)", tg.total()), func() (bool, string) {
		for _, r := range rows {
			if !statusIs(b.store, r.DispatchKey, outbox.StatusDone) {
				return false, ""
			}
		}
		return true, ""
	})
	if n := tg.total(); n != len(rows) {
		t.Fatalf("target received %d requests for %d rows, want %d (no repeat deliveries)", n, len(rows), len(rows))
	}
	if p := tg.peak.Load(); p != 1 {
		t.Fatalf("target saw %d requests at once, want the host's limit 1", p)
	}
	for _, r := range rows {
		if got := mustGet(t, b.store, r.DispatchKey); got.Attempt != 1 {
			t.Errorf("row %s done on attempt %d, want 1", r.DispatchKey, got.Attempt)
		}
	}
}

// TestQuietRowGoesOutWhileAHostIsFull: a noisy namespace holds all of a
// host's slots with slow requests; a quiet namespace's row appended then
// is sent by the next sweep (its share of the host is guaranteed), not
// after a noisy delivery finishes, and the noisy namespace never gets
// more than the limit.
func TestQuietRowGoesOutWhileAHostIsFull(t *testing.T) {
	var noisyNow, noisyPeak atomic.Int64
	release := make(chan struct{})
	tg := newTarget(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(HeaderNamespace) != "noisy" {
			return
		}
		n := noisyNow.Add(1)
		defer noisyNow.Add(-1)
		for p := noisyPeak.Load(); n > p && !noisyPeak.CompareAndSwap(p, n); p = noisyPeak.Load() {
		}
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	cfg := testConfig(static(tg.URL()))
	cfg.MaxConnsPerHost = 4
	d, b := setup(t, cfg)
	var noisy []outbox.Row
	for i := range 40 {
		noisy = append(noisy, mkRow(fmt.Sprintf("n%02d", i), "noisy", fmt.Sprintf("q%d", i%2), time.Now()))
	}
	mustAppend(t, b.store, noisy...)
	run(t, d)
	d.Wake()
	poll.Eventually(t, 5*time.Second, "noisy namespace to fill the host's 4 slots", func() (bool, string) { return noisyNow.Load() == 4, "" })

	appended := time.Now()
	mustAppend(t, b.store, mkRow("quiet-1", "quiet", "q", appended))
	d.Wake()
	poll.Eventually(t, 5*time.Second, "quiet row received while the host is full", func() (bool, string) { return tg.count("quiet-1") == 1, "" })
	took := time.Since(appended)
	// The target has the row; its settle commits right after the answer.
	poll.Eventually(t, 5*time.Second, "quiet row settled done", func() (bool, string) { return statusIs(b.store, "quiet-1", outbox.StatusDone), "" })
	if noisyNow.Load() != 4 || tg.total() != 5 {
		t.Fatalf("noisy in flight %d, requests %d: the quiet row must go out while the noisy ones are still held (4 + 1)", noisyNow.Load(), tg.total())
	}
	t.Logf("quiet row received %v after its append, with the host's 4 slots held by the noisy namespace", took)
	if took > time.Second {
		t.Errorf("quiet row took %v; want the next sweep (poll interval %v)", took, cfg.PollInterval)
	}
	// Time for a few more sweeps: the noisy namespace stays at the limit.
	time.Sleep(10 * cfg.PollInterval)
	if p := noisyPeak.Load(); p != 4 {
		t.Fatalf("noisy namespace peaked at %d requests at once, want the host's limit 4", p)
	}
}

// TestHostLimitFollowsTheTarget: the limit grows to MaxConnsPerHost
// while the target answers quickly, is cut when it answers 429, and
// grows back when it stops; the metrics show it.
func TestHostLimitFollowsTheTarget(t *testing.T) {
	var status atomic.Int32
	tg := newTarget(t, func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(10 * time.Millisecond)
		if s := status.Load(); s != 0 {
			w.WriteHeader(int(s))
		}
	})
	cfg := testConfig(static(tg.URL()))
	cfg.MaxConnsPerHost, cfg.InitialConnsPerHost = 16, 2
	cfg.Retry = RetryPolicy{Base: 5 * time.Millisecond, Cap: 50 * time.Millisecond, MaxAttempts: 1000}
	d, b := setup(t, cfg)
	var rows []outbox.Row
	for i := range 6000 {
		rows = append(rows, mkRow(fmt.Sprintf("k%05d", i), "ns", fmt.Sprintf("q%d", i%4), time.Now()))
	}
	mustAppend(t, b.store, rows...)
	run(t, d)
	d.Wake()
	host := tg.URL()
	limit := func() float64 { return testutil.ToFloat64(d.hosts.m.limit.WithLabelValues(host)) }
	poll.Eventually(t, 30*time.Second, "limit to grow from 2 to 16", func() (bool, string) { return limit() == 16, "" })

	status.Store(http.StatusTooManyRequests)
	poll.Eventually(t, 30*time.Second, "limit to be cut under 429s", func() (bool, string) { return limit() <= 2, "" })
	cuts := testutil.ToFloat64(d.hosts.m.cuts.WithLabelValues(host, cut429))
	if cuts < 3 {
		t.Errorf("fairshard_target_host_limit_cuts_total{reason=status_429} = %v, want ≥ 3 (16 → ≤ 2)", cuts)
	}

	status.Store(0)
	poll.Eventually(t, 30*time.Second, "limit to recover to 16", func() (bool, string) { return limit() == 16, "" })
	if p := tg.peak.Load(); p > 16 {
		t.Errorf("target saw %d requests at once, over MaxConnsPerHost 16 with one namespace", p)
	}
	if hs := d.Hosts().Hosts(); len(hs) != 1 || hs[0].Host != host || hs[0].Limit != 16 {
		t.Errorf("Hosts() = %+v, want one host %s at limit 16", hs, host)
	}
}

// TestAIMDLimit: the per-host limit's rules, sample by sample.
func TestAIMDLimit(t *testing.T) {
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ok := func(sentMS, atMS int, rtt time.Duration, inflight int) sample {
		return sample{signal: signalSuccess, sent: at(sentMS), at: at(atMS), rtt: rtt, inflight: inflight}
	}
	drop := func(sentMS, atMS int, reason string) sample {
		return sample{signal: signalDrop, reason: reason, sent: at(sentMS), at: at(atMS)}
	}
	cases := []struct {
		name    string
		initial int
		max     int
		samples []sample
		want    int
		cuts    []string
	}{
		{name: "grows by one per answer while in use", initial: 4, max: 64,
			samples: []sample{ok(0, 10, 10*time.Millisecond, 4), ok(0, 11, 10*time.Millisecond, 3), ok(0, 12, 10*time.Millisecond, 3)}, want: 7},
		{name: "does not grow while less than half is in use", initial: 10, max: 64,
			samples: []sample{ok(0, 10, 10*time.Millisecond, 4), ok(0, 11, 10*time.Millisecond, 1)}, want: 10},
		{name: "never above max", initial: 8, max: 8,
			samples: []sample{ok(0, 10, 10*time.Millisecond, 8), ok(0, 11, 10*time.Millisecond, 8)}, want: 8},
		{name: "a 429 halves it", initial: 20, max: 64, samples: []sample{drop(0, 10, cut429)}, want: 10, cuts: []string{cut429}},
		{name: "once per round trip: drops of requests sent before the cut do not cut again", initial: 20, max: 64,
			samples: []sample{drop(0, 10, cut503), drop(1, 11, cut503), drop(5, 12, cutTimeout), drop(12, 30, cutTimeout)},
			want:    5, cuts: []string{cut503, cutTimeout}},
		{name: "answers of requests sent before the cut do not grow it", initial: 20, max: 64,
			samples: []sample{drop(0, 10, cutConnection), ok(1, 12, 10*time.Millisecond, 20)}, want: 10, cuts: []string{cutConnection}},
		{name: "never below 1", initial: 2, max: 64,
			samples: []sample{drop(0, 1, cut429), drop(2, 3, cut429), drop(4, 5, cut429)}, want: 1, cuts: []string{cut429}},
		{name: "ignored signals change nothing", initial: 5, max: 64, samples: []sample{{signal: signalNone, at: at(1)}}, want: 5},
		{name: "one slow answer among fast ones is noise", initial: 20, max: 64,
			samples: concat(series(0, 75, 13, 20*time.Millisecond, 0), series(975, 75, 1, 300*time.Millisecond, 0), series(1050, 75, 10, 20*time.Millisecond, 0)),
			want:    20},
		{name: "a slow latency window cuts it, once", initial: 20, max: 64,
			samples: concat(series(0, 50, 25, 20*time.Millisecond, 0), series(1300, 60, 40, 400*time.Millisecond, 0)),
			want:    10, cuts: []string{cutLatency}},
		{name: "a burst of slow answers inside a fast window is not a trend", initial: 20, max: 64,
			samples: concat(series(0, 10, 150, 20*time.Millisecond, 0), series(1500, 5, 20, 150*time.Millisecond, 0), series(1600, 10, 100, 20*time.Millisecond, 0)),
			want:    20},
		{name: "slow answers beside fast ones are a busy client, not a queueing host", initial: 20, max: 64,
			samples: byAnswer(concat(series(0, 50, 25, time.Millisecond, 0), series(1300, 20, 100, 200*time.Millisecond, 0), series(1310, 20, 100, time.Millisecond, 0))),
			want:    20},
		{name: "a 2 s target is not slow: 2 s is its minimum", initial: 20, max: 64,
			samples: series(0, 45, 44, 2*time.Second, 40), want: 64},
		{name: "a small rise on a fast target is noise (slack)", initial: 20, max: 64,
			samples: concat(series(0, 20, 60, time.Millisecond, 0), series(1200, 20, 120, 20*time.Millisecond, 0)), want: 20},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newAIMDLimit(tc.initial, tc.max)
			var cuts []string
			for _, s := range tc.samples {
				if r := l.observe(s); r != "" {
					cuts = append(cuts, r)
				}
			}
			if l.current() != tc.want || fmt.Sprint(cuts) != fmt.Sprint(tc.cuts) {
				t.Fatalf("limit %d with cuts %v, want %d with %v", l.current(), cuts, tc.want, tc.cuts)
			}
		})
	}
	// The recent minimum forgets: after two windows of slower answers,
	// the slower latency is the new normal: no longer slow, and the limit
	// grows again.
	l := newAIMDLimit(20, 64)
	for _, smp := range series(0, 50, 20, 10*time.Millisecond, 0) {
		l.observe(smp)
	}
	cuts := 0
	for _, smp := range series(1000, 100, 400, 200*time.Millisecond, 0) { // 40 s of 200 ms answers
		if l.observe(smp) != "" {
			cuts++
		}
	}
	if cuts == 0 || l.slow(200*time.Millisecond) || l.minRTT() != 200*time.Millisecond {
		t.Fatalf("after 40 s of 200 ms answers: %d latency cuts, 200 ms slow %v, recent minimum %v; want cuts at first, then 200ms as the new normal",
			cuts, l.slow(200*time.Millisecond), l.minRTT())
	}
	before := l.current()
	l.observe(ok(50_000, 50_200, 200*time.Millisecond, 64))
	if l.current() != before+1 {
		t.Fatalf("limit %d after an answer at the new normal, want %d (growing again)", l.current(), before+1)
	}
}

// series is n answers taking rtt, the first sent at startMS, then one
// every stepMS, each launched with inflight rows in flight.
func series(startMS, stepMS, n int, rtt time.Duration, inflight int) []sample {
	out := make([]sample, n)
	for i := range out {
		sent := t0.Add(time.Duration(startMS+i*stepMS) * time.Millisecond)
		out[i] = sample{signal: signalSuccess, sent: sent, at: sent.Add(rtt), rtt: rtt, inflight: inflight}
	}
	return out
}

// byAnswer orders samples by when their answer came, as the limit sees
// them.
func byAnswer(s []sample) []sample {
	slices.SortStableFunc(s, func(a, b sample) int { return a.at.Compare(b.at) })
	return s
}

func concat(parts ...[]sample) []sample {
	var out []sample
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func repeat(s sample, n int) []sample {
	out := make([]sample, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// TestHostKey: a target host is scheme + host + port after template
// expansion; paths do not matter, default ports are filled in.
func TestHostKey(t *testing.T) {
	h, err := NewHostLimits(HostLimitsConfig{Targets: static("http://x")})
	if err != nil {
		t.Fatal(err)
	}
	r := func(ns string) outbox.ClaimScope { return outbox.ClaimScope{Namespace: ns, TaskQueue: "q"} }
	cases := []struct {
		tmpl  string
		route outbox.ClaimScope
		want  string
		ok    bool
	}{
		{"http://Hooks.Example.com/a/{namespace}", r("acme"), "http://hooks.example.com:80", true},
		{"HTTPS://hooks.example.com/b?x=1", r("acme"), "https://hooks.example.com:443", true},
		{"https://hooks.example.com:8443/", r("acme"), "https://hooks.example.com:8443", true},
		{"http://[::1]:9000/x", r("acme"), "http://[::1]:9000", true},
		{"http://{namespace}.hooks.example.com/x", r("acme"), "http://acme.hooks.example.com:80", true},
		{"http://{namespace}.hooks.example.com/x", r("beta"), "http://beta.hooks.example.com:80", true},
		{"ftp://hooks.example.com/", r("acme"), "", false},
		{"/relative", r("acme"), "", false},
	}
	for _, tc := range cases {
		for range 2 { // the second call may come from the template cache
			got, ok := h.hostOfURL(tc.tmpl, tc.route)
			if got != tc.want || ok != tc.ok {
				t.Errorf("hostOfURL(%q, %s) = %q, %v; want %q, %v", tc.tmpl, tc.route.Namespace, got, ok, tc.want, tc.ok)
			}
		}
	}
	if staticAuthority("http://{namespace}.x/") || !staticAuthority("http://x/{namespace}") || !staticAuthority("http://x?{q}") {
		t.Error("staticAuthority misreads where the placeholders are")
	}
}

// TestHostLimitsExpire: a host with nothing in flight is forgotten after
// IdleExpiry, with its metric series; one with rows in flight is kept.
func TestHostLimitsExpire(t *testing.T) {
	h, err := NewHostLimits(HostLimitsConfig{Targets: static("http://x"), IdleExpiry: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	h.acquire("http://a:80", "ns", now)
	h.acquire("http://b:80", "ns", now)
	h.release("http://a:80", "ns", sample{signal: signalSuccess, sent: now, at: now, rtt: time.Millisecond, inflight: 1})
	if n := testutil.CollectAndCount(h.m.limit); n != 2 {
		t.Fatalf("%d limit series, want 2", n)
	}
	if n := h.expire(now.Add(30 * time.Second)); n != 0 {
		t.Fatalf("expired %d hosts before IdleExpiry", n)
	}
	if n := h.expire(now.Add(2 * time.Minute)); n != 1 {
		t.Fatalf("expired %d hosts, want 1 (b still has a row in flight)", n)
	}
	if hs := h.Hosts(); len(hs) != 1 || hs[0].Host != "http://b:80" || hs[0].InFlight != 1 {
		t.Fatalf("hosts after expiry %+v, want b with 1 in flight", hs)
	}
	if n := testutil.CollectAndCount(h.m.limit); n != 1 {
		t.Fatalf("%d limit series after expiry, want 1", n)
	}
	if u := h.HostUsage("http://a:80"); u.Limit != min(DefaultInitialConnsPerHost, DefaultMaxConnsPerHost) || u.InFlight != 0 {
		t.Fatalf("a forgotten host's usage %+v, want the initial limit and nothing in flight", u)
	}
}
