package dispatch

import (
	"errors"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// backoff returns the delay before the next attempt after attempt (1-based)
// failed: min(Cap, Base × Factor^(attempt−1)), jittered by ±Jitter and
// capped at Cap. u is a uniform draw in [0, 1) (injected for tests).
func (p RetryPolicy) backoff(attempt uint32, u float64) time.Duration {
	exp := float64(max(attempt, 1) - 1)
	d := float64(p.Base) * math.Pow(p.Factor, exp)
	if math.IsInf(d, 0) || math.IsNaN(d) || d > float64(p.Cap) {
		d = float64(p.Cap)
	}
	if p.Jitter > 0 {
		d *= 1 - p.Jitter + 2*p.Jitter*u
	}
	return min(time.Duration(d), p.Cap)
}

// randBackoff is backoff with a fresh random draw.
func (p RetryPolicy) randBackoff(attempt uint32) time.Duration {
	return p.backoff(attempt, rand.Float64())
}

// parseRetryAfter reads a Retry-After header value (RFC 9110 §10.2.3):
// delta-seconds or an HTTP-date, relative to now. ok is false when the
// value is absent or malformed. A date in the past yields 0.
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	secs, err := strconv.ParseUint(v, 10, 64)
	if err == nil && secs <= uint64(math.MaxInt64/int64(time.Second)) {
		return time.Duration(secs) * time.Second, true
	}
	if err == nil || errors.Is(err, strconv.ErrRange) {
		return time.Duration(math.MaxInt64), true // absurdly far: the caller caps it
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	return max(t.Sub(now), 0), true
}

// outcomeKind is how a delivery attempt ended.
type outcomeKind int

const (
	// outcomeDone: 2xx, the row is complete.
	outcomeDone outcomeKind = iota
	// outcomeRetry: a retryable failure (408, 425, 429, 5xx, timeout,
	// connection error).
	outcomeRetry
	// outcomeFail: a permanent failure (other 4xx, 3xx, 1xx, a row that
	// cannot be sent): dead letter at once.
	outcomeFail
	// outcomeAbandoned: the delivery was cancelled by a hard stop; the row
	// is left claimed for the reaper.
	outcomeAbandoned
	// outcomeWait: the route lost its target between claim and delivery;
	// the row goes back to pending with its attempt unchanged.
	outcomeWait
)

// classifyStatus maps an HTTP status code to an outcome (issue 6 mapping).
func classifyStatus(code int) outcomeKind {
	switch {
	case code >= 200 && code <= 299:
		return outcomeDone
	case code == http.StatusRequestTimeout, code == http.StatusTooEarly,
		code == http.StatusTooManyRequests, code >= 500:
		return outcomeRetry
	default: // 1xx, 3xx (redirects are not followed), other 4xx
		return outcomeFail
	}
}
