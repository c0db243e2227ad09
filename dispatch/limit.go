package dispatch

import (
	"math"
	"time"
)

// The adaptive per-host concurrency limit is AIMD (additive increase,
// multiplicative decrease) with a delay signal;
// docs/adr/0016-aimd-per-host-limit.md says why AIMD and not a gradient
// limiter. Its constants:
const (
	// DefaultInitialConnsPerHost is a new host's limit (rows in flight),
	// before it has answered anything (capped by MaxConnsPerHost):
	// Netflix's AIMDLimit starts at 10, Gradient2 and Palantir's client
	// limiter at 20.
	DefaultInitialConnsPerHost = 20
	// limitBackoff multiplies the limit on a cut (TCP's halving).
	limitBackoff = 0.5
	// latencyFactor and latencySlack define "latency well above its
	// recent minimum": even the fastest answer of a latency window exceeds
	// both latencyFactor × the recent minimum and the minimum +
	// latencySlack. Judging a window by its fastest answer, as TCP Vegas
	// and BBR judge a round by its minimum RTT, reads queueing at the host
	// (every answer slower) and not a busy client (some answers slow):
	// a loaded machine's scheduling delays raise the average, not the
	// minimum. The slack keeps a 1 ms target's noise (1 ms → 5 ms) from
	// reading as congestion.
	latencyFactor = 2.0
	latencySlack  = 50 * time.Millisecond
	// latencyWindow and latencyWindowSamples bound a latency window: it is
	// judged once it spans at least a second and ten answers (Netflix's
	// WindowedLimit judges windows of 1 s and 10 samples too).
	latencyWindow        = time.Second
	latencyWindowSamples = 10
	// minRTTWindow is how long an answer time counts towards the recent
	// minimum: the minimum is taken over the current and the previous
	// window, so a host that became slower for good is judged against its
	// new normal after 10–20 s.
	minRTTWindow = 10 * time.Second
)

// loadSignal is what one delivery attempt says about the host's load.
type loadSignal int

const (
	// signalNone: the attempt says nothing about load (it was abandoned,
	// never sent, or answered with a 5xx other than 503, 408 or 425).
	signalNone loadSignal = iota
	// signalSuccess: the host answered (2xx, 3xx, a 4xx other than 429):
	// its answer time is a latency sample.
	signalSuccess
	// signalDrop: the host is overloaded or unreachable: timeout,
	// connection error, 429 or 503.
	signalDrop
)

// Reasons of a limit cut, the reason label of
// fairshard_target_host_limit_cuts_total.
const (
	cutTimeout    = "timeout"
	cutConnection = "connection"
	cut429        = "status_429"
	cut503        = "status_503"
	cutLatency    = "latency"
)

// sample is one finished delivery attempt as the host's limit sees it.
type sample struct {
	signal loadSignal
	// reason names a drop (cut* constants).
	reason string
	// sent is when the request went on the wire (or, if it never did,
	// when the attempt started).
	sent time.Time
	// at is when the attempt ended.
	at time.Time
	// rtt is the answer time: on the wire → response headers (successes).
	rtt time.Duration
	// inflight is the host's rows in flight when the request was
	// launched, itself included.
	inflight int
}

// aimdLimit is one host's adaptive concurrency limit, in [1, max]. Not
// safe for concurrent use (HostLimits holds its lock).
//
//   - Increase: an answered attempt adds 1 when the limit was in use (at
//     least half of it in flight when the request went out), as Netflix's
//     AIMDLimit does: the limit doubles per round trip while the host
//     keeps up, and does not grow while the node has too little work to
//     test it.
//   - Decrease: a drop (timeout, connection error, 429, 503) or a slow
//     latency window (its fastest answer well above the recent minimum)
//     halves it, at most once per round trip: attempts that went out
//     before the last cut carry no news about it and neither cut nor grow
//     the limit, nor count in a latency window (TCP's one reduction per
//     window, RFC 5681 §3.2 / NewReno).
type aimdLimit struct {
	limit   float64
	max     float64
	lastCut time.Time
	// minCur and minPrev are the smallest answer times of the current and
	// the previous minRTTWindow (0: none yet); minStart starts minCur.
	minCur, minPrev time.Duration
	minStart        time.Time
	// The latency window: answers since winStart, their count and the
	// fastest.
	winStart time.Time
	winN     int
	winMin   time.Duration
}

func newAIMDLimit(initial, maxLimit int) aimdLimit {
	maxLimit = max(maxLimit, 1)
	return aimdLimit{limit: float64(min(max(initial, 1), maxLimit)), max: float64(maxLimit)}
}

// current is the limit in whole rows (≥ 1).
func (l *aimdLimit) current() int { return max(int(l.limit), 1) }

// minRTT is the recent minimum answer time (0: none yet).
func (l *aimdLimit) minRTT() time.Duration {
	switch {
	case l.minCur == 0:
		return l.minPrev
	case l.minPrev == 0:
		return l.minCur
	}
	return min(l.minCur, l.minPrev)
}

// observe feeds one attempt to the limit. It returns the reason of the cut
// it made, "" when it made none.
func (l *aimdLimit) observe(s sample) string {
	if s.signal == signalNone {
		return ""
	}
	stale := !l.lastCut.IsZero() && s.sent.Before(l.lastCut)
	reason := s.reason
	if s.signal == signalSuccess {
		rtt := max(s.rtt, time.Microsecond)
		l.recordMin(rtt, s.at)
		if stale {
			return ""
		}
		if !l.windowSlow(rtt, s.at) {
			if 2*s.inflight >= l.current() {
				l.limit = math.Min(l.max, l.limit+1)
			}
			return ""
		}
		reason = cutLatency
	}
	next := math.Max(1, math.Floor(l.limit*limitBackoff))
	if stale || next == l.limit {
		return "" // already cut this round trip, or already at 1
	}
	l.limit, l.lastCut = next, s.at
	l.winStart, l.winN, l.winMin = time.Time{}, 0, 0 // judge what comes after the cut
	return reason
}

// recordMin adds an answer time to the recent minimum.
func (l *aimdLimit) recordMin(rtt time.Duration, at time.Time) {
	switch since := at.Sub(l.minStart); {
	case l.minStart.IsZero() || since >= 2*minRTTWindow:
		l.minPrev, l.minCur, l.minStart = 0, rtt, at
	case since >= minRTTWindow:
		l.minPrev, l.minCur, l.minStart = l.minCur, rtt, at
	default:
		l.minCur = min(l.minCur, rtt)
	}
}

// windowSlow adds an answer time to the latency window and, when the
// window is complete, judges it by its fastest answer and starts the next
// one. It reports whether the completed window was slow.
func (l *aimdLimit) windowSlow(rtt time.Duration, at time.Time) bool {
	if l.winN == 0 {
		l.winStart, l.winMin = at, rtt
	}
	l.winN++
	l.winMin = min(l.winMin, rtt)
	if l.winN < latencyWindowSamples || at.Sub(l.winStart) < latencyWindow {
		return false
	}
	fastest := l.winMin
	l.winStart, l.winN, l.winMin = time.Time{}, 0, 0
	return l.slow(fastest)
}

// slow reports whether a window's fastest answer time is well above the
// recent minimum (latencyFactor and latencySlack).
func (l *aimdLimit) slow(fastest time.Duration) bool {
	m := l.minRTT()
	if m == 0 {
		return false
	}
	return fastest > time.Duration(latencyFactor*float64(m)) && fastest > m+latencySlack
}
