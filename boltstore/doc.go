// Package boltstore is fairshard's durable local outbox: one bbolt file per
// node holding its outbox rows, the tombstones that make appends idempotent,
// and the cluster config entries the node has learned. It implements
// [outbox.Store] (and passes outboxtest.RunStoreSuite) plus the handoff,
// admin and maintenance calls the node needs.
//
// # What it owns
//
//   - Durability: every mutation returns only after the bbolt transaction
//     holding it has been fsync'd. bbolt runs with NoFreelistSync and the map
//     freelist (cheap commits on a fragmented file, as etcd does), never with
//     NoSync.
//   - Group commit: all mutations (append, claim, settle, re-arm, merge,
//     transfer marks, tombstone expiry, config writes, Check) go through one
//     writer goroutine that coalesces whatever is queued, up to
//     Options.MaxBatchRows rows, into one write transaction, so throughput
//     rises with concurrency instead of being capped at one fsync per call.
//     Ops are isolated: if one op of a batch fails, the transaction is rolled
//     back and retried without it. Input is validated before it is queued.
//     While callers keep arriving the writer lingers up to 0.5 ms so that
//     concurrent callers share commits instead of alternating.
//     [Store.ClaimBatch] runs a whole planner sweep's claims in one commit.
//   - Indexes and counters kept in the same transaction as the row change, so
//     no hot-path call scans the table (layout in codec.go): a pending index
//     per route ordered by (VisibleAfter, dispatch_key), a claimed index
//     ordered by ClaimedAt, tombstone and dead-letter indexes ordered by
//     FinishedAt, a dead-letter index per namespace, a shard-membership index
//     (byshard, in 16 shard groups ordered by CreatedAt), and per-namespace,
//     per-(namespace, shard), per-shard and per-route counters. Rows are keyed
//     by dispatch_key, so Get is one lookup and keys a producer writes
//     together share B+tree pages (every page a commit rewrites costs fsync
//     time). [Store.Check] recounts everything.
//   - Owned-shard scoping: [Store.SetOwnedShards] swaps an immutable owned
//     set; claims, CountClaimed*, CountInFlight and PendingRoutes see owned
//     shards only; Append, Get and the admin calls see every row.
//   - Shard-level calls for package transfer and the coming replica
//     repair: [Store.ForeignShards], [Store.ReadShard] (pages bounded by
//     rows and bytes from a resume token; marking rows in-transfer for a
//     move), [Store.CompleteTransfer], [Store.AbortTransfer],
//     [Store.MarkedRows], [Store.Merge] (incoming copies, by outbox.Merge)
//     and [Store.ShardDigest] (count and order-independent hash of key and
//     version per shard, maintained in every write transaction);
//     in-transfer marks are cleared on Open.
//   - Tombstone retention: done/cancelled rows are kept
//     Options.TombstoneRetention (default 24 h) after FinishedAt, slim
//     (outbox.Slim: no payload; the row is deleted and put again so bbolt
//     rebalances its leaf and the payload's pages are reused), then
//     packed within a second into per-shard bundles of ~20-byte records
//     ([Store.PackTombstones], bundle.go: lossless, read as rows by every
//     call); failed rows
//     (dead letters, payload kept) Options.DeadLetterRetention (default 7
//     days, never less than the tombstone retention).
//     [Store.RunTombstoneGC] sweeps them in transactions of at most
//     [GCBatchRows] rows. [Store.ListDeadLetterPage] pages dead letters by
//     rows and bytes, with or without payloads. [Compact] gives a stopped
//     node's freed space back (bbolt never shrinks a file).
//   - Write failures: a commit that fails (write or fsync error, full disk)
//     stops every write ([ErrNotWritable], [Store.Writable]) until the
//     writer has reopened the file from disk and a probe commit succeeded;
//     a failed fsync is never retried on the same handle.
//   - Safety: Open waits at most Options.LockTimeout for the file lock
//     ([ErrLocked]); a truncated or corrupt file is reported as [ErrCorrupt]
//     and bbolt panics on bad pages are contained (Open first checks the
//     file size against its meta page and walks every page through a
//     read-only handle, because bbolt's own start-up walk runs on a goroutine
//     where a panic cannot be recovered).
//
// # Claimed counts and ownership changes
//
// CountClaimed and CountClaimedByNamespace count claimed rows of owned
// shards only, as the outbox.Store contract says: after an ownership change,
// claimed rows of a shard just lost (still being delivered here) stop
// counting against this node's per-node ceiling, and the new owner's ceiling
// does not see them either, so for at most one delivery timeout the
// namespace may over-admit by those rows. Counting every claimed row held
// locally would be the conservative choice; the per-(namespace, shard)
// counters make either answer a counter read, and [Store.CountClaimedHeld]
// gives the conservative number for a caller that wants it.
//
// # What it does not own
//
// Which shards this node owns (package cluster decides and calls
// SetOwnedShards), the fair claim planner (package backpressure), delivery
// and retry policy (the dispatcher decides attempts, backoff and visibility
// timeouts and passes instants in), moving rows between nodes (the handoff
// loop calls the primitives here), HTTP.
//
// # Concurrency
//
// A [Store] is safe for concurrent use. Mutations are serialised through the
// writer goroutine; reads run in short bbolt read transactions on the
// caller's goroutine, never across I/O, and never see a half-applied batch.
// Rows returned are the caller's copies. Close stops the writer and waits
// for it.
package boltstore
