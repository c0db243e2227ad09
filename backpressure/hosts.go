package backpressure

import (
	"github.com/fairshard/fairshard/outbox"
)

// HostSlots is the per-target-host ceiling the planner applies beside each
// namespace's (claim only what can be sent now): a node keeps at most about
// Limit rows in flight to one target host, so a claimed row never waits in
// an HTTP client queue, and the host's slots are shared fairly among the
// namespaces that want it.
//
// It is declared here, where it is consumed, and implemented by package
// dispatch (dispatch.HostLimits), which resolves routes to hosts, counts
// the rows in flight and adapts each host's limit to the host's answers.
// It is a separate input of the planner on purpose: namespace ceilings
// (quota, owned shard fraction) and host ceilings come from different
// places and compose only here, in the sweep.
//
// Implementations must be safe for concurrent use and cheap: HostOf is
// called once per eligible route per sweep, HostUsage once per host per
// sweep.
type HostSlots interface {
	// HostOf names the target host a route's rows are delivered to:
	// scheme, host and port of the route's target URL after template
	// expansion, e.g. "https://hooks.example.com:443". ok = false leaves
	// the route without a host ceiling (only its namespace's applies).
	HostOf(route outbox.ClaimScope) (host string, ok bool)
	// HostUsage returns the host's current concurrency limit and the rows
	// being delivered to it now, as the sweep starts.
	HostUsage(host string) HostUsage
}

// HostUsage is one target host's concurrency as a sweep starts.
type HostUsage struct {
	// Limit is how many rows the node may have in flight to the host at
	// once (rows, ≥ 1; a smaller value is taken as 1).
	Limit int
	// InFlight is the rows being delivered to the host now, all
	// namespaces together (rows, ≥ 0).
	InFlight int
	// ByNamespace splits InFlight by namespace (rows; absent = 0). The
	// planner reads it and never modifies it.
	ByNamespace map[string]int
}

// HostSweep is what one sweep did with one target host (hosts that no
// eligible route maps to are not reported).
type HostSweep struct {
	// Host is the host's name as HostSlots.HostOf gave it.
	Host string
	// Limit is the host's concurrency limit during the sweep (rows, ≥ 1).
	Limit int
	// InFlightBefore is the rows in flight to the host when the sweep
	// started.
	InFlightBefore int
	// Claimed is how many rows the sweep claimed for the host.
	Claimed int
	// Namespaces is how many namespaces shared the host: those with
	// claimable routes to it plus those with rows in flight to it.
	Namespaces int
	// Share is each namespace's guaranteed share of the host:
	// ceil(Limit / Namespaces) rows.
	Share int
}

// Full reports whether the host ended the sweep with no free slot
// (InFlightBefore + Claimed ≥ Limit): rows that wanted it wait for a
// delivery to it to finish.
func (h HostSweep) Full() bool { return h.InFlightBefore+h.Claimed >= h.Limit }

// hostPlan is one host's state during a sweep: its usage when the sweep
// started, and what this sweep has claimed for it so far.
//
// The rules (docs/adr/0015-host-slots-bound-claims.md):
//
//   - share = ceil(Limit / n), n = namespaces that want the host (claimable
//     routes to it) or hold rows in flight to it: the seed's slice,
//     applied to the host's slots instead of the batch;
//   - guaranteed(ns) = share − ns's rows in flight and claimed there:
//     a namespace below its share may claim up to it even when the host is
//     full (Netflix concurrency-limits' partitioned limiter: a partition's
//     guaranteed percentage applies when the global limit is exceeded), so a
//     quiet namespace's row goes out with the next sweep instead of after
//     the next delivery of a noisy one; the host never gets more than
//     2 × Limit that way;
//   - free = Limit − rows in flight and claimed there: what the pass for
//     utilisation may hand to anyone.
type hostPlan struct {
	name    string
	usage   HostUsage
	limit   int
	holders int // namespaces sharing the host (see Namespaces)
	share   int
	claimed int            // this sweep's claims, all namespaces
	byNS    map[string]int // this sweep's claims per namespace
}

func (h *hostPlan) total() int { return h.usage.InFlight + h.claimed }

// guaranteed is what ns may still claim on the host under its share,
// never past 2 × Limit in flight.
func (h *hostPlan) guaranteed(ns string) int {
	g := h.share - h.usage.ByNamespace[ns] - h.byNS[ns]
	return max(min(g, 2*h.limit-h.total()), 0)
}

// free is what anyone may still claim on the host below its limit.
func (h *hostPlan) free() int { return max(h.limit-h.total(), 0) }

// allowance is what ns may claim on the host now: its guaranteed share in
// the fairness pass, and also the free slots in the utilisation pass.
func (h *hostPlan) allowance(ns string, utilisation bool) int {
	a := h.guaranteed(ns)
	if utilisation {
		a = max(a, h.free())
	}
	return a
}

func (h *hostPlan) take(ns string, n int) {
	h.claimed += n
	h.byNS[ns] += n
}

func (h *hostPlan) reset() {
	h.claimed = 0
	clear(h.byNS)
}

func (h *hostPlan) report() HostSweep {
	return HostSweep{Host: h.name, Limit: h.limit, InFlightBefore: h.usage.InFlight, Claimed: h.claimed, Namespaces: h.holders, Share: h.share}
}

// planHosts resolves each route's host and reads each host's usage once.
// wanting maps every route to its namespace. It returns the plans by host
// name and each route's host ("" when the route has no host ceiling).
func planHosts(slots HostSlots, routes []outbox.ClaimScope) (map[string]*hostPlan, []string) {
	hosts := map[string]*hostPlan{}
	routeHost := make([]string, len(routes))
	want := map[string]map[string]struct{}{} // host → namespaces with claimable routes
	for i, r := range routes {
		h, ok := slots.HostOf(r)
		if !ok {
			continue
		}
		routeHost[i] = h
		if want[h] == nil {
			want[h] = map[string]struct{}{}
		}
		want[h][r.Namespace] = struct{}{}
	}
	for name, nss := range want {
		u := slots.HostUsage(name)
		holders := len(nss)
		for ns, n := range u.ByNamespace {
			if _, wanting := nss[ns]; !wanting && n > 0 {
				holders++
			}
		}
		limit := max(u.Limit, 1)
		hosts[name] = &hostPlan{
			name:    name,
			usage:   u,
			limit:   limit,
			holders: holders,
			share:   max((limit+holders-1)/holders, 1),
			byNS:    map[string]int{},
		}
	}
	return hosts, routeHost
}
