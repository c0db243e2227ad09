package replication

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/transfer"
)

// Local is what replication needs from the node's local store
// (boltstore.Store and memstore.Store implement it): appends and merges of
// copies, reads by key and by shard page, the marks of a move (for
// dropping a copy the node no longer replicates) and the per-shard
// digests maintained in every write transaction.
type Local interface {
	// Append stores new rows (insert or ignore by dispatch_key), durably.
	Append(ctx context.Context, rows []outbox.Row) ([]outbox.AppendOutcome, error)
	// Get returns a row, live or tombstone, or an error wrapping
	// outbox.ErrNotFound.
	Get(ctx context.Context, dispatchKey string) (outbox.Row, error)
	// Merge merges copies of rows by outbox.Merge, durably.
	Merge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error)
	// ReadShard reads a page of a shard (outbox.ShardRead): a copy, or a
	// marking read for a move.
	ReadShard(ctx context.Context, p outbox.ShardRead) (outbox.ShardPage, error)
	// CompleteTransfer deletes rows still marked; AbortTransfer unmarks
	// them (see transfer.Source).
	CompleteTransfer(ctx context.Context, keys []string) (int, error)
	AbortTransfer(ctx context.Context, keys []string) (int, error)
	// ForeignShards lists the shards outside the claim scope holding
	// pending or terminal rows here (claimed rows finish first).
	ForeignShards(ctx context.Context) ([]uint32, error)
	// ShardDigest and ShardDigests return per-shard digests
	// (outbox.ShardDigest); ShardDigests lists only shards holding rows.
	ShardDigest(ctx context.Context, shard uint32) (outbox.ShardDigest, error)
	ShardDigests(ctx context.Context) ([]outbox.ShardDigest, error)
	// ClaimedByShard counts claimed rows held here per shard, owned or
	// not (shards with none are absent): what a new primary waits for
	// before it claims (handover.go). The count must include every claim
	// begun before the call, even one whose transaction read an older
	// claim scope and has not committed yet (boltstore waits for the
	// write in progress; memstore claims under the lock it reads with).
	ClaimedByShard(ctx context.Context) (map[uint32]int64, error)
}

// Gate admits requests that store rows on this node; a leaving node
// closes it so that what it holds cannot grow while it drains. Enter
// returns false once closed; every true is paired with Exit.
type Gate interface {
	Enter() bool
	Exit()
}

// Defaults of Config.
const (
	// DefaultShipInterval is how long a state change may wait to be
	// batched with others before it is shipped to the backups.
	DefaultShipInterval = 5 * time.Millisecond
	// DefaultShipBatch is the most rows per shipped batch.
	DefaultShipBatch = 1000
	// DefaultMaxPending is the most state changes queued for one backup;
	// past it the queue is dropped and that backup's shards are repaired
	// by digest comparison instead (the queue's memory stays bounded);
	// until a shard is repaired, States reports it Unshipped, so no
	// handover releases it on the strength of the dropped queue.
	DefaultMaxPending = 200_000
	// DefaultPollInterval is how often a primary compares its shards'
	// digests and sync states with its backups'.
	DefaultPollInterval = 2 * time.Second
	// DefaultSyncRetry is how long a shard sync that failed waits before
	// it is tried again (it is also tried on every membership change).
	DefaultSyncRetry = 500 * time.Millisecond
	// DefaultSyncConcurrency is how many shards sync at once.
	DefaultSyncConcurrency = 8
	// DefaultLeftoverInterval is how often copies of shards this node no
	// longer replicates are checked and dropped (they are also checked on
	// every ownership change).
	DefaultLeftoverInterval = 5 * time.Second
	// DefaultHandoverTimeout is the longest a new primary waits, before it
	// claims from a shard, for the other live members to finish the
	// deliveries they claimed of it and ship their settles (handover.go).
	DefaultHandoverTimeout = 30 * time.Second
	// DefaultFailoverGrace is how long a member that became a shard's
	// primary because the old primary vanished from the view (declared
	// dead, not drained) waits before it claims from the shard: a member
	// declared dead by mistake (a peer cut off for a moment suspected it,
	// a stalled process) is still claiming, and its refute, one gossip
	// round or two away, hands the shard back before anyone claims twice.
	// A failover thus costs its shards this much delivery time.
	DefaultFailoverGrace = time.Second
	// DefaultHandoverInterval is how often a waiting new primary asks.
	DefaultHandoverInterval = 100 * time.Millisecond
	// DefaultCallTimeout bounds one call to a peer.
	DefaultCallTimeout = 30 * time.Second
	// DefaultShipTimeout bounds one batch of shipped state changes (at most
	// ShipBatch rows and Limits.MaxBytes): a batch lost with its connection
	// (packet loss, a peer that went away) is retried after it, not after
	// CallTimeout, so the settles behind it are not held back that long.
	DefaultShipTimeout = 5 * time.Second
	// DefaultWriteTimeout bounds the fan-out of one append to the backups.
	DefaultWriteTimeout = 10 * time.Second
	// DefaultFailedPeerWait is how long a leaving node that sees no other
	// member to hand its rows to waits for a member that failed (rather
	// than left) to return before it stops as the last node: memberlist's
	// LAN GossipToTheDeadTime, the time a member declared dead is still
	// told so and can refute it.
	DefaultFailedPeerWait = 30 * time.Second
	// MaxFactor is the largest replication factor.
	MaxFactor = 5
	// MaxBatchBytes is the largest Limits.MaxBytes: a batch then holds at
	// most this many row bytes plus one row, which fits the receiving
	// route's body limit (MaxBodyBytes) as JSON (base64 payloads grow by a
	// third).
	MaxBatchBytes = 32 << 20
)

// Config configures a Replicator.
type Config struct {
	// Self is this node's name.
	Self string
	// ShardCount is the cluster's shard count.
	ShardCount uint32
	// Local is the node's local store (required). Replication reads and
	// writes it directly; everything else reaches it through Store, which
	// ships what changes.
	Local Local
	// Peers reaches the other members (required).
	Peers Peers
	// Seeded is true when the node was started with seeds to join: it is
	// meant to run in a multi-member cluster, so the automatic write-copies
	// minimum is 2 (with R ≥ 2) even while it sees no other member.
	Seeded bool
	// Scope receives the claim scope whenever it changes: the shards this
	// node is primary of and holds a synced copy of, ascending (required).
	Scope func(owned []uint32)
	// Wake, when set, is called after rows were stored here by a write or
	// a merge (the dispatcher may have new work).
	Wake func()
	// Tunables are the write-copies minimum, batch limits, intervals and
	// timeouts (their own type so node configuration embeds them with
	// their flags).
	Tunables

	// Now is the clock (default time.Now): stamps forwarded rows.
	Now func() time.Time
	// Logger receives sync, repair and drop events (default: discard).
	Logger *slog.Logger
	// Registerer, when set, receives the replication metrics (and those of
	// the transfer.Mover that drops copies).
	Registerer prometheus.Registerer
}

// Tunables are the replicator's settings. A zero field means "use the
// default" (the Default* constants above; Limits: transfer's); a negative
// one is refused. RegisterFlags exposes the operator-facing ones as the
// node's flags.
type Tunables struct {
	// WriteCopies is the write-copies minimum: an append is answered only
	// once every row is durable on that many members of its replica set.
	// 0 means automatic: 2 when R ≥ 2 and the node is, or was, part of a
	// multi-member cluster (Seeded, or it has seen another member), else
	// 1, so a one-node cluster works. An explicit value is capped by R.
	WriteCopies int
	// Limits bound sync pages and shipped and moved batches (rows and
	// bytes; transfer defaults). MaxBytes is at most MaxBatchBytes.
	Limits transfer.Limits
	// ShipInterval, ShipBatch, MaxPending, PollInterval, SyncRetry,
	// SyncConcurrency, LeftoverInterval, CallTimeout and WriteTimeout: see
	// the defaults above.
	ShipInterval     time.Duration
	ShipBatch        int
	MaxPending       int
	PollInterval     time.Duration
	SyncRetry        time.Duration
	SyncConcurrency  int
	LeftoverInterval time.Duration
	CallTimeout      time.Duration
	// ShipTimeout bounds one shipped batch (DefaultShipTimeout).
	ShipTimeout  time.Duration
	WriteTimeout time.Duration
	// HandoverTimeout and HandoverInterval: see the defaults above. Set
	// the timeout to at least the delivery timeout, or a slow delivery of
	// the old primary may be repeated by the new one.
	HandoverTimeout  time.Duration
	HandoverInterval time.Duration
	// FailoverGrace: see DefaultFailoverGrace.
	FailoverGrace time.Duration
	// FailedPeerWait: see DefaultFailedPeerWait (View.PeerFailedAt). The
	// node sets it to its gossip's GossipToTheDeadTime, at least 5 s.
	FailedPeerWait time.Duration
}

// RegisterFlags registers the operator-facing tunables on fs as the node's
// flags (their names, defaults and help are the node's), writing into t.
// The other tunables are left as they are (zero: Validate fills their
// defaults).
func (t *Tunables) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&t.WriteCopies, "write-copies", 0, "replicas every appended row must be durable on before the append is answered (else 503); 0: 2 when R >= 2 in a multi-node cluster, else 1")
	fs.DurationVar(&t.PollInterval, "repair-interval", DefaultPollInterval, "how often primaries compare shard digests with their backups (repair)")
	fs.DurationVar(&t.LeftoverInterval, "handoff-interval", DefaultLeftoverInterval, "period of the pass that hands copies of shards no longer replicated here to their replica sets (it also runs on every ownership change)")
	fs.IntVar(&t.Limits.MaxRows, "handoff-batch", transfer.DefaultMaxRows, "most rows per handoff call")
	fs.IntVar(&t.Limits.MaxBytes, "handoff-batch-bytes", transfer.DefaultMaxBytes, "byte budget of one handoff call (payloads and fields; one larger row still moves alone)")
}

// Validate fills the zero tunables with their defaults, then checks them.
// The errors (joined) name a field by its flag where it has one
// ("--repair-interval: must be positive, got -1s"), else by its name, the
// flags first in the order RegisterFlags registers them. The filled
// defaults stay in t, so a second call checks the same values. New calls
// it; the node calls it at start-up on the values its flags gave.
func (t *Tunables) Validate() error {
	var errs []error
	bad := func(name, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", name, fmt.Sprintf(format, args...)))
	}
	duration := func(name string, d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
		if *d < 0 {
			bad(name, "must be positive, got %v", *d)
		}
	}
	count := func(name string, n *int, def, most int) {
		if *n == 0 {
			*n = def
		}
		switch {
		case *n < 0:
			bad(name, "must be at least 1, got %d", *n)
		case *n > most:
			bad(name, "%d is not between 1 and %d", *n, most)
		}
	}
	if t.WriteCopies < 0 || t.WriteCopies > MaxFactor {
		bad("--write-copies", "%d is not between 0 (automatic) and %d", t.WriteCopies, MaxFactor)
	}
	duration("--repair-interval", &t.PollInterval, DefaultPollInterval)
	duration("--handoff-interval", &t.LeftoverInterval, DefaultLeftoverInterval)
	count("--handoff-batch", &t.Limits.MaxRows, transfer.DefaultMaxRows, math.MaxInt)
	count("--handoff-batch-bytes", &t.Limits.MaxBytes, transfer.DefaultMaxBytes, MaxBatchBytes)
	duration("ShipInterval", &t.ShipInterval, DefaultShipInterval)
	duration("SyncRetry", &t.SyncRetry, DefaultSyncRetry)
	duration("CallTimeout", &t.CallTimeout, DefaultCallTimeout)
	duration("ShipTimeout", &t.ShipTimeout, DefaultShipTimeout)
	duration("WriteTimeout", &t.WriteTimeout, DefaultWriteTimeout)
	duration("HandoverTimeout", &t.HandoverTimeout, DefaultHandoverTimeout)
	duration("HandoverInterval", &t.HandoverInterval, DefaultHandoverInterval)
	duration("FailoverGrace", &t.FailoverGrace, DefaultFailoverGrace)
	duration("FailedPeerWait", &t.FailedPeerWait, DefaultFailedPeerWait)
	count("ShipBatch", &t.ShipBatch, DefaultShipBatch, math.MaxInt)
	count("MaxPending", &t.MaxPending, DefaultMaxPending, math.MaxInt)
	count("SyncConcurrency", &t.SyncConcurrency, DefaultSyncConcurrency, math.MaxInt)
	return errors.Join(errs...)
}

// validate checks the dependencies and the tunables (Tunables.Validate,
// which fills their defaults) and fills the clock and the logger.
func (c *Config) validate() error {
	var errs []error
	if c.Self == "" {
		errs = append(errs, errors.New("Self is empty"))
	}
	if c.ShardCount == 0 {
		errs = append(errs, errors.New("ShardCount is 0"))
	}
	if c.Local == nil {
		errs = append(errs, errors.New("Local is nil"))
	}
	if c.Peers == nil {
		errs = append(errs, errors.New("Peers is nil"))
	}
	if c.Scope == nil {
		errs = append(errs, errors.New("Scope is nil"))
	}
	if err := c.Tunables.Validate(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("replication: config: %w", errors.Join(errs...))
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}
