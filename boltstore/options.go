package boltstore

import (
	"cmp"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Defaults applied by Open to zero-valued Options fields.
const (
	// LockTimeoutDefault is how long Open waits for the file lock: 1 s.
	LockTimeoutDefault = time.Second
	// TombstoneRetentionDefault is how long done and cancelled rows keep
	// their dispatch_key (the dedupe window, DESIGN.md): 24 h.
	TombstoneRetentionDefault = 24 * time.Hour
	// DeadLetterRetentionDefault is how long failed rows (dead letters) are
	// kept for inspection and redrive before the tombstone sweep removes
	// them: 7 days.
	DeadLetterRetentionDefault = 7 * 24 * time.Hour
	// MaxBatchRowsDefault bounds the rows one group commit touches (the sum
	// of the rows of the operations it coalesces): 4096 rows.
	MaxBatchRowsDefault = 4096
	// GCBatchRows is the most tombstones one sweep transaction deletes, so a
	// large expiry never holds the writer for long: 1000 rows.
	GCBatchRows = 1000
	// RecoverIntervalDefault is how long the store waits after a failed
	// commit before it first tries to reopen the data file: 1 s. Each
	// failed reopen doubles the wait, up to RecoverIntervalMax.
	RecoverIntervalDefault = time.Second
	// RecoverIntervalMax bounds the wait between two reopen attempts: 30 s.
	RecoverIntervalMax = 30 * time.Second
	// PackIntervalDefault is how often RunTombstoneGC packs finished rows
	// into bundles (Store.PackTombstones): 1 s, so the space of a burst of
	// finished rows is reusable by the next burst of appends.
	PackIntervalDefault = time.Second
)

// Input limits, checked before anything is written (outbox.ErrInvalidRow).
// bbolt refuses keys above 32 KiB; these keep every index key well below.
const (
	// MaxDispatchKeyBytes is the longest dispatch_key accepted: 4096 bytes.
	MaxDispatchKeyBytes = 4096
	// MaxNameBytes is the longest namespace or task_queue accepted: 1024 bytes.
	MaxNameBytes = 1024
)

// Options configure Open. Zero values mean "use the default", as each field
// says.
type Options struct {
	// ShardCount is the cluster's fixed shard_count (required, > 0). It is
	// written into a new file; reopening with another value fails with
	// ErrShardCountMismatch.
	ShardCount uint32
	// LockTimeout is how long Open waits for the data file's lock before
	// failing with ErrLocked. Defaults to 1 s. bbolt itself would wait
	// forever.
	LockTimeout time.Duration
	// TombstoneRetention is how long done and cancelled rows are kept after
	// FinishedAt so a late duplicate Append reports duplicate. Defaults to
	// 24 h.
	TombstoneRetention time.Duration
	// PackInterval is how often RunTombstoneGC packs done and cancelled
	// rows into bundles (Store.PackTombstones). Defaults to 1 s.
	PackInterval time.Duration
	// DeadLetterRetention is how long failed rows are kept after FinishedAt
	// (they also dedupe appends meanwhile). Defaults to 7 days; it is raised
	// to TombstoneRetention if shorter, so a dead letter dedupes at least as
	// long as a tombstone.
	DeadLetterRetention time.Duration
	// MaxBatchRows bounds the rows one group commit coalesces. Defaults to
	// 4096 rows. A single operation larger than this still runs, alone.
	MaxBatchRows int
	// SkipOpenCheck skips bbolt's page-level consistency check in Open (it
	// reads every page: about 1 s per few hundred MB). Leave it false unless
	// start-up time matters more than finding a corrupt file early; bad pages
	// met later are still contained and reported as ErrCorrupt.
	SkipOpenCheck bool
	// RecoverInterval is the first wait, after a commit or fsync failed,
	// before the store reopens the data file to recover (see
	// Store.Writable); it doubles after each failed attempt up to
	// RecoverIntervalMax (or RecoverInterval, if larger). Defaults to 1 s.
	RecoverInterval time.Duration
	// Now is the store's clock: Append's default CreatedAt, Merge's default
	// FinishedAt and the tombstone sweep's cut-off. Defaults to time.Now.
	// Tests inject a fake clock here.
	Now func() time.Time
	// Logger receives structured logs; nil discards them.
	Logger *slog.Logger
	// Registerer receives the store's metrics; nil registers nothing.
	Registerer prometheus.Registerer
}

func (o Options) withDefaults() Options {
	o.LockTimeout = cmp.Or(o.LockTimeout, LockTimeoutDefault)
	o.TombstoneRetention = cmp.Or(o.TombstoneRetention, TombstoneRetentionDefault)
	o.DeadLetterRetention = cmp.Or(o.DeadLetterRetention, DeadLetterRetentionDefault)
	if o.DeadLetterRetention >= 0 && o.DeadLetterRetention < o.TombstoneRetention {
		o.DeadLetterRetention = o.TombstoneRetention
	}
	o.MaxBatchRows = cmp.Or(o.MaxBatchRows, MaxBatchRowsDefault)
	o.RecoverInterval = cmp.Or(o.RecoverInterval, RecoverIntervalDefault)
	o.PackInterval = cmp.Or(o.PackInterval, PackIntervalDefault)
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o
}

func (o Options) validate() error {
	switch {
	case o.ShardCount == 0:
		return fmt.Errorf("%w: ShardCount must be > 0", ErrInvalidOptions)
	case o.LockTimeout < 0:
		return fmt.Errorf("%w: LockTimeout %s is negative", ErrInvalidOptions, o.LockTimeout)
	case o.TombstoneRetention < 0:
		return fmt.Errorf("%w: TombstoneRetention %s is negative", ErrInvalidOptions, o.TombstoneRetention)
	case o.DeadLetterRetention < 0:
		return fmt.Errorf("%w: DeadLetterRetention %s is negative", ErrInvalidOptions, o.DeadLetterRetention)
	case o.PackInterval < 0:
		return fmt.Errorf("%w: PackInterval %s is negative", ErrInvalidOptions, o.PackInterval)
	case o.RecoverInterval < 0:
		return fmt.Errorf("%w: RecoverInterval %s is negative", ErrInvalidOptions, o.RecoverInterval)
	case o.MaxBatchRows < 0:
		return fmt.Errorf("%w: MaxBatchRows %d is negative", ErrInvalidOptions, o.MaxBatchRows)
	}
	return nil
}
