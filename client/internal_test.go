package client

import (
	"net/http"
	"testing"
	"time"
)

// TestParseRetryAfter: every form a server may send (RFC 9110 §10.2.3 and
// what is seen in the wild); only a usable, future wait counts.
func TestParseRetryAfter(t *testing.T) {
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		in   string
		want time.Duration
	}{
		{"", 0},
		{"0", 0},
		{"7", 7 * time.Second},
		{" 7 ", 7 * time.Second},
		{"-3", 0},
		{"1.5", 0},
		{"soon", 0},
		{"99999999999999999999999", maxRetryAfterSeconds * time.Second},
		{now.Add(90 * time.Second).Format(http.TimeFormat), 90 * time.Second},
		{now.Add(-time.Hour).Format(http.TimeFormat), 0},
		{now.Format(http.TimeFormat), 0},
		{"Sun, 06 Nov 1994 08:49:37 GMT", 0},
		{"Sunday, 06-Nov-94 08:49:37 GMT", 0},
		{now.Add(time.Minute).Format(time.ANSIC), time.Minute}, // asctime form
	} {
		if got := parseRetryAfter(c.in, now); got != c.want {
			t.Errorf("parseRetryAfter(%q) = %v, want %v", c.in, got, c.want)
		}
	}
}

// TestBackoff: retry n waits within [d/2, d] for d = base × 2^(n−1)
// capped at MaxDelay; Retry-After is capped by MaxRetryAfter.
func TestBackoff(t *testing.T) {
	c := &Client{retry: RetryConfig{BaseDelay: 100 * time.Millisecond, MaxDelay: time.Second}.withDefaults()}
	for n, d := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond, 4: 800 * time.Millisecond,
		5: time.Second, 40: time.Second} {
		for range 200 {
			if got := c.backoff(n); got < d/2 || got > d {
				t.Fatalf("backoff(%d) = %v, want within [%v, %v]", n, got, d/2, d)
			}
		}
	}
	if got := c.retryAfterCapped(time.Hour); got != DefaultMaxRetryAfter {
		t.Errorf("a 1 h Retry-After is capped to %v, want %v", got, DefaultMaxRetryAfter)
	}
}
