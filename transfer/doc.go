// Package transfer moves and copies the rows of shards between stores:
// from a [Source] (the node holding them) to a [Sink] (another node's
// store, usually behind an HTTP call the node package provides), in
// batches bounded in rows AND bytes.
//
// Two kinds of stream share one shape:
//
//   - A move ([Mover.Move]: handoff of shards this node no longer owns,
//     and the drain of a leaving node) reads pages of transferable rows
//     with outbox.ShardRead.Mark, which marks them in-transfer in the
//     source's transaction (not claimable), sends them, and deletes them
//     at the source only after the sink has made them durable
//     (CompleteTransfer), or unmarks them when the send failed
//     (AbortTransfer). The sink merges copies by outbox.Merge, so a batch
//     sent twice (an ack lost after the sink committed) is harmless.
//   - A copy ([Copy]: a replica's bulk shard sync) reads pages without
//     marks and deletes nothing; the source keeps serving the shard.
//
// Both resume: a page carries a resume token (outbox.ShardPage.Next), and a
// stream that broke continues after the last page the sink acknowledged,
// not from the start (Copy returns the token; a Mover keeps one per shard
// across calls).
//
// Marks are always cleared or retried. A failed CompleteTransfer or
// AbortTransfer is retried with backoff at once; if it still fails, the
// keys are kept as stranded and retried before anything else by the next
// Move (which starts no new batch while any are left) or by [Mover.Flush].
// Until then the rows stay marked: not claimable, but counted (the store's
// ForeignShards still lists their shard, [Mover.Stranded] and the
// fairshard_transfer_stranded_rows gauge count them). A crash leaves marks
// on disk; the store clears them when it opens, and the rows are sent
// again.
//
// Commits: a Source that also implements [ShardsReader] (boltstore and
// memstore do) marks every shard of a batch in one call, so a batch costs
// one commit to mark and one to delete at the source, however many shards
// it spans.
//
// Batch bounds: a batch holds at most Limits.MaxRows rows and at most
// Limits.MaxBytes bytes (as outbox.RowBytes counts them) plus one row: a
// page always holds at least one row, so a single row larger than the
// budget still moves, alone or last in its batch.
//
// The wire: EncodeBatch and DecodeBatch are a batch's binary encoding
// (ContentType), a copy of the fields with no base64 or escaping.
//
// What it does not own: which shards to move and where to (the node asks
// its ownership view), the transport (the node's Sink is an HTTP client;
// the receiving handler decodes the batch and calls the local store's
// Merge), and the store's transactions (boltstore and memstore implement
// Source and Sink).
package transfer
