package lease

import "github.com/fairshard/fairshard/shards"

// CoordinatorShard returns the shard whose primary coordinates namespace's
// leases: xxhash64(namespace) mod shardCount, the same function that
// places rows by dispatch_key (shards.ShardOf). A shardCount of 0 is
// treated as 1.
func CoordinatorShard(namespace string, shardCount uint32) uint32 {
	return shards.ShardOf(namespace, shardCount)
}

// CoordinatorOf returns the node that coordinates namespace: the primary of
// its CoordinatorShard under the caller's ownership view. primary looks a
// shard's primary up in that view (ok false: the shard has no live
// primary, so the namespace has no coordinator now).
func CoordinatorOf(namespace string, shardCount uint32, primary func(shard uint32) (node string, ok bool)) (string, bool) {
	return primary(CoordinatorShard(namespace, shardCount))
}
