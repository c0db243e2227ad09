package dispatch

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/outbox"
)

// Target is where a route's rows are delivered.
type Target struct {
	// URL receives one POST per row. It may contain the placeholders
	// {namespace} and {task_queue}, replaced by the row's values, path
	// escaped (url.PathEscape: "a/b c" becomes "a%2Fb%20c").
	URL string
	// Timeout bounds one delivery attempt to this target; 0 means
	// Config.DeliveryTimeout. It can only shorten DeliveryTimeout (the
	// visibility timeout is derived from DeliveryTimeout, so a longer
	// attempt could be re-armed while still running).
	Timeout time.Duration
	// Headers are static request headers sent with every delivery to this
	// target (e.g. Authorization), by canonical name. The dispatcher's own
	// headers win over them; the node refuses the names ReservedHeader
	// reports before they get here. Values are credentials: never logged.
	Headers map[string]string
	// SigningSecrets sign every delivery per Standard Webhooks (package
	// webhook: "whsec_" + base64 of a 24–64 byte key), one signature per
	// secret in webhook-signature, newest first during a rotation; none:
	// deliveries are unsigned. Never logged.
	SigningSecrets []string
}

// reservedHeaders are header names a target's static headers may not
// set: hop-by-hop headers (RFC 9110 §7.6.1, plus Proxy-Connection, TE,
// Trailer, Upgrade), message framing the client computes (Host,
// Content-Length, Transfer-Encoding, Expect), and the headers every
// delivery carries (Content-Type, User-Agent, Idempotency-Key; the
// Fairshard-* and Webhook-* prefixes are reserved whole, see
// ReservedHeader).
var reservedHeaders = map[string]bool{
	"Connection": true, "Keep-Alive": true, "Proxy-Connection": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
	"Host": true, "Content-Length": true, "Content-Encoding": true, "Expect": true,
	"Content-Type": true, "User-Agent": true, HeaderIdempotencyKey: true,
}

// ReservedHeader reports whether a target's static headers may not set
// the header name (any case): a hop-by-hop or framing header, one the
// dispatcher sets on every delivery, or any name starting with
// "Fairshard-" (ours) or "Webhook-" (Standard Webhooks' signature
// headers).
func ReservedHeader(name string) bool {
	c := http.CanonicalHeaderKey(name)
	return reservedHeaders[c] || strings.HasPrefix(c, "Fairshard-") || strings.HasPrefix(c, "Webhook-")
}

// Targets resolves the delivery target of a route (namespace, task_queue).
// ok = false means no target is configured: the route's rows wait pending
// (not failed) until one is. Implementations must be safe for concurrent
// use and cheap: Target is called for every pending route on every sweep
// and once per delivery. The node backs it with the gossiped cluster config.
type Targets interface {
	Target(route outbox.ClaimScope) (target Target, ok bool)
}

// TargetsFunc adapts a function to Targets.
type TargetsFunc func(route outbox.ClaimScope) (Target, bool)

// Target implements Targets.
func (f TargetsFunc) Target(route outbox.ClaimScope) (Target, bool) { return f(route) }

// Planner is what the dispatcher needs of the fair claim planner: one sweep
// that claims up to req.Batch rows through store, leaving held workflows'
// rows and ineligible routes pending. *backpressure.Planner implements it.
// Sweep may return rows together with an error (rows it claimed before the
// error); the dispatcher delivers them.
type Planner interface {
	Sweep(ctx context.Context, store backpressure.ClaimStore, req backpressure.SweepRequest) (backpressure.Sweep, error)
}

// Fence is what the dispatcher needs of the node's pause watch
// (internal/pause.Watch): the generation an action starts in, and whether
// an action of a generation may reach the world now.
type Fence interface {
	Gen() uint64
	Allow(gen uint64) bool
}

// Store is what the dispatcher needs of the node's store: the claims the
// planner makes through it (a backpressure.BatchClaimer, found by the
// planner, claims a whole sweep in one transaction), the settles of
// delivered rows and the re-arm of stale claims. The node gives it
// replication.Store, so every settle reaches the backups.
type Store interface {
	backpressure.ClaimStore
	Complete(ctx context.Context, p outbox.CompleteParams) error
	Retry(ctx context.Context, p outbox.RetryParams) error
	Fail(ctx context.Context, p outbox.FailParams) error
	RearmStale(ctx context.Context, p outbox.RearmParams) ([]outbox.Row, error)
}

var _ Planner = (*backpressure.Planner)(nil)

// usableURL reports whether a URL (a template once expanded) is an
// absolute http or https URL with a host.
func usableURL(raw string) bool {
	u, err := url.Parse(raw)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

// expandURL substitutes the route's placeholders in a target URL template.
func expandURL(tmpl string, route outbox.ClaimScope) string {
	if !strings.Contains(tmpl, "{") {
		return tmpl
	}
	return strings.NewReplacer(
		"{namespace}", url.PathEscape(route.Namespace),
		"{task_queue}", url.PathEscape(route.TaskQueue),
	).Replace(tmpl)
}
