package shards

// OwnedShardFraction is this node's share of the cluster's shard space,
// owned/total, always in (0, 1]. It turns a namespace's cluster-wide quota
// into this node's per-node ceiling (seed §3.6). The zero value is not
// meaningful: build one with NewOwnedShardFraction or OwnAll. Values are
// immutable and safe to copy.
type OwnedShardFraction struct {
	owned uint32
	total uint32
}

// NewOwnedShardFraction builds a fraction from this node's owned-shard count
// and the cluster shard count. total is clamped to ≥ 1 (the keyspace always
// has a shard) and owned to [1, total], so the fraction is in (0, 1] and a
// per-node ceiling never exceeds the quota. Note the lower clamp: a node that
// owns no shard still reports 1/total; it has no rows to claim anyway,
// because a store only claims rows of owned shards.
func NewOwnedShardFraction(owned, total uint32) OwnedShardFraction {
	total = max(total, 1)
	owned = min(max(owned, 1), total)
	return OwnedShardFraction{owned: owned, total: total}
}

// OwnAll is the whole keyspace on one node (fraction 1): every per-node
// ceiling equals the full quota. It is the single-node default.
func OwnAll() OwnedShardFraction { return OwnedShardFraction{owned: 1, total: 1} }

// Owned returns the (clamped) owned-shard count.
func (f OwnedShardFraction) Owned() uint32 { return max(f.owned, 1) }

// Total returns the (clamped) cluster shard count.
func (f OwnedShardFraction) Total() uint32 { return max(f.total, 1) }

// Float returns owned/total in (0, 1], for metrics and display.
func (f OwnedShardFraction) Float() float64 {
	return float64(f.Owned()) / float64(f.Total())
}

// PerNodeCeiling returns ceil(quota × owned / total): this node's slice of
// a namespace's cluster-wide quota (rows). Seed §3.6: rounded up so the
// per-node ceilings of a partition sum to ≥ quota (over-admit by at most
// N−1 across N nodes rather than starve). Computed in uint64, so it cannot
// overflow; the result never exceeds quota.
func (f OwnedShardFraction) PerNodeCeiling(quota uint32) uint32 {
	owned, total := uint64(f.Owned()), uint64(f.Total())
	c := (uint64(quota)*owned + total - 1) / total
	if c > uint64(quota) { // unreachable with owned ≤ total; kept as a guard
		return quota
	}
	return uint32(c)
}
