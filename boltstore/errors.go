package boltstore

import (
	"errors"

	"github.com/fairshard/fairshard/outbox"
)

// Sentinel errors returned by boltstore, besides the outbox ones
// (outbox.ErrClosed, outbox.ErrInvalidRow, outbox.ErrNotFound). Callers test
// them with errors.Is; the store wraps them with the path, key or shard
// involved.
var (
	// ErrLocked is returned by Open when another process (or another Store in
	// this process) holds the data file's lock for longer than
	// Options.LockTimeout.
	ErrLocked = errors.New("boltstore: data dir is in use by another process")
	// ErrCorrupt is returned by Open and Check when the file is not a valid
	// bbolt file, is truncated, has a bad page, or its indexes and counters
	// disagree with its rows. It is also returned by any call that hit a bbolt
	// panic on a bad page; the store then refuses further writes.
	ErrCorrupt = errors.New("boltstore: data file is corrupt")
	// ErrNotWritable is returned (wrapped, with the cause) by every write
	// after a commit failed (a write or fsync error, a full disk): the
	// kernel may have dropped the pages a failed fsync did not write
	// (PostgreSQL's "fsyncgate"), so what the process believes is on disk
	// may not be, and writing on could build on data that is gone. The
	// store refuses writes until it has reopened the data file, which
	// re-reads what is really on disk; see Store.Writable. Reads go on.
	ErrNotWritable = errors.New("boltstore: the store cannot write (a commit failed; the data file is reopened to recover)")
	// ErrShardCountMismatch is returned by Open when the file was created
	// with a different shard_count than Options.ShardCount. shard_count is
	// fixed for a cluster's lifetime: every stored row's shard depends on it.
	ErrShardCountMismatch = errors.New("boltstore: shard_count differs from the data file's")
	// ErrInvalidOptions is returned by Open for unusable Options (ShardCount
	// 0, negative durations).
	ErrInvalidOptions = errors.New("boltstore: invalid options")
)

// ErrShardOwned is returned by a marking ReadShard of a shard this node
// owns (or one outside [0, ShardCount)): only rows of non-owned shards are
// handed off. It is outbox.ErrShardOwned.
var ErrShardOwned = outbox.ErrShardOwned
