package quota

import "context"

// Counter counts, per namespace, what holds its capacity on this node:
// the number a Ceiling caps (Ceiling.Headroom). The map has one entry per
// asked namespace (zero if none).
type Counter interface {
	Claimed(ctx context.Context, namespaces []string) (map[string]int, error)
}

// CountFunc adapts a function (a store's CountClaimedByNamespace, say) to
// Counter.
type CountFunc func(ctx context.Context, namespaces []string) (map[string]int, error)

// Claimed calls f.
func (f CountFunc) Claimed(ctx context.Context, namespaces []string) (map[string]int, error) {
	return f(ctx, namespaces)
}

// Claims is the node's Counter, the one statement of what counts against
// a namespace's headroom (DESIGN.md rule 1, CLAIMED-only headroom): per
// namespace, the larger of
//
//   - the rows claimed in the store on every shard held here, owned or not
//     (Held): right after an ownership change the rows of a shard just
//     lost are still being delivered here, and they keep counting until
//     they settle; and
//   - the deliveries the dispatcher is running (Deliveries.Running): a row
//     whose stored state a merge replaced while its request is at the
//     target (a peer's newer copy after a failover) is no longer claimed
//     in the store, yet it still occupies the target;
//
// less the deliveries whose target has answered and whose settle is still
// being written (Deliveries.Settling, ADR 0085): their claim is only
// bookkeeping by then, so the slot goes back to work while the settle
// commits instead of after it. The count never drops below the deliveries
// still at their targets (Running − Settling), so a target never sees more
// than the ceiling.
//
// Pending rows never count, or a tenant would wedge against its own
// backlog. The planner's headroom (backpressure.Planner), the lease demand
// a node reports (its has), the API's namespace view and a row's waiting
// explanation all read this count.
type Claims struct {
	// Held counts the claimed rows held here per namespace, every shard
	// (required).
	Held CountFunc
	// Deliveries snapshots the dispatcher's deliveries per namespace, both
	// counts under one lock. nil: none.
	Deliveries func() Deliveries
}

// Deliveries is one snapshot of a dispatcher's deliveries per namespace
// (rows; namespaces with none may be absent).
type Deliveries struct {
	// Running counts the deliveries launched and not yet settled.
	Running map[string]int
	// Settling counts those of Running whose target has answered, or that
	// were never sent, while their settle is written: they hold a stored
	// claim but no target slot. Never more than Running.
	Settling map[string]int
}

// Claimed implements Counter.
func (c Claims) Claimed(ctx context.Context, namespaces []string) (map[string]int, error) {
	held, err := c.Held(ctx, namespaces)
	if err != nil {
		return held, err
	}
	out := make(map[string]int, len(namespaces))
	for _, ns := range namespaces {
		out[ns] = held[ns]
	}
	if c.Deliveries == nil {
		return out, nil
	}
	d := c.Deliveries()
	for _, ns := range namespaces {
		out[ns] = fold(out[ns], d, ns)
	}
	return out, nil
}

// Of is Claimed folded into counts the caller already read for every
// namespace of held (NamespaceStats, say): the same rule, adding the
// namespaces with only running deliveries.
func (c Claims) Of(held map[string]int) map[string]int {
	out := make(map[string]int, len(held))
	for ns, n := range held {
		out[ns] = n
	}
	if c.Deliveries == nil {
		return out
	}
	d := c.Deliveries()
	for ns := range d.Running {
		if _, ok := out[ns]; !ok {
			out[ns] = 0
		}
	}
	for ns, n := range out {
		out[ns] = fold(n, d, ns)
	}
	return out
}

// fold applies the rule to one namespace: max(held, running) − settling,
// which is never below running − settling (the deliveries at their
// targets).
func fold(held int, d Deliveries, ns string) int {
	running := d.Running[ns]
	return max(held, running) - min(d.Settling[ns], running)
}
