package dispatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fairshard/fairshard/outbox"
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

// result is how one delivery attempt ended.
type result struct {
	kind      outcomeKind
	status    int    // HTTP status; 0 without a response
	lastError string // unbounded; settle bounds it
	// retryAfter is the response's Retry-After, when hasRetryAfter.
	retryAfter    time.Duration
	hasRetryAfter bool
}

// deliverAndSettle delivers one claimed row and records the outcome.
func (d *Dispatcher) deliverAndSettle(row outbox.Row) {
	target, ok := d.cfg.Targets.Target(row.Route())
	var res result
	if !ok || !usableURL(target.URL) {
		res = result{kind: outcomeWait}
	} else {
		res = d.deliver(row, target)
	}
	d.settle(row, res)
}

// deliver POSTs the row to its target and classifies the answer.
func (d *Dispatcher) deliver(row outbox.Row, t Target) result {
	if field, bad := badHeaderField(&row); bad {
		return result{kind: outcomeFail, lastError: fmt.Sprintf("row cannot be sent: its %s is not a valid HTTP header value", field)}
	}
	timeout := d.cfg.DeliveryTimeout
	if t.Timeout > 0 && t.Timeout < timeout {
		timeout = t.Timeout
	}
	ctx, cancel := context.WithTimeout(d.deliveryCtx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, expandURL(t.URL, row.Route()), bytes.NewReader(row.Payload))
	if err != nil {
		// The expanded target URL does not parse: a configuration error the
		// operator can fix, so the row waits rather than use up attempts.
		d.log.Warn("dispatch: target URL unusable; row back to pending", "namespace", row.Namespace, "task_queue", row.TaskQueue, "error", err)
		return result{kind: outcomeWait}
	}
	ct := row.ContentType
	if ct == "" {
		ct = "application/octet-stream"
	}
	h := req.Header
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

	start := time.Now()
	resp, err := d.client.Do(req)
	if err != nil {
		d.m.deliveryDur.WithLabelValues(d.cfg.NamespaceLabel(row.Namespace)).Observe(time.Since(start).Seconds())
		if d.deliveryCtx.Err() != nil {
			return result{kind: outcomeAbandoned}
		}
		msg := err.Error()
		if errors.Is(err, context.DeadlineExceeded) {
			msg = fmt.Sprintf("timeout after %v: %v", timeout, err)
		}
		return result{kind: outcomeRetry, lastError: msg}
	}
	res := result{kind: classifyStatus(resp.StatusCode), status: resp.StatusCode}
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
		res.retryAfter, res.hasRetryAfter = parseRetryAfter(resp.Header.Get("Retry-After"), d.cfg.Now())
	}
	return res
}

// settle records a delivery outcome on the store. A settle error is logged
// and counted; the row stays claimed and the reaper re-arms it once its
// claim is older than the visibility timeout.
func (d *Dispatcher) settle(row outbox.Row, res result) {
	if res.kind == outcomeAbandoned {
		d.log.Debug("dispatch: delivery abandoned by a hard stop; the claim will be re-armed",
			"dispatch_key", row.DispatchKey, "namespace", row.Namespace)
		return
	}
	// Not cancelled by a hard stop: an answered delivery is still recorded.
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.SettleTimeout)
	defer cancel()
	now := d.cfg.Now()
	attempt := max(row.Attempt, 1)
	ns := row.Namespace
	label := d.cfg.NamespaceLabel(ns)
	var err error
	switch res.kind {
	case outcomeDone:
		if err = d.store.Complete(ctx, outbox.CompleteParams{DispatchKey: row.DispatchKey, Claim: row.Version, Now: now}); err == nil {
			d.m.delivered.WithLabelValues(label).Inc()
			d.m.enqueueToDel.WithLabelValues(label).Observe(max(now.Sub(row.CreatedAt), 0).Seconds())
		}
	case outcomeWait:
		// The route lost its (usable) target after the claim: back to
		// pending, same attempt, last_error kept; the sweep filter now skips
		// the route.
		err = d.store.Retry(ctx, outbox.RetryParams{DispatchKey: row.DispatchKey, Claim: row.Version, NextAttempt: attempt, VisibleAfter: now, LastError: row.LastError})
		d.log.Info("dispatch: route lost its delivery target; row back to pending",
			"dispatch_key", row.DispatchKey, "namespace", ns, "task_queue", row.TaskQueue)
	case outcomeRetry:
		policy := d.policyFor(ns)
		if attempt >= policy.MaxAttempts {
			msg := d.bound(fmt.Sprintf("attempts exhausted (%d of %d): %s", attempt, policy.MaxAttempts, res.lastError))
			if err = d.store.Fail(ctx, outbox.FailParams{DispatchKey: row.DispatchKey, Claim: row.Version, LastError: msg, Now: now}); err == nil {
				d.m.failed.WithLabelValues(label).Inc()
				d.log.Warn("dispatch: row failed (dead letter): attempts exhausted",
					"dispatch_key", row.DispatchKey, "namespace", ns, "task_queue", row.TaskQueue, "attempt", attempt, "last_error", msg)
			}
			break
		}
		delay := policy.randBackoff(attempt)
		if res.hasRetryAfter {
			delay = min(res.retryAfter, policy.Cap)
		}
		msg := d.bound(res.lastError)
		if err = d.store.Retry(ctx, outbox.RetryParams{DispatchKey: row.DispatchKey, Claim: row.Version, NextAttempt: attempt + 1, VisibleAfter: now.Add(delay), LastError: msg}); err == nil {
			d.m.retried.WithLabelValues(label).Inc()
			d.log.Debug("dispatch: delivery failed; retrying after backoff",
				"dispatch_key", row.DispatchKey, "namespace", ns, "attempt", attempt, "backoff", delay, "last_error", msg)
		}
	case outcomeFail:
		msg := d.bound(res.lastError)
		if err = d.store.Fail(ctx, outbox.FailParams{DispatchKey: row.DispatchKey, Claim: row.Version, LastError: msg, Now: now}); err == nil {
			d.m.failed.WithLabelValues(label).Inc()
			d.log.Warn("dispatch: row failed (dead letter): permanent delivery error",
				"dispatch_key", row.DispatchKey, "namespace", ns, "task_queue", row.TaskQueue, "attempt", attempt, "last_error", msg)
		}
	}
	if err != nil {
		d.m.settleErrors.Inc()
		d.log.Error("dispatch: settle failed; the claim will be re-armed after the visibility timeout",
			"dispatch_key", row.DispatchKey, "namespace", ns, "error", err)
	}
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
	if err := p.validate("RetryPolicyFor(" + strconv.Quote(namespace) + ")"); err != nil {
		if _, warned := d.warnedPolicy.LoadOrStore(namespace, struct{}{}); !warned {
			d.log.Warn("dispatch: invalid per-namespace retry policy; using the node's", "namespace", namespace, "error", err)
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
