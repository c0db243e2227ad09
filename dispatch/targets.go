package dispatch

import (
	"context"
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
// that claims up to batchSize rows through store, leaving held workflows'
// rows pending. *backpressure.Planner implements it. Sweep may return rows
// together with an error (rows it claimed before the error); the
// dispatcher delivers them.
type Planner interface {
	Sweep(ctx context.Context, store backpressure.ClaimStore, batchSize int, held map[string]struct{}) (backpressure.Sweep, error)
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
