package backpressure

// HostAllowance applies a sweep's host rule (hostPlan;
// docs/adr/0015-host-slots-bound-claims.md) to one namespace outside a
// sweep, for a row's explanation ("why is this row waiting?"): given the
// host's usage and the namespaces with claimable routes to it (wanting;
// ns is counted whether listed or not), it returns what ns may claim on
// the host now in the utilisation pass (max of its guaranteed share and
// the free slots, rows, ≥ 0), its guaranteed share (rows) and how many
// namespaces share the host. A sweep that started now would compute the
// same numbers from the same inputs.
func HostAllowance(u HostUsage, ns string, wanting []string) (allowance, share, holders int) {
	nss := map[string]struct{}{ns: {}}
	for _, w := range wanting {
		nss[w] = struct{}{}
	}
	holders = len(nss)
	for other, n := range u.ByNamespace {
		if _, in := nss[other]; !in && n > 0 {
			holders++
		}
	}
	limit := max(u.Limit, 1)
	h := &hostPlan{usage: u, limit: limit, holders: holders, share: max((limit+holders-1)/holders, 1), byNS: map[string]int{}}
	return h.allowance(ns, true), h.share, holders
}
