// Package quota is the one home of per-node ceilings: how many rows of a
// namespace this node may hold claimed at once.
//
// A namespace's policy (its cluster-wide quota max_in_flight, whether it is
// paused, and its quota mode) comes from the cluster config through a
// SettingsSource and is cached by Policies. A Source turns the policy into
// this node's Ceiling:
//
//   - Proportional is the seed's rule (DESIGN.md, seed/backpressure.rs):
//     ceil(quota × owned/total) from the node's live OwnedShardFraction. No
//     coordination, so the cluster may run up to quota + N − 1 rows at once
//     and a node's unused share is not available to the others; it keeps
//     working through any partition. Mode "proportional".
//   - Leased is the exact rule (DESIGN.md "Exact cluster-wide quota"): the
//     node's unexpired capacity lease for the namespace, granted by the
//     namespace's coordinator (package lease), capped at the quota. No
//     unexpired lease means 0. Mode "exact", the default.
//   - ByMode routes each namespace to one of the two by its mode.
//
// Every source answers 0 for a paused namespace, so no caller re-derives
// "paused means 0". A ceiling never takes back claimed rows: headroom is
// Ceiling.Headroom(claimed) = max(ceiling − claimed, 0), so a ceiling
// below the claimed count only stops new claims (DESIGN.md rule 1,
// CLAIMED-only headroom).
//
// The package imports only shards; the lease client satisfies Grants
// without this package importing lease, so the planner in backpressure can
// consume a Source while lease uses backpressure's FairShare.
package quota
