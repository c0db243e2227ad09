package transfer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/outbox"
)

// ShardReader reads pages of one shard's rows (outbox.ShardRead): all a
// copy needs from its source. boltstore.Store and memstore.Store implement
// it; a replica sync reads a remote node through an adapter.
type ShardReader interface {
	// ReadShard returns the next page after p.After, bounded by p.MaxRows
	// and p.MaxBytes, marking its rows in-transfer when p.Mark is set.
	ReadShard(ctx context.Context, p outbox.ShardRead) (outbox.ShardPage, error)
}

// Source is the sending side of a move: it reads and marks pages, then
// deletes the rows a sink made durable or unmarks the rows of a failed send.
type Source interface {
	ShardReader
	// CompleteTransfer deletes the rows of keys still marked in-transfer
	// (rows changed since they were read lost their mark and are kept) and
	// returns how many it deleted.
	CompleteTransfer(ctx context.Context, keys []string) (int, error)
	// AbortTransfer unmarks the rows of keys still marked in-transfer and
	// returns how many it unmarked.
	AbortTransfer(ctx context.Context, keys []string) (int, error)
}

// ShardsReader is an optional Source method: a marking read of several
// shards in one call (one transaction, one fsync) against one shared
// budget of maxRows rows and maxBytes bytes. It returns the pages of the
// reads it made, in order, stopping once the budget is spent; a shard the
// source owns yields an empty, Done page. A Mover uses it when its Source
// has it, so a batch gathered from a few rows of each of hundreds of shards
// costs one commit at the source instead of one per shard.
type ShardsReader interface {
	ReadShards(ctx context.Context, reads []outbox.ShardRead, maxRows, maxBytes int) ([]outbox.ShardPage, error)
}

// Sink is the receiving side: it merges copies of rows into its store
// (outbox.NormalizeIncoming, then outbox.Merge per row) and returns only
// once they are durable. A batch merged twice changes nothing the second
// time.
type Sink interface {
	Merge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error)
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error)

// Merge calls f.
func (f SinkFunc) Merge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
	return f(ctx, rows)
}

// maxShardsPerRead bounds the shards of one ReadShards call (a batch of
// 500 rows from 500 one-row shards is the worst case worth one commit).
const maxShardsPerRead = 512

// Defaults of Limits and MoverConfig.
const (
	// DefaultMaxRows is the most rows per batch.
	DefaultMaxRows = 500
	// DefaultMaxBytes is the byte budget of a batch (8 MiB as
	// outbox.RowBytes counts; about 11 MiB of JSON with base64 payloads):
	// eight 1 MiB rows, or 500 small ones.
	DefaultMaxBytes = 8 << 20
	// DefaultReleaseAttempts is how many times a CompleteTransfer or
	// AbortTransfer is tried before its keys are kept as stranded.
	DefaultReleaseAttempts = 5
	// DefaultReleaseBackoff is the first wait between release attempts; it
	// doubles up to one second.
	DefaultReleaseBackoff = 10 * time.Millisecond
	// DefaultReleaseTimeout bounds one release call. Releases run on a
	// context detached from the caller's cancellation (a cancelled send
	// must still unmark its rows), bounded by this.
	DefaultReleaseTimeout = 10 * time.Second
)

// Limits bound one batch (a page sent in one Sink call).
type Limits struct {
	// MaxRows is the most rows per batch (default DefaultMaxRows).
	MaxRows int
	// MaxBytes is the batch's byte budget as outbox.RowBytes counts
	// (default DefaultMaxBytes). A batch may exceed it by one row.
	MaxBytes int
}

func (l Limits) withDefaults() Limits {
	if l.MaxRows <= 0 {
		l.MaxRows = DefaultMaxRows
	}
	if l.MaxBytes <= 0 {
		l.MaxBytes = DefaultMaxBytes
	}
	return l
}

// Stats count what a stream moved or copied.
type Stats struct {
	// Rows and Bytes are what the sink acknowledged (Bytes as
	// outbox.RowBytes counts).
	Rows, Bytes int
	// Batches is the number of acknowledged Sink calls.
	Batches int
	// Merged sums the sink's answers.
	Merged outbox.MergeResult
	// Deleted counts rows CompleteTransfer deleted at the source (a move).
	Deleted int
}

func (s *Stats) add(rows []outbox.Row, res outbox.MergeResult) {
	s.Rows += len(rows)
	s.Bytes += bytesOf(rows)
	s.Batches++
	s.Merged.Created += res.Created
	s.Merged.Updated += res.Updated
	s.Merged.Skipped += res.Skipped
}

func bytesOf(rows []outbox.Row) int {
	n := 0
	for i := range rows {
		n += outbox.RowBytes(&rows[i])
	}
	return n
}

// Copy copies one shard from src to dst (a replica sync): pages of at most
// limits rows and bytes read after the resume token from (nil: the start),
// each merged into dst, until the end of the shard. It returns the token
// after the last page dst acknowledged: on an error, pass it as from to
// continue where the stream stopped. Nothing is marked or deleted at the
// source; rows that change while the copy runs are the replication
// stream's business, not the copy's.
func Copy(ctx context.Context, src ShardReader, dst Sink, shard uint32, from []byte, limits Limits) ([]byte, Stats, error) {
	limits = limits.withDefaults()
	var st Stats
	cursor := from
	for {
		if err := ctx.Err(); err != nil {
			return cursor, st, err
		}
		page, err := src.ReadShard(ctx, outbox.ShardRead{Shard: shard, After: cursor, MaxRows: limits.MaxRows, MaxBytes: limits.MaxBytes})
		if err != nil {
			return cursor, st, fmt.Errorf("copy shard %d: read: %w", shard, err)
		}
		if len(page.Rows) > 0 {
			res, err := dst.Merge(ctx, page.Rows)
			if err != nil {
				return cursor, st, fmt.Errorf("copy shard %d: send %d rows: %w", shard, len(page.Rows), err)
			}
			st.add(page.Rows, res)
		}
		cursor = page.Next
		if page.Done || len(page.Rows) == 0 {
			return cursor, st, nil
		}
	}
}

// MoverConfig configures a Mover.
type MoverConfig struct {
	// Limits bound each batch.
	Limits Limits
	// ReleaseAttempts, ReleaseBackoff and ReleaseTimeout shape the retries
	// of CompleteTransfer and AbortTransfer (defaults above).
	ReleaseAttempts int
	ReleaseBackoff  time.Duration
	ReleaseTimeout  time.Duration
	// Logger receives release failures (default: discard).
	Logger *slog.Logger
	// Registerer, when set, receives the Mover's metrics.
	Registerer prometheus.Registerer
}

// Mover moves rows of shards out of one Source, keeping per-shard resume
// tokens and the releases that failed (stranded marks) across calls. Its
// methods are safe for concurrent use; calls run one at a time.
type Mover struct {
	src Source
	cfg MoverConfig
	log *slog.Logger
	m   *metrics

	mu       sync.Mutex // one Move or Flush at a time
	cursors  map[uint32][]byte
	stranded []release
	nStrand  int
}

// release is a CompleteTransfer (del) or AbortTransfer still owed for keys.
type release struct {
	keys []string
	del  bool
}

// NewMover returns a Mover over src. It fails only if cfg.Registerer
// refuses its metrics.
func NewMover(src Source, cfg MoverConfig) (*Mover, error) {
	cfg.Limits = cfg.Limits.withDefaults()
	if cfg.ReleaseAttempts <= 0 {
		cfg.ReleaseAttempts = DefaultReleaseAttempts
	}
	if cfg.ReleaseBackoff <= 0 {
		cfg.ReleaseBackoff = DefaultReleaseBackoff
	}
	if cfg.ReleaseTimeout <= 0 {
		cfg.ReleaseTimeout = DefaultReleaseTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	mv := &Mover{src: src, cfg: cfg, log: log.With(slog.String("component", "transfer")), cursors: map[uint32][]byte{}}
	var err error
	if mv.m, err = newMetrics(cfg.Registerer); err != nil {
		return nil, fmt.Errorf("transfer: register metrics: %w", err)
	}
	mv.m.stranded.Set(0)
	return mv, nil
}

// Stranded returns how many rows are still marked in-transfer because
// their CompleteTransfer or AbortTransfer failed and awaits a retry.
func (mv *Mover) Stranded() int {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	return mv.nStrand
}

// ErrStranded is returned (wrapped) by Move and Flush while releases of
// marked rows keep failing; those rows stay marked (not claimable) and are
// retried by every later call.
var ErrStranded = errors.New("transfer: rows left marked in-transfer")

// RetryStranded retries every stranded release once (each with its
// backoff) and returns an error wrapping ErrStranded while any still fails.
// Move does this first anyway; a caller whose pass has nothing to move
// (the shard is owned here again, or has no live owner) calls it so that
// marks are released whether or not rows move.
func (mv *Mover) RetryStranded(ctx context.Context) error {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	return mv.retryStrandedLocked(ctx)
}

// Flush retries every stranded release until all succeed, or ctx ends
// (then it returns an error wrapping ErrStranded and ctx's error).
func (mv *Mover) Flush(ctx context.Context) error {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	for {
		err := mv.retryStrandedLocked(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return errors.Join(err, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// Move moves the transferable rows of shards (pending and terminal rows;
// claimed rows finish at the source first) to dst, in batches gathered
// across shards (a node holding a few rows in each of hundreds of shards
// makes a few calls, not hundreds). Each batch is marked in-transfer at the
// source, sent with one dst.Merge, then deleted at the source
// (CompleteTransfer) once dst acknowledged it, or unmarked (AbortTransfer)
// when the send failed, which ends the call: its error names the rows and
// shards. A shard the source owns again is skipped. Each shard resumes
// after the last batch dst acknowledged in an earlier call.
//
// Stranded releases of earlier calls are retried first; while any fails,
// Move sends nothing and returns an error wrapping ErrStranded.
func (mv *Mover) Move(ctx context.Context, dst Sink, shards []uint32) (Stats, error) {
	mv.mu.Lock()
	defer mv.mu.Unlock()
	var st Stats
	if err := mv.retryStrandedLocked(ctx); err != nil {
		return st, err
	}
	r := &moveRun{mv: mv, queue: append([]uint32(nil), shards...)}
	for len(r.queue) > 0 {
		if err := ctx.Err(); err != nil {
			return st, errors.Join(r.firstErr, err)
		}
		b, err := r.readBatch(ctx)
		if err != nil {
			return st, errors.Join(r.firstErr, err)
		}
		if len(b.rows) == 0 {
			mv.commitCursors(b)
			continue
		}
		if err := r.send(ctx, dst, b, &st); err != nil {
			return st, err
		}
	}
	return st, r.firstErr
}

// moveRun is one Move call: the shards still to read, in order, and the
// first failure of a shard, which Move returns once the others are moved.
type moveRun struct {
	mv       *Mover
	queue    []uint32
	firstErr error
}

// moveBatch is one batch being gathered: its rows and their bytes, the
// shards it read (touched, in order), each one's resume token once the
// batch is acknowledged, and which were read to their end.
type moveBatch struct {
	rows    []outbox.Row
	size    int
	next    map[uint32][]byte
	done    map[uint32]bool
	touched []uint32
}

// room reports whether the batch is below both of lim's bounds.
func (b *moveBatch) room(lim Limits) bool {
	return len(b.rows) < lim.MaxRows && b.size < lim.MaxBytes
}

// add adds shard's page to the batch; a page that is Done or empty reads
// the shard to its end. It returns whether it did.
func (b *moveBatch) add(shard uint32, page outbox.ShardPage) bool {
	b.next[shard] = page.Next
	b.rows = append(b.rows, page.Rows...)
	b.size += bytesOf(page.Rows)
	if page.Done || len(page.Rows) == 0 {
		b.done[shard] = true
	}
	return b.done[shard]
}

// readBatch marks and reads the next batch from the queue's shards, with
// ReadShards when the source has it, else (or, for the rest of the batch,
// once a ReadShards call failed) one shard at a time. Shard failures go to
// firstErr; the error returned is the context's, which ends the Move.
func (r *moveRun) readBatch(ctx context.Context) (*moveBatch, error) {
	b := &moveBatch{next: map[uint32][]byte{}, done: map[uint32]bool{}}
	multi, useMulti := r.mv.src.(ShardsReader)
	if useMulti {
		fellBack, err := r.readMany(ctx, multi, b)
		if err != nil {
			return nil, err
		}
		useMulti = !fellBack
	}
	if !useMulti {
		r.readEach(ctx, b)
	}
	return b, nil
}

// readMany fills b with ReadShards calls, each over the next shards of
// the queue from their resume tokens against what is left of the batch's
// budget. Shards read to their end leave the queue; the last one read may
// have more (the budget ran out in it), and so may the shards not
// reached: they stay, in order. A failed call makes the rest of the batch
// go one shard at a time (fellBack), so one bad shard (a bad token) does
// not hold the others back.
func (r *moveRun) readMany(ctx context.Context, multi ShardsReader, b *moveBatch) (fellBack bool, err error) {
	lim := r.mv.cfg.Limits
	for len(r.queue) > 0 && b.room(lim) {
		chunk := r.queue[:min(len(r.queue), maxShardsPerRead)]
		reads := make([]outbox.ShardRead, len(chunk))
		for i, shard := range chunk {
			reads[i] = outbox.ShardRead{Shard: shard, After: r.mv.cursors[shard], Mark: true}
		}
		pages, err := multi.ReadShards(ctx, reads, lim.MaxRows-len(b.rows), lim.MaxBytes-b.size)
		if err != nil {
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			r.firstErr = cmpErr(r.firstErr, fmt.Errorf("mark rows of %d shards for transfer: %w", len(reads), err))
			return true, nil
		}
		if len(pages) == 0 {
			return false, nil // the budget was spent
		}
		for i, page := range pages {
			b.touched = append(b.touched, reads[i].Shard)
			b.add(reads[i].Shard, page)
		}
		kept := r.queue[:0]
		for _, shard := range r.queue {
			if !b.done[shard] {
				kept = append(kept, shard)
			}
		}
		r.queue = kept
	}
	return false, nil
}

// readEach fills b one shard at a time from the head of the queue, each
// from its token in this batch or else its resume token; a shard leaves
// the queue once read to its end or when its read fails. A shard the
// source owns again (outbox.ErrShardOwned) has nothing to send and loses
// its resume token; any other failure goes to firstErr unless the context
// ended.
func (r *moveRun) readEach(ctx context.Context, b *moveBatch) {
	lim := r.mv.cfg.Limits
	for len(r.queue) > 0 && b.room(lim) {
		shard := r.queue[0]
		after, seen := b.next[shard]
		if !seen {
			after = r.mv.cursors[shard]
		}
		page, err := r.mv.src.ReadShard(ctx, outbox.ShardRead{Shard: shard, After: after,
			MaxRows: lim.MaxRows - len(b.rows), MaxBytes: lim.MaxBytes - b.size, Mark: true})
		if err != nil {
			r.queue = r.queue[1:]
			if errors.Is(err, outbox.ErrShardOwned) {
				delete(r.mv.cursors, shard)
				continue
			}
			if ctx.Err() == nil {
				r.firstErr = cmpErr(r.firstErr, fmt.Errorf("shard %d: mark rows for transfer: %w", shard, err))
			}
			continue
		}
		if !seen {
			b.touched = append(b.touched, shard)
		}
		if b.add(shard, page) {
			r.queue = r.queue[1:]
		}
	}
}

// send merges batch b into dst and counts it into st. Acknowledged, its
// shards' resume tokens advance and its rows are deleted at the source
// (CompleteTransfer); failed, its rows are unmarked (AbortTransfer) and
// the error, naming the rows and shards, ends the Move, as does a failed
// delete.
func (r *moveRun) send(ctx context.Context, dst Sink, b *moveBatch, st *Stats) error {
	mv := r.mv
	keys := make([]string, len(b.rows))
	for i := range b.rows {
		keys[i] = b.rows[i].DispatchKey
	}
	res, err := dst.Merge(ctx, b.rows)
	if err != nil {
		mv.m.batches.WithLabelValues("failed").Inc()
		_, rerr := mv.releaseLocked(ctx, release{keys: keys})
		return errors.Join(cmpErr(r.firstErr, fmt.Errorf("send %d rows of %d shards: %w", len(b.rows), len(b.touched), err)), rerr)
	}
	mv.m.batches.WithLabelValues("ok").Inc()
	mv.m.rows.Add(float64(len(b.rows)))
	mv.m.bytes.Add(float64(b.size))
	st.add(b.rows, res)
	mv.commitCursors(b)
	n, err := mv.releaseLocked(ctx, release{keys: keys, del: true})
	st.Deleted += n
	if err != nil {
		return cmpErr(r.firstErr, err)
	}
	return nil
}

// commitCursors records the resume tokens of an acknowledged (or empty)
// batch; a shard read to its end starts from the beginning next time, so a
// later call sees rows unmarked or settled behind the token.
func (mv *Mover) commitCursors(b *moveBatch) {
	for _, shard := range b.touched {
		if b.done[shard] {
			delete(mv.cursors, shard)
		} else {
			mv.cursors[shard] = b.next[shard]
		}
	}
}

// releaseLocked runs one release with retries; if it keeps failing, its
// keys are kept as stranded and the error (wrapping ErrStranded) returned.
func (mv *Mover) releaseLocked(ctx context.Context, r release) (int, error) {
	n, err := mv.tryRelease(ctx, r)
	if err != nil {
		mv.stranded = append(mv.stranded, r)
		mv.nStrand += len(r.keys)
		mv.m.stranded.Set(float64(mv.nStrand))
		mv.log.Error("rows left marked in-transfer: release failed; retried before the next batch",
			slog.String("release", r.what()), slog.Int("rows", len(r.keys)), slog.Any("error", err))
		return 0, fmt.Errorf("%w: %s of %d rows: %w", ErrStranded, r.what(), len(r.keys), err)
	}
	return n, nil
}

func (r release) what() string {
	if r.del {
		return "CompleteTransfer"
	}
	return "AbortTransfer"
}

// tryRelease calls CompleteTransfer or AbortTransfer up to ReleaseAttempts
// times with doubling backoff, on a context detached from ctx's
// cancellation (a send cut off by a deadline must still unmark its rows)
// and bounded by ReleaseTimeout per call. It returns the rows the release
// deleted or unmarked.
func (mv *Mover) tryRelease(ctx context.Context, r release) (int, error) {
	base := context.WithoutCancel(ctx)
	wait := mv.cfg.ReleaseBackoff
	var err error
	for attempt := range mv.cfg.ReleaseAttempts {
		if attempt > 0 {
			time.Sleep(wait)
			wait = min(2*wait, time.Second)
		}
		cctx, cancel := context.WithTimeout(base, mv.cfg.ReleaseTimeout)
		var n int
		if r.del {
			n, err = mv.src.CompleteTransfer(cctx, r.keys)
		} else {
			n, err = mv.src.AbortTransfer(cctx, r.keys)
		}
		cancel()
		if err == nil {
			return n, nil
		}
		mv.m.releaseFailures.Inc()
	}
	return 0, err
}

// retryStrandedLocked retries every stranded release once (with its
// backoff); it returns an error wrapping ErrStranded while any fails.
func (mv *Mover) retryStrandedLocked(ctx context.Context) error {
	if len(mv.stranded) == 0 {
		return nil
	}
	var left []release
	var firstErr error
	for _, r := range mv.stranded {
		if _, err := mv.tryRelease(ctx, r); err != nil {
			left = append(left, r)
			firstErr = cmpErr(firstErr, fmt.Errorf("%s of %d rows: %w", r.what(), len(r.keys), err))
			continue
		}
		mv.log.Info("stranded in-transfer marks released", slog.String("release", r.what()), slog.Int("rows", len(r.keys)))
	}
	mv.stranded = left
	mv.nStrand = 0
	for _, r := range left {
		mv.nStrand += len(r.keys)
	}
	mv.m.stranded.Set(float64(mv.nStrand))
	if firstErr != nil {
		return fmt.Errorf("%w: %d rows: %w", ErrStranded, mv.nStrand, firstErr)
	}
	return nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}
