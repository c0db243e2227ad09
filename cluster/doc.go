// Package cluster owns a fairshard node's membership in its cluster:
// memberlist gossip, the shard ownership snapshot every other component
// reads, and hosting the gossiped cluster config (a kv.Store: namespace
// settings, workflow holds, delivery targets, as opaque values) over
// memberlist's delegate.
//
// # What it owns
//
//   - Membership ([New], [Cluster.Start], [Cluster.Join]): a hashicorp
//     memberlist on the gossip address, re-joining its seeds while it is
//     alone or a seed is missing. Node meta (meta.go) carries the node
//     name, its API address, the shard count, [ProtocolVersion] and its
//     state ([MemberActive] or [MemberLeaving]); a peer with another shard
//     count or protocol version is refused in both memberlist's alive and
//     merge hooks ([ErrShardCountMismatch], [ErrProtocolMismatch]), with a
//     log line and fairshard_cluster_refused_members_total, and the cluster
//     carries on.
//   - Ownership ([Cluster.Snapshot], [Cluster.Subscribe]): after every
//     membership change, shards.Assign over the active members gives a new
//     immutable, versioned [OwnershipSnapshot] (members, table, this node's
//     owned shards and OwnedShardFraction, and per shard a [ReplicaSet]:
//     [primary] today, with the epoch of its last change). Suspect members
//     keep their shards until declared dead; leaving members own none.
//   - The gossiped cluster config ([Cluster.KV], package kv): cluster
//     feeds the store its peers' broadcasts (NotifyMsg) and full states
//     (MergeRemoteState), serves its state (LocalState), queues what it
//     hands out for gossip (kvhost.go) and tells it the live members (who
//     must see a delete before its tombstone is collected). The store's
//     Persister and caps come in through [Config].KV.
//   - Joining ([Cluster.Join]): a seed that answers but whose push/pull
//     fails is told apart from one that does not answer
//     ([ErrStateExchange], transport.go), so a node never mistakes a
//     cluster it cannot sync with for an empty one.
//   - Acceptance ([Cluster.Accepted], accept.go): a node with seeds owns
//     nothing until every live peer's ownership view holds it at its own
//     address. A node restarted under its name on a new address waits
//     until the peers release the old one; a live node that already uses
//     the name refuses the newcomer for good ([ErrNameConflict],
//     [Cluster.Refused]).
//   - The advertised address ([ChooseAdvertiseIP], advertise.go) of a
//     node bound to every interface: the default route's interface.
//   - Lifecycle ([Cluster.SetLeaving], [Cluster.Leave], [Cluster.Shutdown])
//     and metrics (metrics.go) on an injected prometheus.Registerer.
//
// # What it does not own
//
// HTTP (it only carries each node's API address), rows, handoff and the
// meaning of config values: the node layer wires its store to the kv
// Persister and decodes the values. It exports no memberlist types but the
// embedded *memberlist.Config of [Config].
//
// # Lifecycle
//
//	New ──▶ Start ──▶ (active) ──SetLeaving──▶ (leaving: owns nothing, drains)
//	                                             │
//	                                           Leave ──▶ Shutdown
//
// A node that left cannot join again (memberlist#140): build a new Cluster
// with the same name and address; it rejoins and, the member set being the
// same, owns the same shards as before. Shutdown without Leave is a crash
// to the peers: they take over its shards once memberlist declares it dead.
//
// # Concurrency
//
// A [Cluster] is safe for concurrent use. memberlist calls the delegates
// (delegate.go, events.go) from its goroutines, some under its node lock,
// so they never call back into memberlist and never block: membership
// events poke a 1-buffered channel and a goroutine owned by the Cluster
// recomputes ownership; gossip is merged in memory and persisted by
// another goroutine. Snapshots are published through an atomic pointer, so
// a reader always sees a complete one. Every goroutine the Cluster starts
// is a loop of one lifecycle.Group (kv persistence, kv collection,
// recompute, memberlist, join, in that order); Shutdown stops them in
// reverse and waits for each.
package cluster
