// Package waiting answers "why is this row waiting?" (docs/api.md, "Why is
// this row waiting?"; docs/adr/0053-why-a-row-waits.md): from the facts a
// node already uses to claim (its applied ownership view, the gossiped
// settings, the dispatcher's target check, the planner's quota and
// per-node ceiling, the store's claimed count), it names the first thing
// that keeps a live row from being claimed, with the numbers behind it and
// one plain sentence.
//
// Explain is a pure function of Facts; package httpapi gathers the facts on
// the node holding the row. The package imports only leaves (outbox,
// shards) so the peer view can carry a Waiting between nodes.
package waiting

import (
	"cmp"
	"fmt"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// Reason is a machine-readable cause of a wait, named after what the code
// checks. The constants are listed in the order Explain checks them; the
// first that holds is the Waiting's Reason, the others that also hold are
// in Also.
type Reason string

const (
	// Claimed: the row is claimed (status claimed) and being delivered by
	// the node holding it; it waits for the target's answer, or, if that
	// node died mid-delivery, for the visibility timeout to re-arm it.
	Claimed Reason = "claimed"
	// InTransfer: the row is held on a node that does not own its shard
	// (the store's claim scope leaves it out); the handoff loop moves it to
	// the owner, which claims it there.
	InTransfer Reason = "in_transfer"
	// NamespacePaused: the namespace is paused (PUT /v1/namespaces/{ns}
	// {"paused":true}); the dispatcher's route filter skips it.
	NamespacePaused Reason = "namespace_paused"
	// NoTarget: the route has no usable delivery target (none configured,
	// no --default-target, or not an absolute http(s) URL); the
	// dispatcher's route filter skips it. Like that filter, Explain does
	// not judge the target of a paused namespace's route.
	NoTarget Reason = "no_target"
	// WorkflowHeld: the row's workflow is held (PUT
	// /v1/workflows/{wf}/hold); claims exclude it.
	WorkflowHeld Reason = "workflow_held"
	// RetryBackoff: a failed attempt scheduled the row's next attempt at
	// VisibleAfter; claims take only rows visible at the claim instant.
	RetryBackoff Reason = "retry_backoff"
	// Delayed: the row was appended (or redriven) with a VisibleAfter in
	// the future.
	Delayed Reason = "delayed"
	// NamespaceAtCeiling: the namespace's claimed rows on this node reach
	// its per-node ceiling (CLAIMED-only headroom, seed §3.1): in exact
	// mode its capacity lease grant, in proportional mode ceil(quota ×
	// owned/total); a claim waits for a delivery to finish, or for a
	// larger grant. It is not listed for a paused namespace (the pause
	// zeroes the ceiling; NamespacePaused is the cause), nor in exact mode
	// when the node asks for nothing while an earlier cause holds the row
	// back (a grant of 0 then follows from that cause).
	NamespaceAtCeiling Reason = "namespace_at_ceiling"
	// HostSlotsFull: the route's target host has no slot this namespace
	// may take: the rows in flight to the host reach its concurrency limit
	// and the namespace has used its guaranteed share of it (the planner's
	// host ceiling); a claim waits for a delivery to that host to finish.
	HostSlotsFull Reason = "host_slots_full"
	// Claimable: nothing holds the row back; the next sweep (every poll
	// interval, or sooner when woken) claims it in its namespace's fair
	// turn.
	Claimable Reason = "claimable"
)

// Facts are what Explain reads: the row and the node's view of it at Now.
// Zero values mean "not known" only where a field says so.
type Facts struct {
	// Row is the row as the deciding node's store holds it.
	Row outbox.Row
	// Now is the instant of the explanation (UTC).
	Now time.Time
	// Node is the node holding the row (the one whose facts these are).
	Node string
	// OwnsShard is whether Node owns the row's shard in its applied
	// ownership view (the view the store's claim scope comes from); Owner
	// names the shard's owner in that view ("" if none).
	OwnsShard bool
	Owner     string
	// Paused, HasTarget and Held are the namespace's pause, the route's
	// target check (dispatch.Dispatcher.Eligible's) and the workflow's hold.
	Paused, HasTarget, Held bool
	// Quota is the namespace's cluster-wide quota as the planner's quota
	// cache resolves it (rows); Fraction is Node's owned shard fraction.
	Quota    uint32
	Fraction shards.OwnedShardFraction
	// Ceiling, when HasCeiling, is this node's ceiling for the namespace as
	// the planner's quota.Source gives it; otherwise ceil(Quota ×
	// Fraction) is used.
	Ceiling    uint32
	HasCeiling bool
	// Exact says Ceiling is this node's capacity lease grant (exact quota
	// mode, DESIGN.md "Exact cluster-wide quota") rather than ceil(Quota ×
	// Fraction); Coordinator is the namespace's coordinator in this node's
	// view and Wants this node's last reported demand to it (rows).
	Exact       bool
	Coordinator string
	Wants       uint32
	// ClaimedHeld is the namespace's claimed rows held on Node, every shard
	// (the count the dispatcher's ceiling uses). ClaimedUnknown says it
	// could not be read: the ceiling is then neither judged nor shown.
	ClaimedHeld    int
	ClaimedUnknown bool
	// Host is the route's target host ("scheme://host:port"; "" when the
	// node applies no host ceiling to it). HostLimit is its concurrency
	// limit (rows), HostInFlight the rows in flight to it, HostShare the
	// namespace's guaranteed share and HostNamespaceInFlight the
	// namespace's rows in flight there; HostAllowance is what the
	// namespace may still claim on the host (the planner's rule, from
	// backpressure).
	Host                                 string
	HostLimit, HostInFlight, HostShare   int
	HostNamespaceInFlight, HostAllowance int
}

// Waiting explains why a live row has not been delivered yet: the
// `waiting` object of GET /v1/rows/{dispatch_key}, package api's type.
// Its Reason is the first cause Explain found (one of Reason's constants),
// Also the other causes that hold too, in check order.
type Waiting = api.Waiting

// Explain returns why f.Row waits, or nil for a terminal row (done,
// failed, cancelled). The checks run in Reason's order, which is the order
// a row meets them on its way to a claim: claim state, the store's claim
// scope, the dispatcher's route filter, the claim's exclusions and
// visibility, then the planner's ceiling.
func Explain(f Facts) *Waiting {
	r := f.Row
	if r.Status.Terminal() || !r.Status.Valid() {
		return nil
	}
	w := &Waiting{Node: f.Node, Owner: f.Owner, Attempt: r.Attempt, LastError: r.LastError}
	if r.Status == outbox.StatusClaimed {
		w.Reason = string(Claimed)
		w.ClaimedAt = optTime(r.ClaimedAt)
		w.Message = fmt.Sprintf("Attempt %d was claimed by %s at %s and is being delivered; it settles when the target answers.",
			r.Attempt, f.Node, stamp(r.ClaimedAt))
		return w
	}
	var reasons []Reason
	add := func(rs Reason, holds bool) {
		if holds {
			reasons = append(reasons, rs)
		}
	}
	future := r.VisibleAfter.After(f.Now)
	if future {
		w.VisibleAfter = optTime(r.VisibleAfter)
	}
	ceiling := f.Fraction.PerNodeCeiling(f.Quota)
	if f.HasCeiling {
		ceiling = f.Ceiling
	}
	ceilingKnown := f.OwnsShard && !f.ClaimedUnknown
	if ceilingKnown {
		claimed, quota, frac := f.ClaimedHeld, f.Quota, f.Fraction.Float()
		w.Claimed, w.Ceiling, w.Quota, w.OwnedShardFraction = &claimed, &ceiling, &quota, &frac
		w.QuotaMode = "proportional"
		if f.Exact {
			wants := f.Wants
			w.QuotaMode, w.Coordinator, w.Wants = "exact", f.Coordinator, &wants
		}
	}
	add(InTransfer, !f.OwnsShard)
	add(NamespacePaused, f.Paused)
	add(NoTarget, !f.HasTarget)
	add(WorkflowHeld, f.Held)
	add(RetryBackoff, future && r.Attempt > 1)
	add(Delayed, future && r.Attempt <= 1)
	// A ceiling that follows from an earlier cause is not a cause: the
	// pause zeroes it, and in exact mode a node whose rows are all held
	// back asks for (and is granted) nothing.
	consequence := f.Paused || f.Exact && f.Wants == 0 && f.ClaimedHeld == 0 && len(reasons) > 0
	add(NamespaceAtCeiling, ceilingKnown && f.ClaimedHeld >= int(ceiling) && !consequence)
	if f.OwnsShard && f.Host != "" {
		limit, inFlight := f.HostLimit, f.HostInFlight
		w.Host, w.HostLimit, w.HostInFlight = f.Host, &limit, &inFlight
		add(HostSlotsFull, f.HostAllowance <= 0)
	}
	if len(reasons) == 0 {
		reasons = []Reason{Claimable}
	}
	w.Reason = string(reasons[0])
	for _, rs := range reasons[1:] {
		w.Also = append(w.Also, string(rs))
	}
	w.Message = message(reasons[0], f, ceiling)
	return w
}

func message(rs Reason, f Facts, ceiling uint32) string {
	r := f.Row
	route := r.Route()
	switch rs {
	case InTransfer:
		owner := f.Owner
		owner = cmp.Or(owner, "no live member")
		return fmt.Sprintf("Shard %d is owned by %s, not by %s which holds the row; the handoff moves it to the owner, which claims it there.",
			r.Shard, owner, f.Node)
	case NamespacePaused:
		return fmt.Sprintf("Namespace %q is paused; its rows stay pending until it is resumed.", r.Namespace)
	case NoTarget:
		return fmt.Sprintf("Route %s has no usable delivery target (none set, no --default-target, or not an absolute http(s) URL); its rows stay pending until one is set.", route)
	case WorkflowHeld:
		return fmt.Sprintf("Workflow %q is held; its rows stay pending until the hold is released.", r.WorkflowID)
	case RetryBackoff:
		return fmt.Sprintf("Attempt %d failed (%s); attempt %d is due at %s (in %s).",
			r.Attempt-1, orNone(r.LastError), r.Attempt, stamp(r.VisibleAfter), r.VisibleAfter.Sub(f.Now).Round(time.Millisecond))
	case Delayed:
		return fmt.Sprintf("The row is delayed until %s (in %s).", stamp(r.VisibleAfter), r.VisibleAfter.Sub(f.Now).Round(time.Millisecond))
	case NamespaceAtCeiling:
		if f.Exact {
			return fmt.Sprintf("Namespace %q has %d claimed rows on %s and its lease grant is %d of the exact quota %d (coordinator %s; %s wants %d); the row is claimed when a delivery finishes or the coordinator grants more.",
				r.Namespace, f.ClaimedHeld, f.Node, ceiling, f.Quota, cmp.Or(f.Coordinator, "unknown"), f.Node, f.Wants)
		}
		return fmt.Sprintf("Namespace %q has %d claimed rows on %s, its per-node ceiling is %d (quota %d × %d/%d shards owned, rounded up); the row is claimed when a delivery finishes.",
			r.Namespace, f.ClaimedHeld, f.Node, ceiling, f.Quota, f.Fraction.Owned(), f.Fraction.Total())
	case HostSlotsFull:
		return fmt.Sprintf("Target host %s has %d rows in flight from %s, its limit is %d, and namespace %q has %d of them (its share %d); the row is claimed when a delivery to that host finishes.",
			f.Host, f.HostInFlight, f.Node, f.HostLimit, r.Namespace, f.HostNamespaceInFlight, f.HostShare)
	default:
		return fmt.Sprintf("Nothing holds the row back: %s claims it at its next sweep, in namespace %q's fair turn.", f.Node, r.Namespace)
	}
}

func orNone(s string) string {
	if s == "" {
		return "no error recorded"
	}
	return s
}

func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
