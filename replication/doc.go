// Package replication keeps every shard on R nodes, its replica set
// (DESIGN.md "Replicated shards"): an acknowledged row survives the loss
// of up to W−1 of the nodes holding it (W the write-copies minimum), and a
// dead primary's rows are claimed by the next replica from its own copy.
//
// One Replicator per node does this node's share:
//
//   - Write path (Route, Write): an append goes to each row's primary,
//     which stores it and, at the same time, on every other member of the
//     set (insert-or-ignore); the append is answered only once every row
//     is durable on at least W members, else it fails with
//     ErrInsufficientCopies (HTTP 503, Retry-After) and nothing is
//     reported stored. If the primary cannot be reached, the next replica
//     coordinates; never a node outside the set. Forwarded rows carry
//     delays, not instants: the coordinator stamps them by its own clock.
//   - State changes (Changed): settles, retries, dead letters, cancels,
//     redrives and re-arms are shipped to the backups asynchronously, in
//     batches, with bounded queues and exported lag; claims are not
//     replicated. Backups merge with outbox.Merge (a join), so order and
//     repetition do not matter.
//   - Shard sync (sync.go): a node joining a shard's set copies it (in
//     bulk, or by key/version diff when it holds part of it) before it
//     counts as a copy and before, as primary, it claims from it. The
//     claim scope handed to Config.Scope is "primary of and synced".
//   - Repair (repair.go): primaries compare per-shard digests with their
//     backups every PollInterval and on membership changes; a persistent
//     disagreement is healed by exchanging key/version lists and merging
//     what differs, both ways.
//   - Dropping copies (drop.go): rows of shards this node no longer
//     replicates are deleted only once every member of the new set holds
//     them (and, on a rebalance, reports itself synced); Drain does the
//     same on a graceful leave. This replaces row-by-row handoff.
//
// It depends on the store contract it declares (Store, which boltstore
// and memstore implement), package transfer (the shard streams and the
// Mover's marks), and Peers, the node-to-node calls it declares, which
// HTTPPeers implements and Handler serves. It knows nothing of package
// node or of memberlist: the node turns each applied ownership view into
// a View.
package replication
