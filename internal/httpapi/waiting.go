package httpapi

import (
	"context"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/backpressure"

	"github.com/fairshard/fairshard/internal/peer"
	"github.com/fairshard/fairshard/internal/waiting"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/quota"
)

// lookupView is a row as a lookup answers it (GET /v1/rows/{key} and its
// node-to-node form): the row view, its attempt history on this node and,
// for a live row, why it waits
// (package waiting), from this node's facts: the applied ownership view
// the store's claim scope uses, the settings (pause, hold), the
// dispatcher's target check, the planner's quota cache and the claimed
// count the dispatcher's ceiling reads. A failed claimed-count read leaves
// the ceiling facts out rather than failing the lookup.
func (a *API) lookupView(ctx context.Context, row outbox.Row) api.Row {
	v := peer.ViewOf(row, a.cfg.Self)
	v.Waiting = a.explain(ctx, row, time.Now().UTC())
	if h, err := a.cfg.Store.Attempts(ctx, row.DispatchKey); err == nil {
		v.Attempts = peer.AttemptsOf(h)
	} else {
		a.log.Warn("row lookup: attempt history unreadable", "dispatch_key", row.DispatchKey, "err", err)
	}
	return v
}

// explain gathers the facts package waiting reads for row at now.
func (a *API) explain(ctx context.Context, row outbox.Row, now time.Time) *waiting.Waiting {
	if row.Status.Terminal() {
		return nil
	}
	snap := a.cfg.Ownership()
	f := waiting.Facts{
		Row: row, Now: now, Node: a.cfg.Self,
		OwnsShard: snap.Owns(row.Shard),
		Paused:    a.cfg.Settings.Paused(row.Namespace),
		Held:      row.WorkflowID != "" && a.cfg.Settings.IsHeld(row.WorkflowID),
		Fraction:  snap.Fraction,
	}
	c := a.cfg.Ceilings.Ceiling(ctx, row.Namespace)
	f.Quota, f.Ceiling, f.HasCeiling = c.Quota, c.Rows, true
	if c.Mode == quota.ModeExact {
		f.Exact = true
		if a.cfg.Leases != nil {
			l := a.cfg.Leases.NodeLease(row.Namespace)
			f.Coordinator, f.Wants = l.Coordinator, l.Wants
		}
	}
	if owner, ok := snap.Owner(row.Shard); ok {
		f.Owner = owner.Name
	}
	// Eligible is the dispatcher's route filter: not paused, then a usable
	// target. Like the filter, a paused namespace's target is not judged.
	f.HasTarget = f.Paused || a.cfg.Dispatcher.Eligible(row.Route())
	if held, err := a.cfg.Store.CountClaimedHeld(ctx, []string{row.Namespace}); err == nil {
		f.ClaimedHeld = held[row.Namespace]
	} else {
		a.log.Warn("row lookup: claimed count failed; the ceiling is left out of waiting", "namespace", row.Namespace, "err", err)
		f.ClaimedUnknown = true
	}
	if f.OwnsShard && !f.Paused && f.HasTarget {
		a.hostFacts(ctx, &f, now)
	}
	return waiting.Explain(f)
}

// hostFacts fills the target host facts of f from the planner's host
// ceiling: the route's host, its usage, and the namespaces with visible
// pending routes to it (who shares it, as a sweep counts them), through
// backpressure.HostAllowance, the planner's own rule.
func (a *API) hostFacts(ctx context.Context, f *waiting.Facts, now time.Time) {
	if a.cfg.Hosts == nil {
		return
	}
	route := f.Row.Route()
	host, ok := a.cfg.Hosts.HostOf(route)
	if !ok {
		return
	}
	u := a.cfg.Hosts.HostUsage(host)
	var wanting []string
	if u.InFlight >= max(u.Limit, 1) {
		// Only a full host's guaranteed shares depend on who else wants
		// it; with a free slot the namespace may take it whatever they are.
		routes, err := a.cfg.Store.PendingRoutes(ctx, now)
		if err != nil {
			a.log.Warn("row lookup: pending routes unreadable; the host ceiling is left out of waiting", "err", err)
			return
		}
		for _, r := range routes {
			if h, ok := a.cfg.Hosts.HostOf(r); ok && h == host {
				wanting = append(wanting, r.Namespace)
			}
		}
	}
	allowance, share, _ := backpressure.HostAllowance(u, route.Namespace, wanting)
	f.Host, f.HostLimit, f.HostInFlight = host, max(u.Limit, 1), u.InFlight
	f.HostShare, f.HostNamespaceInFlight, f.HostAllowance = share, u.ByNamespace[route.Namespace], allowance
}
