package outbox

import (
	"encoding/binary"
	"errors"

	"github.com/cespare/xxhash/v2"
)

// The shapes below are how a store exposes one shard's rows to whatever
// moves or compares them between nodes (package transfer, the coming
// replica repair). They live here, beside Row, so stores implement the
// consumers' interfaces without importing them.

// ErrShardOwned is returned (wrapped) by a marking ShardRead of a shard
// this node owns, or of one outside [0, shard_count): rows of an owned
// shard are claimed here, not handed off.
var ErrShardOwned = errors.New("outbox: shard is owned by this node")

// ErrInvalidToken is returned (wrapped) by a ShardRead whose After is not a
// resume token of that shard from this store.
var ErrInvalidToken = errors.New("outbox: invalid resume token")

// ShardRead asks a store for the next page of one shard's rows.
type ShardRead struct {
	// Shard is the shard to read.
	Shard uint32
	// After is the resume token: the page starts after it. nil starts at
	// the shard's first row. Tokens are opaque, store-specific, and stay
	// valid across restarts of the same store (the order is the store's:
	// CreatedAt, then dispatch_key, for memstore; boltstore reads its
	// packed done and cancelled rows after the others, by dispatch_key).
	After []byte
	// MaxRows bounds the page's rows; ≤ 0 reads nothing.
	MaxRows int
	// MaxBytes bounds the page's size as RowBytes counts it. A page holds
	// at least one row when one remains, even a row larger than MaxBytes;
	// after the first, rows are added while the total stays ≤ MaxBytes.
	// ≤ 0 means no byte bound.
	MaxBytes int
	// Mark makes the read a move: only transferable rows are returned
	// (pending and terminal rows not already marked; claimed rows finish
	// here first), and they are marked in-transfer in the same transaction:
	// not claimable, not returned by another marking read, until
	// CompleteTransfer deletes or AbortTransfer unmarks them. Any change to
	// a marked row clears its mark. Marking a shard this node owns fails
	// with ErrShardOwned. Without Mark the read is a copy: every row is
	// returned as it is (claimed ones included) and nothing is written.
	Mark bool
}

// ShardPage is one page of a ShardRead.
type ShardPage struct {
	// Rows are the page's rows in the store's order (see After); the
	// caller's copies.
	Rows []Row
	// Next is the resume token after the last row examined (rows skipped
	// by a marking read included): pass it as After to continue. It equals
	// the request's After when nothing was examined.
	Next []byte
	// Done reports that the read reached the end of the shard: no row sorts
	// after Next (when the read ran).
	Done bool
}

// MergeResult counts what a store did with a batch of incoming copies.
type MergeResult struct {
	// Created rows were absent here.
	Created int `json:"created"`
	// Updated rows changed (the incoming copy was newer, or brought an
	// earlier CreatedAt).
	Updated int `json:"updated"`
	// Skipped rows were already as new here (a resend, a stale copy).
	Skipped int `json:"skipped"`
}

// RowBytes is the size a row counts for in byte-bounded batches
// (ShardRead.MaxBytes, transfer batches): its variable-length fields plus
// a fixed 96 bytes for the rest. It is close to the row's encoded size on
// disk and below its JSON size (which base64-encodes the payload).
func RowBytes(r *Row) int {
	return 96 + len(r.DispatchKey) + len(r.WorkflowID) + len(r.Namespace) + len(r.TaskQueue) +
		len(r.ActivityType) + len(r.ContentType) + len(r.LastError) + len(r.Payload)
}

// ShardDigest summarises the rows of one shard a store holds so that two
// replicas can tell cheaply whether they agree: Rows counts them, Sum adds
// (mod 2⁶⁴) DigestOf over them, which makes it independent of order and
// updatable one row at a time (add the new state's DigestOf, subtract the
// old one's). Stores maintain it in the transaction of every change.
type ShardDigest struct {
	Shard uint32 `json:"shard"`
	Rows  int64  `json:"rows"`
	Sum   uint64 `json:"sum"`
}

// Add counts r into d.
func (d *ShardDigest) Add(r *Row) { d.Rows++; d.Sum += DigestOf(r) }

// Remove takes r out of d.
func (d *ShardDigest) Remove(r *Row) { d.Rows--; d.Sum -= DigestOf(r) }

// DigestOf is one row's contribution to its shard's digest: XXH64 of its
// dispatch_key, Version and replicated status class. Claimed and pending
// rows hash alike (claims are local to the delivering node, so a primary
// and its replicas agree while a row is in flight); each terminal status
// hashes apart, so two copies finished differently disagree.
func DigestOf(r *Row) uint64 {
	var buf [64]byte
	b := append(buf[:0], r.DispatchKey...)
	b = append(b, 0)
	b = binary.BigEndian.AppendUint32(b, r.Version.Gen)
	b = binary.BigEndian.AppendUint64(b, r.Version.Seq)
	b = append(b, digestClass(r.Status))
	return xxhash.Sum64(b)
}

func digestClass(s Status) byte {
	switch s {
	case StatusDone:
		return 3
	case StatusFailed:
		return 4
	case StatusCancelled:
		return 5
	}
	return 1 // pending, claimed
}
