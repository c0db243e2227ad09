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

// minRetryDelay is the shortest wait before a retry: a retry is never
// immediate, whatever the jitter.
const minRetryDelay = time.Millisecond

// retryDelay is the wait before the next attempt after a retryable failure
// of attempt: the policy's jittered backoff, lengthened (never shortened)
// by the answer's Retry-After, capped at the policy's Cap, and at least
// minRetryDelay. A timeout or a lost connection gets the backoff like any
// other failure.
func retryDelay(p RetryPolicy, attempt uint32, res result) time.Duration {
	d := p.randBackoff(attempt)
	if res.hasRetryAfter {
		d = max(d, res.retryAfter)
	}
	return max(min(d, p.Cap), minRetryDelay)
}

// retryAfterOf is the wait a response asks for: its Retry-After, on a 429
// or 503 only (RFC 9110 §10.2.3, RFC 6585 §4). ok is false for any other
// status and whenever parseRetryAfter gives nothing.
func retryAfterOf(status int, header string, now time.Time) (time.Duration, bool) {
	if status != http.StatusTooManyRequests && status != http.StatusServiceUnavailable {
		return 0, false
	}
	return parseRetryAfter(header, now)
}

// parseRetryAfter reads a Retry-After value (RFC 9110 §10.2.3):
// delta-seconds (1*DIGIT) or an HTTP-date (IMF-fixdate, RFC 850 or asctime,
// http.ParseTime), relative to now. ok is true only for a wait longer than
// zero: an absent, zero, negative, fractional or otherwise malformed value,
// or a date that is not in the future (a target whose clock is behind
// ours), gives ok = false, and the caller keeps its own backoff. An
// enormous delta-seconds gives the largest Duration (the caller caps it).
func parseRetryAfter(v string, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if v[0] >= '0' && v[0] <= '9' {
		secs, err := strconv.ParseUint(v, 10, 64)
		switch {
		case errors.Is(err, strconv.ErrRange):
			return time.Duration(math.MaxInt64), true
		case err != nil, secs == 0:
			return 0, false
		case secs > uint64(math.MaxInt64/int64(time.Second)):
			return time.Duration(math.MaxInt64), true
		}
		return time.Duration(secs) * time.Second, true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	if d := t.Sub(now); d > 0 {
		return d, true
	}
	return 0, false
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
	// outcomeFenced: the process was paused between claim and delivery
	// (Config.Fence); the request was not sent and the row goes back to
	// pending with its attempt unchanged.
	outcomeFenced
)

// classifyStatus maps an HTTP status code to an outcome (the table in
// docs/api.md "Delivery").
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
