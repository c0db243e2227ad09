package httpapi

import (
	"context"
	"time"

	"github.com/fairshard/fairshard/node/peer"
	"github.com/fairshard/fairshard/node/waiting"
	"github.com/fairshard/fairshard/outbox"
)

// lookupView is a row as a lookup answers it (GET /v1/rows/{key} and its
// node-to-node form): the row view, its attempt history on this node and,
// for a live row, why it waits
// (package waiting), from this node's facts: the applied ownership view
// the store's claim scope uses, the settings (pause, hold), the
// dispatcher's target check, the planner's quota cache and the claimed
// count the dispatcher's ceiling reads. A failed claimed-count read leaves
// the ceiling facts out rather than failing the lookup.
func (a *API) lookupView(ctx context.Context, row outbox.Row) peer.RowView {
	v := peer.ViewOf(row, a.cfg.Self)
	v.Waiting = a.explain(ctx, row, time.Now().UTC())
	if h, err := a.cfg.Store.Attempts(ctx, row.DispatchKey); err == nil {
		v.Attempts = h
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
		Quota:     a.cfg.Settings.Quotas().Quota(ctx, row.Namespace),
		Fraction:  snap.Fraction,
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
	return waiting.Explain(f)
}
