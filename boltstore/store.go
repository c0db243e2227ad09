package boltstore

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"github.com/fairshard/fairshard/outbox"
)

// Store is the bbolt implementation of outbox.Store plus the handoff, admin
// and maintenance calls the node needs. It is safe for concurrent use.
//
// Every mutation is queued to one writer goroutine, which coalesces whatever
// is queued into one bbolt write transaction (group commit) and answers each
// caller after the commit's fsync. Reads run in short bbolt read
// transactions on the caller's goroutine.
type Store struct {
	db   *bolt.DB
	path string
	opts Options
	log  *slog.Logger
	m    *metrics

	owned atomic.Pointer[ownedSet]

	queue chan *op
	// batchMu is held by the writer while it runs a batch (its write
	// transaction, retries included): awaitWrites waits on it, so a read
	// after it sees every write begun before (the handover fence,
	// ClaimedByShard).
	batchMu    sync.Mutex
	closing    chan struct{}
	writerDone chan struct{}
	closeOnce  sync.Once
	closeErr   error

	// closeMu orders reads against Close: readers hold it shared while they
	// use db, Close takes it exclusively after the writer has stopped.
	closeMu sync.RWMutex
	closed  bool

	// broken is set once bbolt panicked inside the writer: the in-memory
	// state of the file may be damaged, so every later write fails.
	broken atomic.Pointer[error]
	// failed holds the cause of a failed commit (write, fsync) until the
	// writer has reopened the data file: every write is refused meanwhile.
	// db is nil while a reopen has closed the file and not opened it
	// again (reads fail too then); both change under closeMu.
	failed atomic.Pointer[error]

	// totals mirrors the ns counters summed over namespaces, per status,
	// for the fairshard_store_rows gauge.
	totals [nsCountsLen]atomic.Int64

	// packMu serialises pack passes; packAfter is the tombstone index
	// key the next PackTombstones call reads after (nil: from the
	// start), packPageRows the keys a call reads (packScanRows; tests
	// lower it).
	packMu       sync.Mutex
	packAfter    []byte
	packPageRows int
}

var _ outbox.Store = (*Store)(nil)

// Open opens (creating if absent) the store file at path.
//
// It waits at most opts.LockTimeout for the file lock and then fails with an
// error wrapping ErrLocked ("data dir is in use by another process"). A file
// that is not bbolt, is truncated, has bad pages or lacks the store's
// buckets fails with ErrCorrupt (bbolt panics are contained). A file created
// with another shard_count fails with ErrShardCountMismatch. Rows left
// marked in-transfer by a crashed handoff are unmarked (resending them is
// harmless: the receiver deduplicates).
func Open(path string, opts Options) (*Store, error) {
	opts = opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	existed, err := precheckFile(path)
	if err != nil {
		return nil, err
	}
	if existed && !opts.SkipOpenCheck {
		if err := walkFile(path, opts); err != nil {
			return nil, err
		}
	}
	db, err := openBolt(path, opts)
	if err != nil {
		return nil, err
	}
	s := &Store{
		db:         db,
		path:       path,
		opts:       opts,
		log:        opts.Logger.With(slog.String("component", "boltstore"), slog.String("path", path)),
		queue:      make(chan *op, 1024),
		closing:    make(chan struct{}),
		writerDone: make(chan struct{}),

		packPageRows: packScanRows,
	}
	s.owned.Store(&ownedSet{all: true})
	var unmarked int
	err = guard("open "+path, func() error {
		var err error
		unmarked, err = s.initFile()
		return err
	})
	if err != nil {
		_ = db.Close()
		return nil, err
	}
	if s.m, err = newMetrics(opts.Registerer, &s.totals, s.writableNow); err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("boltstore: register metrics: %w", err)
	}
	if unmarked > 0 {
		s.log.Info("cleared in-transfer marks left by an interrupted handoff", slog.Int("rows", unmarked))
	}
	go s.run()
	return s, nil
}

// initFile creates the buckets of a new file or verifies those of an
// existing one, checks shard_count, clears transfer marks and loads the
// status totals.
func (s *Store) initFile() (int, error) {
	var unmarked int
	err := s.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketMeta) == nil {
			if err := s.createFile(tx); err != nil {
				return err
			}
		}
		format, err := s.upgradeLayout(tx)
		if err != nil {
			return err
		}
		w, err := newWtx(tx, s.opts.ShardCount)
		if err != nil {
			return fmt.Errorf("%s: %w", s.path, err)
		}
		if err := ensureAttemptsBucket(tx); err != nil {
			return fmt.Errorf("%s: %w", s.path, err)
		}
		if format == formatV1 {
			if err := s.upgradeV1(w); err != nil {
				return fmt.Errorf("%s: upgrade from format 1: %w", s.path, err)
			}
		}
		if err := s.checkShardCount(w); err != nil {
			return err
		}
		if unmarked, err = s.clearTransferMarks(w); err != nil {
			return err
		}
		if err := w.flush(); err != nil {
			return err
		}
		return s.loadTotals(w)
	})
	return unmarked, err
}

// createFile lays out an empty file: every bucket, the current format
// version and the options' shard count. A file that holds buckets but no
// meta bucket is not ours and is refused with ErrCorrupt.
func (s *Store) createFile(tx *bolt.Tx) error {
	if err := tx.ForEach(func(name []byte, _ *bolt.Bucket) error {
		return fmt.Errorf("%s: %w: not a boltstore file (bucket %q but no %q)", s.path, ErrCorrupt, name, bucketMeta)
	}); err != nil {
		return err
	}
	for _, name := range allBuckets {
		if _, err := tx.CreateBucketIfNotExists(name); err != nil {
			return fmt.Errorf("create bucket %q: %w", name, err)
		}
	}
	meta := tx.Bucket(bucketMeta)
	if err := meta.Put(metaFormat, binary.AppendUvarint(nil, formatVersion)); err != nil {
		return err
	}
	return meta.Put(metaShardCount, binary.BigEndian.AppendUint32(nil, s.opts.ShardCount))
}

// upgradeLayout reads the file's format version and returns it, after
// adding the buckets a format 1 or 2 file lacks: the digests (format 1;
// the caller computes them with upgradeV1) and the bundles with their
// expiry index (formats 1 and 2). A format 2 file is then marked current;
// a format 1 file keeps its version until upgradeV1 has run. Any other
// version than 1 to formatVersion is ErrCorrupt.
func (s *Store) upgradeLayout(tx *bolt.Tx) (uint64, error) {
	meta := tx.Bucket(bucketMeta)
	if meta == nil {
		return 0, fmt.Errorf("%s: %w: bucket %q missing", s.path, ErrCorrupt, bucketMeta)
	}
	v := meta.Get(metaFormat)
	if v == nil {
		return 0, fmt.Errorf("%s: %w: no format version", s.path, ErrCorrupt)
	}
	format, n := binary.Uvarint(v)
	switch {
	case n <= 0:
		return 0, fmt.Errorf("%s: %w: unreadable format version %x", s.path, ErrCorrupt, v)
	case format == formatV1:
		// Written before row versions: add the digests (upgradeV1).
		if _, err := tx.CreateBucket(bucketDigests); err != nil {
			return 0, fmt.Errorf("%s: upgrade from format 1: create bucket %q: %w", s.path, bucketDigests, err)
		}
	case format != formatVersion && format != formatV2:
		return 0, fmt.Errorf("%s: %w: format version %d, this build reads %d to %d", s.path, ErrCorrupt, format, formatV1, formatVersion)
	}
	if format == formatV1 || format == formatV2 {
		// Written before bundles: add their buckets; the pack pass packs
		// the file's slim tombstones from then on.
		for _, name := range [][]byte{bucketBundles, bucketBExp} {
			if _, err := tx.CreateBucket(name); err != nil {
				return 0, fmt.Errorf("%s: upgrade from format %d: create bucket %q: %w", s.path, format, name, err)
			}
		}
		if format == formatV2 {
			if err := meta.Put(metaFormat, binary.AppendUvarint(nil, formatVersion)); err != nil {
				return 0, err
			}
			s.log.Info("upgraded the data file from format 2 to 3 (bundles of finished rows)")
		}
	}
	return format, nil
}

// checkShardCount requires the file's shard_count to be the options' one:
// rows are placed by it, so a different count is ErrShardCountMismatch.
func (s *Store) checkShardCount(w *wtx) error {
	v := w.b.meta.Get(metaShardCount)
	if len(v) != 4 {
		return fmt.Errorf("%s: %w: no shard_count", s.path, ErrCorrupt)
	}
	if sc := binary.BigEndian.Uint32(v); sc != s.opts.ShardCount {
		return fmt.Errorf("%s: %w: file has %d, options say %d", s.path, ErrShardCountMismatch, sc, s.opts.ShardCount)
	}
	return nil
}

// clearTransferMarks unmarks every row a handoff marked and never
// completed (the sender crashed: resending is harmless) and returns how
// many. A mark without its row is ErrCorrupt.
func (s *Store) clearTransferMarks(w *wtx) (int, error) {
	var keys [][]byte
	c := w.b.transfer.Cursor()
	for k, _ := c.First(); k != nil; k, _ = c.Next() {
		keys = append(keys, append([]byte(nil), k...))
	}
	for _, rk := range keys {
		row, xfer, ok, _, err := w.getAny(rk)
		if err != nil {
			return 0, err
		}
		if !ok || !xfer {
			return 0, fmt.Errorf("%s: %w: transfer mark %x without a row", s.path, ErrCorrupt, rk)
		}
		if err := w.write(rk, &row, true, &row, false, nil); err != nil {
			return 0, err
		}
	}
	return len(keys), nil
}

// loadTotals sums the namespace counters into the status totals the rows
// gauge reports. Undecodable counters are ErrCorrupt; the totals are set
// from the counters summed before them.
func (s *Store) loadTotals(w *wtx) error {
	var tot [nsCountsLen]int64
	err := w.b.ns.ForEach(func(k, v []byte) error {
		c, err := decodeCounts(v, nsCountsLen)
		if err != nil {
			return fmt.Errorf("%s: %w: namespace %q counters", s.path, ErrCorrupt, k)
		}
		for i := range tot {
			tot[i] += c[i]
		}
		return nil
	})
	for i := range tot {
		s.totals[i].Store(tot[i])
	}
	return err
}

// Close stops the writer (queued operations fail with outbox.ErrClosed),
// then closes the file, releasing its lock. It is idempotent: later calls
// return the first call's result. Every other method returns an error
// wrapping outbox.ErrClosed after Close.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		close(s.closing)
		<-s.writerDone
		s.closeMu.Lock()
		s.closed = true
		if s.db != nil {
			s.closeErr = s.db.Close()
		}
		s.closeMu.Unlock()
	})
	return s.closeErr
}

// Path returns the data file's path.
func (s *Store) Path() string { return s.path }

// ShardCount returns the store's fixed shard_count.
func (s *Store) ShardCount() uint32 { return s.opts.ShardCount }

// SetOwnedShards tells the store which shards this node owns. owned is
// copied into an immutable set that replaces the previous one atomically;
// shards outside [0, ShardCount) are ignored. A nil slice means "owns every
// shard" (the single-node default, in force until the first call); an empty
// non-nil slice owns nothing (as outbox/memstore). Claim, CountClaimed*,
// CountInFlight and PendingRoutes see only rows of owned shards from the
// next call on; calls already running use the set they started with.
func (s *Store) SetOwnedShards(owned []uint32) {
	s.owned.Store(newOwnedSet(owned, s.opts.ShardCount))
}

// Owns reports whether the current owned set includes shard.
func (s *Store) Owns(shard uint32) bool {
	return shard < s.opts.ShardCount && s.owned.Load().has(shard)
}

// view runs fn in a read transaction, mapping a closed store to ErrClosed
// and any bbolt panic to ErrCorrupt.
func (s *Store) view(ctx context.Context, what string, fn func(tx *bolt.Tx, b buckets) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.closeMu.RLock()
	defer s.closeMu.RUnlock()
	if s.closed {
		return fmt.Errorf("boltstore: %s: %w", what, outbox.ErrClosed)
	}
	if s.db == nil {
		return notWritable(what, errReopening)
	}
	return guard(what, func() error {
		err := s.db.View(func(tx *bolt.Tx) error {
			b, err := openBuckets(tx)
			if err != nil {
				return err
			}
			return fn(tx, b)
		})
		if errors.Is(err, berrors.ErrDatabaseNotOpen) {
			return fmt.Errorf("boltstore: %s: %w", what, outbox.ErrClosed)
		}
		return err
	})
}

// errReopening is the cause reads report while a reopen has closed the
// data file and not yet opened it again.
var errReopening = errors.New("the data file is closed until a reopen succeeds")

// Writable reports whether the store accepts writes now: nil, or an error
// saying why not. After a commit failed (a write or an fsync error, a full
// disk: bbolt's commit returned an error) every write is refused with an
// error wrapping ErrNotWritable and the cause, and Writable returns one,
// until the writer has closed the data file, dropped its pages from the
// kernel's cache (so the next reads come from the disk) and opened it
// again, with Open's checks, and a probe commit of 1 MiB has succeeded.
// It retries after Options.RecoverInterval, then at doubling intervals up
// to RecoverIntervalMax. A node reports itself not ready while this
// returns an error. After a bbolt panic it returns the ErrCorrupt error
// for good (the file is suspect: restart, and check it); after Close an
// error wrapping outbox.ErrClosed.
//
// Rule and reason: a failed fsync is not retryable (the kernel may mark
// the pages it could not write clean and drop them; etcd treats it as
// fatal): docs/adr/0052-write-failures-stop-writes.md.
func (s *Store) Writable() error {
	if p := s.broken.Load(); p != nil {
		return *p
	}
	if p := s.failed.Load(); p != nil {
		return notWritable("write", *p)
	}
	return s.checkOpen("write")
}

// writableNow is Writable for the fairshard_store_writable gauge.
func (s *Store) writableNow() bool { return s.Writable() == nil }

// probeKey is the meta key of the probe value a reopen writes and deletes.
var probeKey = []byte("probe")

// probeBytes is the size of the probe value: 256 pages written as one run,
// so the probe needs the free space (in the file or on the disk) a large
// batch of appends would, not merely the few pages a failed commit may
// have left written: on a disk that stays full the store stays
// unwritable instead of flapping with every small commit that fits.
const probeBytes = 1 << 20

// reopen recovers from a failed commit, on the writer goroutine: it closes
// the data file, drops its cached pages, opens it again as Open does
// (checks, buckets, shard_count, transfer marks, totals) and commits a
// probe value and then its deletion. On success the failed state is
// cleared; on failure the file stays closed (reads fail too) until the
// next attempt. The file lock is released between the close and the
// open, for milliseconds.
func (s *Store) reopen() error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.closed {
		return outbox.ErrClosed
	}
	if s.db != nil {
		err := s.db.Close()
		s.db = nil
		if err != nil {
			s.log.Warn("closing the data file after a failed commit", "error", err)
		}
	}
	dropPageCache(s.path)
	if _, err := precheckFile(s.path); err != nil {
		return err
	}
	if !s.opts.SkipOpenCheck {
		if err := walkFile(s.path, s.opts); err != nil {
			return err
		}
	}
	db, err := openBolt(s.path, s.opts)
	if err != nil {
		return err
	}
	s.db = db
	err = guard("reopen "+s.path, func() error {
		if _, err := s.initFile(); err != nil {
			return err
		}
		if err := s.db.Update(func(tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Put(probeKey, make([]byte, probeBytes))
		}); err != nil {
			return fmt.Errorf("probe commit: %w", err)
		}
		if err := s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketMeta).Delete(probeKey) }); err != nil {
			return fmt.Errorf("probe commit: %w", err)
		}
		return nil
	})
	if err != nil {
		_ = s.db.Close()
		s.db = nil
		return err
	}
	s.failed.Store(nil)
	return nil
}

// now reads the store's clock.
func (s *Store) now() time.Time { return s.opts.Now() }

// upgradeV1 turns a format 1 file (no row versions, no digests) into a
// format 3 one inside Open's transaction: one pass over the rows computes
// every shard's digest (the rows' Version decodes as zero), then the meta
// format becomes 3 (initFile has created the bundle buckets). Row values are left as they are; a change rewrites
// each in format 2. Cost: O(rows), once.
func (s *Store) upgradeV1(w *wtx) error {
	c := w.b.rows.Cursor()
	n := 0
	for k, v := c.First(); k != nil; k, v = c.Next() {
		row, err := decodeRow(k, v)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		w.digest(&row, +1)
		n++
	}
	if err := w.b.meta.Put(metaFormat, binary.AppendUvarint(nil, formatVersion)); err != nil {
		return err
	}
	s.log.Info("upgraded the data file from format 1 to 3 (row versions, shard digests, bundles)", slog.Int("rows", n))
	return nil
}
