package dispatch

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/webhook"
)

// Request headers of a delivery. Every POST carries all of them; the body
// is the row's payload, byte for byte, with Content-Type set to the row's
// content type ("application/octet-stream" when it has none).
const (
	// HeaderIdempotencyKey carries the dispatch_key: targets deduplicate
	// on it (delivery is at-least-once).
	HeaderIdempotencyKey = "Idempotency-Key"
	// HeaderDispatchKey carries the dispatch_key too, under our own name.
	HeaderDispatchKey = "Fairshard-Dispatch-Key"
	// HeaderNamespace carries the row's namespace.
	HeaderNamespace = "Fairshard-Namespace"
	// HeaderTaskQueue carries the row's task_queue.
	HeaderTaskQueue = "Fairshard-Task-Queue"
	// HeaderWorkflowID carries the row's workflow_id.
	HeaderWorkflowID = "Fairshard-Workflow-Id"
	// HeaderOrdinal carries the row's ordinal, in decimal.
	HeaderOrdinal = "Fairshard-Ordinal"
	// HeaderActivityType carries the row's activity_type.
	HeaderActivityType = "Fairshard-Activity-Type"
	// HeaderAttempt carries the 1-based attempt number, in decimal.
	HeaderAttempt = "Fairshard-Attempt"
)

// userAgent identifies deliveries in target logs.
const userAgent = "fairshard-dispatch"

// maxDrain is how much of a response body is read and discarded so the
// connection can be reused (bytes); a longer body costs the connection.
const maxDrain = 64 << 10

// OutcomeUnknownPrefix starts the last_error of a row whose last attempt
// may have been delivered: the request was on the wire in full and then
// timed out or lost its connection before an answer. Such a row is
// retried with backoff like any other failure (the target deduplicates
// by Idempotency-Key); the prefix records that the target may already
// have it.
const OutcomeUnknownPrefix = "outcome unknown: "

// Causes of a delivery context's cancellation by the dispatcher's own
// timers (wireClock).
var (
	errDeliveryTimeout = errors.New("dispatch: delivery timeout")
	errConnectTimeout  = errors.New("dispatch: connect timeout")
	// errFenced cancels a request this process may no longer send: it was
	// paused after the row's claim (Config.Fence).
	errFenced = errors.New("dispatch: fenced after a pause")
)

// result is how one delivery attempt ended.
type result struct {
	kind      outcomeKind
	status    int    // HTTP status; 0 without a response
	lastError string // unbounded; settle bounds it
	// unknown: the target may have processed the request (see
	// OutcomeUnknownPrefix); lastError starts with the prefix.
	unknown bool
	// retryAfter is the response's Retry-After, when hasRetryAfter (only
	// on 429 and 503, only when positive: see retryAfterOf).
	retryAfter    time.Duration
	hasRetryAfter bool
	// load is what the attempt says about the host's load, for its limit.
	load       loadSignal
	loadReason string
	sent       time.Time     // on the wire (or the attempt's start)
	rtt        time.Duration // on the wire → response headers
}

// deliverAndSettle delivers one claimed row and records the outcome.
// host is the row's target host as launch counted it ("" when it has
// none) and hostInflight that host's rows in flight at launch: the
// attempt is fed to the host's limit and its slot freed as soon as the
// answer is in, before the settle. So is the row's namespace slot
// (answered) unless the target may still be working on the request (an
// outcome unknown: a timeout, a connection lost after the request was
// written) or a hard stop abandoned it; it reports whether it freed it.
func (d *Dispatcher) deliverAndSettle(row outbox.Row, host string, hostInflight int, gen uint64) (answered bool) {
	target, ok := d.cfg.Targets.Target(row.Route())
	var res result
	switch {
	case !d.allowed(gen):
		res = result{kind: outcomeFenced}
	case !ok || !usableURL(expandURL(target.URL, row.Route())):
		res = result{kind: outcomeWait}
	default:
		res = d.deliver(row, target, gen)
	}
	if host != "" {
		now := time.Now()
		sent := res.sent
		if sent.IsZero() {
			sent = now
		}
		d.hosts.release(host, row.Namespace, sample{signal: res.load, reason: res.loadReason, sent: sent, at: now, rtt: res.rtt, inflight: hostInflight})
		if d.hostLimited.Load() {
			d.wakeRefill() // a sweep was short of slots: this one is free now
		}
	}
	if answered = res.kind != outcomeAbandoned && !res.unknown; answered {
		d.answered(&row)
	}
	d.settle(row, res)
	return answered
}

// deliveryTimeout is the row's attempt timeout: DeliveryTimeout, or the
// target's own Timeout when shorter.
func (d *Dispatcher) deliveryTimeout(t Target) time.Duration {
	if t.Timeout > 0 && t.Timeout < d.cfg.DeliveryTimeout {
		return t.Timeout
	}
	return d.cfg.DeliveryTimeout
}

// newDeliveryRequest builds the POST of a row to its target: the expanded
// URL, the payload as body, the target's static headers, the headers
// listed at HeaderIdempotencyKey and, when the target has signing
// secrets, the Standard Webhooks signature headers (webhook-id is the
// dispatch_key, the same on every attempt; webhook-timestamp is now, so
// each attempt is signed afresh). An error means the expanded URL does
// not parse or a signing secret is unreadable (it never quotes the
// secret).
func newDeliveryRequest(ctx context.Context, row *outbox.Row, t Target, now time.Time) (*http.Request, error) {
	secrets, err := webhook.ParseStoredSecrets(t.SigningSecrets)
	if err != nil {
		return nil, fmt.Errorf("target of %s/%s: signing %w", row.Namespace, row.TaskQueue, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, expandURL(t.URL, row.Route()), bytes.NewReader(row.Payload))
	if err != nil {
		return nil, err
	}
	ct := row.ContentType
	ct = cmp.Or(ct, "application/octet-stream")
	h := req.Header
	for name, v := range t.Headers {
		h.Set(name, v)
	}
	h.Set("Content-Type", ct)
	h.Set("User-Agent", userAgent)
	h.Set(HeaderIdempotencyKey, row.DispatchKey)
	h.Set(HeaderDispatchKey, row.DispatchKey)
	h.Set(HeaderNamespace, row.Namespace)
	h.Set(HeaderTaskQueue, row.TaskQueue)
	h.Set(HeaderWorkflowID, row.WorkflowID)
	h.Set(HeaderOrdinal, strconv.FormatUint(row.Ordinal, 10))
	h.Set(HeaderActivityType, row.ActivityType)
	h.Set(HeaderAttempt, strconv.FormatUint(uint64(max(row.Attempt, 1)), 10))
	webhook.Sign(h, row.DispatchKey, now, row.Payload, secrets...)
	return req, nil
}

// deliver POSTs the row to its target and classifies the answer. The
// delivery timeout runs from the moment the request has a connection
// (httptrace GotConn): getting one is bounded separately by the same
// duration, and never waits in a client queue (the planner claims only
// what the host has slots for, the transport does not cap connections
// below that).
func (d *Dispatcher) deliver(row outbox.Row, t Target, gen uint64) result {
	if field, bad := badHeaderField(&row); bad {
		return result{kind: outcomeFail, lastError: fmt.Sprintf("row cannot be sent: its %s is not a valid HTTP header value", field)}
	}
	timeout := d.deliveryTimeout(t)
	ctx, cancel := context.WithCancelCause(d.deliveryCtx)
	defer cancel(nil)
	wc := startWireClock(timeout, cancel)
	defer wc.stop()
	if d.cfg.Fence != nil {
		wc.allow = func() bool { return d.cfg.Fence.Allow(gen) }
	}
	req, err := newDeliveryRequest(httptrace.WithClientTrace(ctx, wc.trace()), &row, t, d.cfg.Now())
	if err != nil {
		// The expanded target URL does not parse or a signing secret is
		// unreadable: a configuration error the operator can fix, so the
		// row waits rather than use up attempts.
		d.cfg.Logger.Warn("dispatch: target unusable; row back to pending", "namespace", row.Namespace, "task_queue", row.TaskQueue, "error", err)
		return result{kind: outcomeWait}
	}

	start := time.Now()
	resp, err := d.client.Do(req)
	answered := time.Now()
	wire := wc.snapshot()
	res := result{sent: start}
	if !wire.onWire.IsZero() {
		res.sent = wire.onWire
	}
	if err != nil {
		d.m.deliveryDur.WithLabelValues(d.cfg.NamespaceLabel(row.Namespace)).Observe(answered.Sub(start).Seconds())
		if d.deliveryCtx.Err() != nil {
			return result{kind: outcomeAbandoned, sent: res.sent}
		}
		if errors.Is(context.Cause(ctx), errFenced) {
			return result{kind: outcomeFenced}
		}
		res.kind, res.load = outcomeRetry, signalDrop
		cause := context.Cause(ctx)
		switch {
		case errors.Is(cause, errDeliveryTimeout) && wire.written:
			res.unknown, res.loadReason = true, cutTimeout
			res.lastError = fmt.Sprintf("%sno answer within %v of the request going out; the target may have processed it", OutcomeUnknownPrefix, timeout)
		case errors.Is(cause, errDeliveryTimeout):
			res.loadReason = cutTimeout
			res.lastError = fmt.Sprintf("timeout after %v on the wire while sending the request: %v", timeout, err)
		case errors.Is(cause, errConnectTimeout):
			res.loadReason = cutTimeout
			res.lastError = fmt.Sprintf("no connection to the target within %v: %v", timeout, err)
		case wire.written:
			res.unknown, res.loadReason = true, cutConnection
			res.lastError = fmt.Sprintf("%sconnection lost after the request went out; the target may have processed it: %v", OutcomeUnknownPrefix, err)
		default:
			res.loadReason = cutConnection
			res.lastError = err.Error()
		}
		return res
	}
	res.rtt = answered.Sub(res.sent)
	res.status = resp.StatusCode
	res.kind = classifyStatus(resp.StatusCode)
	res.load, res.loadReason = loadOfStatus(resp.StatusCode)
	var excerpt []byte
	if res.kind != outcomeDone && d.cfg.BodyExcerptMax > 0 {
		// One byte more than kept, so the cut lands on a rune boundary.
		excerpt, _ = io.ReadAll(io.LimitReader(resp.Body, int64(d.cfg.BodyExcerptMax)+4))
		excerpt = []byte(truncateUTF8(string(excerpt), d.cfg.BodyExcerptMax))
	}
	// Drain (bounded) and close so the connection goes back to the pool.
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxDrain))
	_ = resp.Body.Close()
	d.m.deliveryDur.WithLabelValues(d.cfg.NamespaceLabel(row.Namespace)).Observe(time.Since(start).Seconds())
	if res.kind == outcomeDone {
		return res
	}
	res.lastError = "HTTP " + strconv.Itoa(resp.StatusCode)
	if ex := cleanExcerpt(excerpt); ex != "" {
		res.lastError += ": " + ex
	}
	if res.kind == outcomeRetry {
		res.retryAfter, res.hasRetryAfter = retryAfterOf(resp.StatusCode, resp.Header.Get("Retry-After"), d.cfg.Now())
	}
	return res
}

// loadOfStatus is what an answer's status says about the host's load:
// 429 and 503 are drops (the host says it is overloaded), other 5xx, 408
// and 425 say nothing about load, everything else is an answer in time.
func loadOfStatus(code int) (loadSignal, string) {
	switch {
	case code == http.StatusTooManyRequests:
		return signalDrop, cut429
	case code == http.StatusServiceUnavailable:
		return signalDrop, cut503
	case code >= 500, code == http.StatusRequestTimeout, code == http.StatusTooEarly:
		return signalNone, ""
	}
	return signalSuccess, ""
}

// wireClock times one attempt with one timer: from its start it bounds
// getting a connection; when the request gets one (GotConn) it is re-armed
// for the delivery timeout. It records when that happened and whether the
// request was written in full (WroteRequest without error).
type wireClock struct {
	timeout time.Duration
	cancel  context.CancelCauseFunc
	// allow, when set, is asked when the request gets its connection: false
	// cancels it unwritten (errFenced).
	allow func() bool

	mu      sync.Mutex
	timer   *time.Timer
	onWire  time.Time
	written bool
	stopped bool
}

// wireState is a snapshot of a wireClock.
type wireState struct {
	onWire  time.Time
	written bool
}

func startWireClock(timeout time.Duration, cancel context.CancelCauseFunc) *wireClock {
	w := &wireClock{timeout: timeout, cancel: cancel}
	w.timer = time.AfterFunc(timeout, w.expire)
	return w
}

// expire cancels the attempt with the cause of the phase it is in.
func (w *wireClock) expire() {
	w.mu.Lock()
	wired := !w.onWire.IsZero()
	w.mu.Unlock()
	if wired {
		w.cancel(errDeliveryTimeout)
	} else {
		w.cancel(errConnectTimeout)
	}
}

func (w *wireClock) trace() *httptrace.ClientTrace {
	return &httptrace.ClientTrace{
		GotConn: func(httptrace.GotConnInfo) {
			if w.allow != nil && !w.allow() {
				// A pause came between the claim and the connection: the
				// request is not written.
				w.cancel(errFenced)
				return
			}
			w.mu.Lock()
			defer w.mu.Unlock()
			if w.stopped || !w.onWire.IsZero() {
				return // a retry on another connection keeps the first deadline
			}
			if w.timer.Stop() { // else the connect timeout fired first
				w.onWire = time.Now()
				w.timer.Reset(w.timeout)
			}
		},
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				w.mu.Lock()
				w.written = true
				w.mu.Unlock()
			}
		},
	}
}

func (w *wireClock) snapshot() wireState {
	w.mu.Lock()
	defer w.mu.Unlock()
	return wireState{onWire: w.onWire, written: w.written}
}

func (w *wireClock) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.stopped = true
	w.timer.Stop()
}

// settleBackoff bounds the wait between tries of a failing settle.
const settleBackoff = 2 * time.Second

// settle records a delivery outcome on the store. A settle that fails (a
// commit that timed out behind a slow disk, a store refusing writes until
// it has reopened its file) is tried again, each try bounded by
// SettleTimeout, the waits doubling from 50 ms to settleBackoff, until it
// succeeds, the store is closed, or a hard stop cancels the deliveries:
// the outcome is known, and a claim left in the store holds its
// namespace's capacity (quota.Claims) until the reaper re-arms it after
// the visibility timeout, which for a small quota stalls the namespace.
// Every failed try is logged and counted; the row counts as in flight
// while it is retried. After a hard stop the row stays claimed and is
// re-armed on the next start.
func (d *Dispatcher) settle(row outbox.Row, res result) {
	if res.kind == outcomeAbandoned {
		d.cfg.Logger.Debug("dispatch: delivery abandoned by a hard stop; the claim will be re-armed",
			"dispatch_key", row.DispatchKey, "namespace", row.Namespace)
		return
	}
	now := d.cfg.Now()
	wait := 50 * time.Millisecond
	for {
		// Not cancelled by a hard stop: an answered delivery is still
		// recorded once.
		err := d.settleOnce(row, res, now)
		if err == nil {
			return
		}
		d.m.settleErrors.Inc()
		if errors.Is(err, outbox.ErrClosed) || d.deliveryCtx.Err() != nil {
			d.cfg.Logger.Error("dispatch: settle failed; the claim will be re-armed after the visibility timeout",
				"dispatch_key", row.DispatchKey, "namespace", row.Namespace, "error", err)
			return
		}
		d.cfg.Logger.Warn("dispatch: settle failed; trying again", "dispatch_key", row.DispatchKey,
			"namespace", row.Namespace, "retry_in", wait, "error", err)
		select {
		case <-d.deliveryCtx.Done():
		case <-time.After(wait):
		}
		wait = min(2*wait, settleBackoff)
	}
}

// settleOnce is one try of settle, bounded by SettleTimeout.
func (d *Dispatcher) settleOnce(row outbox.Row, res result, now time.Time) error {
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.SettleTimeout)
	defer cancel()
	attempt := max(row.Attempt, 1)
	ns := row.Namespace
	label := d.cfg.NamespaceLabel(ns)
	var err error
	switch res.kind {
	case outcomeDone:
		if err = d.cfg.Store.Complete(ctx, outbox.CompleteParams{DispatchKey: row.DispatchKey, Claim: row.Version, Now: now, StatusCode: res.status}); err == nil {
			d.m.delivered.WithLabelValues(label).Inc()
			d.m.enqueueToDel.WithLabelValues(label).Observe(max(now.Sub(row.CreatedAt), 0).Seconds())
		}
	case outcomeFenced:
		// Not sent: this process was paused after the claim. Back to
		// pending, same attempt; the shard's primary now (this node after
		// its handover, or another) claims it again.
		err = d.cfg.Store.Retry(ctx, outbox.RetryParams{DispatchKey: row.DispatchKey, Claim: row.Version, NextAttempt: attempt, VisibleAfter: now, LastError: row.LastError, Unattempted: true})
		d.m.fenced.WithLabelValues(label).Inc()
	case outcomeWait:
		// The route lost its (usable) target after the claim: back to
		// pending, same attempt, last_error kept; the sweep filter now skips
		// the route.
		err = d.cfg.Store.Retry(ctx, outbox.RetryParams{DispatchKey: row.DispatchKey, Claim: row.Version, NextAttempt: attempt, VisibleAfter: now, LastError: row.LastError, Unattempted: true})
		d.cfg.Logger.Info("dispatch: route lost its delivery target; row back to pending",
			"dispatch_key", row.DispatchKey, "namespace", ns, "task_queue", row.TaskQueue)
	case outcomeRetry:
		if res.unknown {
			d.m.outcomeUnknown.WithLabelValues(label).Inc()
		}
		policy := d.policyFor(ns)
		if attempt >= policy.MaxAttempts {
			msg := d.bound(fmt.Sprintf("attempts exhausted (%d of %d): %s", attempt, policy.MaxAttempts, res.lastError))
			if err = d.cfg.Store.Fail(ctx, outbox.FailParams{DispatchKey: row.DispatchKey, Claim: row.Version, LastError: msg, Now: now, StatusCode: res.status}); err == nil {
				d.m.failed.WithLabelValues(label).Inc()
				d.cfg.Logger.Warn("dispatch: row failed (dead letter): attempts exhausted",
					"dispatch_key", row.DispatchKey, "namespace", ns, "task_queue", row.TaskQueue, "attempt", attempt, "last_error", msg)
			}
			break
		}
		delay := retryDelay(policy, attempt, res)
		msg := d.bound(res.lastError)
		if err = d.cfg.Store.Retry(ctx, outbox.RetryParams{DispatchKey: row.DispatchKey, Claim: row.Version, NextAttempt: attempt + 1, VisibleAfter: now.Add(delay), LastError: msg, StatusCode: res.status, Now: now}); err == nil {
			d.m.retried.WithLabelValues(label).Inc()
			d.cfg.Logger.Debug("dispatch: delivery failed; retrying after backoff",
				"dispatch_key", row.DispatchKey, "namespace", ns, "attempt", attempt, "backoff", delay, "last_error", msg)
		}
	case outcomeFail:
		msg := d.bound(res.lastError)
		if err = d.cfg.Store.Fail(ctx, outbox.FailParams{DispatchKey: row.DispatchKey, Claim: row.Version, LastError: msg, Now: now, StatusCode: res.status}); err == nil {
			d.m.failed.WithLabelValues(label).Inc()
			d.cfg.Logger.Warn("dispatch: row failed (dead letter): permanent delivery error",
				"dispatch_key", row.DispatchKey, "namespace", ns, "task_queue", row.TaskQueue, "attempt", attempt, "last_error", msg)
		}
	}
	return err
}

// policyFor returns the retry policy of a namespace: the override, filled
// from the node's policy, if valid; else the node's policy.
func (d *Dispatcher) policyFor(namespace string) RetryPolicy {
	if d.cfg.RetryPolicyFor == nil {
		return d.cfg.Retry
	}
	p, ok := d.cfg.RetryPolicyFor(namespace)
	if !ok {
		return d.cfg.Retry
	}
	p = p.withDefaults(d.cfg.Retry)
	if err := p.validate(func(field string) string { return "RetryPolicyFor(" + strconv.Quote(namespace) + ")." + field }); err != nil {
		if _, warned := d.warnedPolicy.LoadOrStore(namespace, struct{}{}); !warned {
			d.cfg.Logger.Warn("dispatch: invalid per-namespace retry policy; using the node's", "namespace", namespace, "error", err)
		}
		return d.cfg.Retry
	}
	return p
}

// bound truncates s to LastErrorMax bytes on a rune boundary.
func (d *Dispatcher) bound(s string) string {
	return truncateUTF8(s, d.cfg.LastErrorMax)
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

// cleanExcerpt makes a body excerpt fit for last_error: valid UTF-8, no
// control characters, trimmed.
func cleanExcerpt(b []byte) string {
	s := strings.ToValidUTF8(string(b), "\uFFFD")
	s = strings.Map(func(r rune) rune {
		if r < 0x20 || r == 0x7f {
			return ' '
		}
		return r
	}, s)
	return strings.TrimSpace(s)
}

// badHeaderField reports the first row field that cannot travel as an HTTP
// header value (RFC 9110 §5.5: no CTL but HTAB). Such a row can never be
// delivered, so it fails at once.
func badHeaderField(r *outbox.Row) (string, bool) {
	fields := []struct{ name, v string }{
		{"dispatch_key", r.DispatchKey},
		{"namespace", r.Namespace},
		{"task_queue", r.TaskQueue},
		{"workflow_id", r.WorkflowID},
		{"activity_type", r.ActivityType},
		{"content_type", r.ContentType},
	}
	for _, f := range fields {
		for i := 0; i < len(f.v); i++ {
			if c := f.v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
				return f.name, true
			}
		}
	}
	return "", false
}
