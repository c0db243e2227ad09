package dispatch

import (
	"errors"
	"flag"
	"io"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/outbox"
)

func TestConfigDefaults(t *testing.T) {
	c := DefaultTunables()
	checks := []struct {
		name      string
		got, want any
	}{
		{"PollInterval", c.PollInterval, 20 * time.Millisecond},
		{"WakeDebounce", c.WakeDebounce, 2 * time.Millisecond},
		{"RefillDebounce", c.RefillDebounce, 5 * time.Millisecond},
		{"BatchSize", c.BatchSize, 256},
		{"MaxInFlight", c.MaxInFlight, 4096},
		{"DeliveryTimeout", c.DeliveryTimeout, 10 * time.Second},
		{"VisibilityTimeout", c.VisibilityTimeout, 40 * time.Second},
		{"RearmInterval", c.RearmInterval, time.Second},
		{"SettleTimeout", c.SettleTimeout, 5 * time.Second},
		{"MaxConnsPerHost", c.MaxConnsPerHost, 512},
		{"InitialConnsPerHost", c.InitialConnsPerHost, 20},
		{"LastErrorMax", c.LastErrorMax, 512},
		{"Retry", c.Retry, RetryPolicy{Base: 500 * time.Millisecond, Factor: 2, Cap: 5 * time.Minute, MaxAttempts: 10, Jitter: 0.2}},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("default %s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}
	// The visibility timeout follows a custom delivery timeout.
	c2 := Tunables{DeliveryTimeout: 3 * time.Second}
	c2.fillDefaults()
	if c2.VisibilityTimeout != 33*time.Second {
		t.Errorf("VisibilityTimeout with DeliveryTimeout 3s = %v, want 33s", c2.VisibilityTimeout)
	}
}

func TestConfigValidation(t *testing.T) {
	tg := static("http://127.0.0.1:1")
	base := func() Config {
		c := testConfig(tg)
		c.Store = newStore(t)
		c.Planner = testPlanner(nil, newLateClaims(c.Store))
		return c
	}
	cases := []struct {
		name   string
		mutate func(*Config)
		field  string // must appear in the error
	}{
		{"store required", func(c *Config) { c.Store = nil }, "Config.Store"},
		{"planner required", func(c *Config) { c.Planner = nil }, "Config.Planner"},
		{"targets required", func(c *Config) { c.Targets = nil }, "Config.Targets"},
		{"visibility not above delivery timeout", func(c *Config) { c.DeliveryTimeout, c.VisibilityTimeout = 5*time.Second, 5*time.Second }, "--visibility-timeout"},
		{"negative poll interval", func(c *Config) { c.PollInterval = -time.Millisecond }, "--poll-interval"},
		{"debounce not below poll", func(c *Config) { c.PollInterval, c.WakeDebounce = 10*time.Millisecond, 10*time.Millisecond }, "--poll-interval: 10ms must exceed WakeDebounce"},
		{"negative batch", func(c *Config) { c.BatchSize = -1 }, "--batch-size"},
		{"negative max in flight", func(c *Config) { c.MaxInFlight = -1 }, "MaxInFlight"},
		{"negative conns", func(c *Config) { c.MaxConnsPerHost = -3 }, "--max-conns-per-host"},
		{"initial conns above max", func(c *Config) { c.MaxConnsPerHost, c.InitialConnsPerHost = 4, 5 }, "InitialConnsPerHost"},
		{"refill debounce below wake debounce", func(c *Config) { c.WakeDebounce, c.RefillDebounce = 3*time.Millisecond, time.Millisecond }, "RefillDebounce"},
		{"refill debounce not below poll", func(c *Config) { c.RefillDebounce = c.PollInterval }, "RefillDebounce"},
		{"tiny last error", func(c *Config) { c.LastErrorMax = 8 }, "LastErrorMax"},
		{"retry factor below 1", func(c *Config) { c.Retry.Factor = 0.5 }, "--retry-factor"},
		{"retry cap below base", func(c *Config) { c.Retry.Base, c.Retry.Cap = time.Second, time.Millisecond }, "--retry-cap"},
		{"jitter above 1", func(c *Config) { c.Retry.Jitter = 1.5 }, "Retry.Jitter"},
		{"negative base", func(c *Config) { c.Retry.Base = -time.Second }, "--retry-base"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.mutate(&c)
			d, err := New(c)
			if err == nil {
				t.Fatalf("New accepted a bad config: %+v", d.cfg)
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("error %q: want ErrInvalidConfig naming %s", err, tc.field)
			}
		})
	}
	t.Run("valid config registers metrics once", func(t *testing.T) {
		c := base()
		reg := prometheus.NewPedanticRegistry()
		c.Registerer = reg
		if _, err := New(c); err != nil {
			t.Fatalf("New: %v", err)
		}
		if _, err := New(c); err == nil || !strings.Contains(err.Error(), "register metrics") {
			t.Fatalf("second New on the same registry: %v, want a registration error", err)
		}
		if _, err := reg.Gather(); err != nil {
			t.Fatalf("Gather after a failed New: %v", err)
		}
	})
}

// TestRegisterFlags pins the node's dispatch flags: their names, that they
// write the tunables, and that the derived tunables follow what they give.
func TestRegisterFlags(t *testing.T) {
	var c Tunables
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterFlags(fs)
	if err := fs.Parse([]string{"-batch-size=64", "-max-attempts=3", "-retry-base=1s", "-delivery-timeout=1m", "-max-conns-per-host=4", "-poll-interval=6ms"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	want := DefaultTunables()
	want.BatchSize, want.Retry.MaxAttempts, want.Retry.Base, want.DeliveryTimeout = 64, 3, time.Second, time.Minute
	want.MaxConnsPerHost, want.PollInterval = 4, 6*time.Millisecond
	want.VisibilityTimeout, want.InitialConnsPerHost, want.RefillDebounce = time.Minute+DefaultVisibilitySlack, 4, 3*time.Millisecond
	if c != want {
		t.Fatalf("flags gave\n%+v\nwant\n%+v", c, want)
	}
	if err := fs.Parse([]string{"-max-attempts=lots"}); err == nil {
		t.Fatal("a non-numeric max-attempts was accepted")
	}
	var names []string
	fs.VisitAll(func(f *flag.Flag) { names = append(names, f.Name) })
	if got := strings.Join(names, " "); got != "batch-size delivery-timeout max-attempts max-conns-per-host poll-interval retry-base retry-cap retry-factor visibility-timeout" {
		t.Errorf("flags %s", got)
	}
}

func TestBackoff(t *testing.T) {
	p := DefaultRetryPolicy()
	cases := []struct {
		name    string
		attempt uint32
		u       float64
		want    time.Duration
	}{
		{"first retry, no jitter draw at middle", 1, 0.5, 500 * time.Millisecond},
		{"second doubles", 2, 0.5, time.Second},
		{"fifth", 5, 0.5, 8 * time.Second},
		{"jitter low end is -20%", 1, 0, 400 * time.Millisecond},
		{"jitter high end is +20%", 1, 1, 600 * time.Millisecond},
		{"capped at 5 min", 12, 0.5, 5 * time.Minute},
		{"cap holds after jitter", 30, 1, 5 * time.Minute},
		{"huge attempt does not overflow", 4_000_000_000, 0.5, 5 * time.Minute},
		{"attempt 0 treated as 1", 0, 0.5, 500 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.backoff(tc.attempt, tc.u); got != tc.want {
				t.Fatalf("backoff(%d, %v) = %v, want %v", tc.attempt, tc.u, got, tc.want)
			}
		})
	}
	noJitter := p
	noJitter.Jitter = -1
	if got := noJitter.backoff(1, 0); got != 500*time.Millisecond {
		t.Fatalf("negative jitter: backoff = %v, want exactly 500ms", got)
	}
	for range 1000 {
		if d := p.randBackoff(3); d < 1600*time.Millisecond || d > 2400*time.Millisecond {
			t.Fatalf("randBackoff(3) = %v, outside 2s ±20%%", d)
		}
	}
}

// TestParseRetryAfter: every form of Retry-After (RFC 9110 §10.2.3). Only
// a wait longer than zero counts; anything else leaves our backoff.
func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	huge := time.Duration(math.MaxInt64)
	cases := []struct {
		name string
		in   string
		want time.Duration
		ok   bool
	}{
		{"absent", "", 0, false},
		{"delta-seconds", "3", 3 * time.Second, true},
		{"delta-seconds with spaces", " 120 ", 2 * time.Minute, true},
		{"leading zeros", "007", 7 * time.Second, true},
		{"zero", "0", 0, false},
		{"zeros", "000", 0, false},
		{"negative", "-5", 0, false},
		{"plus sign", "+5", 0, false},
		{"fractional", "1.5", 0, false},
		{"exponent", "1e3", 0, false},
		{"word", "soon", 0, false},
		{"digits then junk", "5 seconds", 0, false},
		{"enormous", "99999999999999999999", huge, true},
		{"past int64 seconds", "9223372036854775807", huge, true},
		{"IMF-fixdate ahead", now.Add(7 * time.Second).Format(http.TimeFormat), 7 * time.Second, true},
		{"IMF-fixdate now", now.Format(http.TimeFormat), 0, false},
		{"IMF-fixdate past (target clock behind)", now.Add(-time.Hour).Format(http.TimeFormat), 0, false},
		{"RFC 850 ahead", now.Add(30 * time.Second).Format(time.RFC850), 30 * time.Second, true},
		{"asctime ahead", now.Add(20 * time.Second).Format(time.ANSIC), 20 * time.Second, true},
		{"date with a numeric zone", now.Add(time.Hour).Format(time.RFC1123Z), 0, false},
		{"date without weekday", now.Add(time.Hour).Format("02 Jan 2006 15:04:05 GMT"), 0, false},
	}
	for _, tc := range cases {
		got, ok := parseRetryAfter(tc.in, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%s: parseRetryAfter(%q) = %v, %v; want %v, %v", tc.name, tc.in, got, ok, tc.want, tc.ok)
		}
	}
	// Honoured on 429 and 503 only.
	for _, code := range []int{429, 503} {
		if d, ok := retryAfterOf(code, "9", now); !ok || d != 9*time.Second {
			t.Errorf("retryAfterOf(%d, 9) = %v, %v; want 9s, true", code, d, ok)
		}
	}
	for _, code := range []int{500, 502, 504, 408, 425, 301, 200} {
		if d, ok := retryAfterOf(code, "9", now); ok {
			t.Errorf("retryAfterOf(%d, 9) = %v, true; want ignored", code, d)
		}
	}
}

// TestRetryDelay: a Retry-After only lengthens the backoff, capped.
func TestRetryDelay(t *testing.T) {
	p := RetryPolicy{Base: 2 * time.Second, Factor: 2, Cap: time.Minute, MaxAttempts: 10, Jitter: -1}
	cases := []struct {
		name    string
		attempt uint32
		ra      time.Duration
		hasRA   bool
		want    time.Duration
	}{
		{"backoff alone", 1, 0, false, 2 * time.Second},
		{"longer Retry-After wins", 1, 7 * time.Second, true, 7 * time.Second},
		{"shorter Retry-After loses", 3, 5 * time.Second, true, 8 * time.Second},
		{"Retry-After capped", 1, time.Hour, true, time.Minute},
		{"enormous Retry-After capped", 1, time.Duration(math.MaxInt64), true, time.Minute},
	}
	for _, tc := range cases {
		if got := retryDelay(p, tc.attempt, result{retryAfter: tc.ra, hasRetryAfter: tc.hasRA}); got != tc.want {
			t.Errorf("%s: retryDelay = %v, want %v", tc.name, got, tc.want)
		}
	}
	full := RetryPolicy{Base: time.Millisecond, Factor: 1, Cap: time.Second, MaxAttempts: 1, Jitter: 1}
	for range 1000 {
		if d := retryDelay(full, 1, result{}); d < minRetryDelay {
			t.Fatalf("full jitter gave a retry delay of %v: a retry must never be immediate", d)
		}
	}
}

func TestClassifyStatus(t *testing.T) {
	want := map[int]outcomeKind{
		200: outcomeDone, 201: outcomeDone, 204: outcomeDone, 299: outcomeDone,
		408: outcomeRetry, 425: outcomeRetry, 429: outcomeRetry, 500: outcomeRetry, 502: outcomeRetry, 503: outcomeRetry, 599: outcomeRetry,
		100: outcomeFail, 301: outcomeFail, 302: outcomeFail, 304: outcomeFail, 400: outcomeFail, 401: outcomeFail, 403: outcomeFail,
		404: outcomeFail, 409: outcomeFail, 410: outcomeFail, 422: outcomeFail,
	}
	for code, k := range want {
		if got := classifyStatus(code); got != k {
			t.Errorf("classifyStatus(%d) = %d, want %d", code, got, k)
		}
	}
}

func TestExpandURL(t *testing.T) {
	r := outbox.ClaimScope{Namespace: "acme corp", TaskQueue: "q/1?x"}
	cases := map[string]string{
		"http://t/deliver":                         "http://t/deliver",
		"http://t/{namespace}/{task_queue}":        "http://t/acme%20corp/q%2F1%3Fx",
		"http://t/x?ns={namespace}":                "http://t/x?ns=acme%20corp",
		"http://t/{namespace}/{namespace}/{other}": "http://t/acme%20corp/acme%20corp/{other}",
	}
	for in, want := range cases {
		if got := expandURL(in, r); got != want {
			t.Errorf("expandURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestTruncateAndExcerpt(t *testing.T) {
	if got := truncateUTF8("héllo", 2); got != "h" {
		t.Errorf("truncate in the middle of é = %q, want %q", got, "h")
	}
	if got := truncateUTF8("abc", 10); got != "abc" {
		t.Errorf("short string changed: %q", got)
	}
	if got := cleanExcerpt([]byte("  bad\r\nthing\x00\xff ")); got != "bad  thing \uFFFD" {
		t.Errorf("cleanExcerpt = %q", got)
	}
}
