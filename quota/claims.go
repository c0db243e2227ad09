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
//   - the deliveries the dispatcher is running (Running): a row whose
//     stored state a merge replaced while its request is at the target (a
//     peer's newer copy after a failover) is no longer claimed in the
//     store, yet it still occupies the target.
//
// Pending rows never count, or a tenant would wedge against its own
// backlog. The planner's headroom (backpressure.Planner), the lease demand
// a node reports (its has), the API's namespace view and a row's waiting
// explanation all read this count.
type Claims struct {
	// Held counts the claimed rows held here per namespace, every shard
	// (required).
	Held CountFunc
	// Running returns the deliveries in flight per namespace (rows;
	// namespaces with none may be absent). nil: none.
	Running func() map[string]int
}

// Claimed implements Counter.
func (c Claims) Claimed(ctx context.Context, namespaces []string) (map[string]int, error) {
	out, err := c.Held(ctx, namespaces)
	if err != nil {
		return out, err
	}
	if out == nil {
		out = make(map[string]int, len(namespaces))
	}
	if c.Running == nil {
		return out, nil
	}
	running := c.Running()
	for _, ns := range namespaces {
		out[ns] = max(out[ns], running[ns])
	}
	return out, nil
}

// Of is Claimed folded into counts the caller already read for every
// namespace of held (NamespaceStats, say): the larger of each and the
// deliveries running, adding namespaces with only running deliveries.
func (c Claims) Of(held map[string]int) map[string]int {
	out := make(map[string]int, len(held))
	for ns, n := range held {
		out[ns] = n
	}
	if c.Running != nil {
		for ns, n := range c.Running() {
			out[ns] = max(out[ns], n)
		}
	}
	return out
}
