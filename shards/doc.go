// Package shards holds fairshard's pure shard math: the shard function, the
// shard → owner table, every shard's replica set and a node's
// OwnedShardFraction. It imports only xxhash; everything here is a
// deterministic function of its arguments, so every node computes the same
// answers from the same inputs.
package shards
