package boltstore

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/outbox"
)

// op is one mutation queued to the writer. apply runs inside the group
// commit's transaction and may run more than once (when another op of the
// same batch fails, the batch is retried without it), so it must write its
// results from scratch each time. rows weighs the op against MaxBatchRows.
type op struct {
	ctx   context.Context
	what  string
	rows  int
	apply func(w *wtx) error
	done  chan error
}

// submit queues apply and waits for its group commit. If ctx ends before the
// writer reaches the op, nothing is written and ctx's error is returned; once
// applied, submit waits for the commit (milliseconds) whatever ctx does, so
// a nil error always means durable.
func (s *Store) submit(ctx context.Context, what string, rows int, apply func(w *wtx) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p := s.broken.Load(); p != nil {
		return fmt.Errorf("boltstore: %s: %w", what, *p)
	}
	if p := s.failed.Load(); p != nil {
		return notWritable(what, *p)
	}
	o := &op{ctx: ctx, what: what, rows: min(max(rows, 1), s.opts.MaxBatchRows), apply: apply, done: make(chan error, 1)}
	select {
	case s.queue <- o:
	case <-s.closing:
		return fmt.Errorf("boltstore: %s: %w", what, outbox.ErrClosed)
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case err := <-o.done:
		return err
	case <-s.writerDone:
		select {
		case err := <-o.done:
			return err
		default:
			return fmt.Errorf("boltstore: %s: %w", what, outbox.ErrClosed)
		}
	}
}

// Group-commit linger. Under steady concurrency, callers split into two
// groups that alternate (one waits on the commit while the other queues),
// halving every batch. So when the last commit held more than one op, the
// writer keeps collecting while ops keep arriving: it stops at the first
// gap of commitLingerGap without a new op, or after commitLingerMax. A lone
// caller never waits; a burst waits at most commitLingerMax.
const (
	commitLingerGap = 50 * time.Microsecond
	commitLingerMax = 500 * time.Microsecond
)

// awaitWrites returns once the write transaction in progress, if any, has
// committed or rolled back: a read transaction begun after it sees every
// write that began before the call. A batch takes milliseconds (one
// fsync), longer while the disk stalls: then ctx ends the wait (its
// error is returned; the helper goroutine ends with the batch).
func (s *Store) awaitWrites(ctx context.Context) error {
	if s.batchMu.TryLock() {
		s.batchMu.Unlock()
		return nil
	}
	done := make(chan struct{})
	go func() {
		s.batchMu.Lock()
		s.batchMu.Unlock() //nolint:staticcheck // an empty critical section: a barrier
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("boltstore: wait for the write in progress: %w", ctx.Err())
	}
}

// run is the writer goroutine: take one op, drain whatever else is queued
// (up to MaxBatchRows), linger briefly for recently answered callers,
// commit them together, answer each.
//
// After a failed commit (see Writable) it answers every op with
// ErrNotWritable at once and, between ops, reopens the data file: first
// after Options.RecoverInterval, then at doubling intervals up to
// RecoverIntervalMax, until a reopen succeeds.
func (s *Store) run() {
	defer close(s.writerDone)
	// A bad page faults; turn that into a panic that commit recovers.
	debug.SetPanicOnFault(true)
	batch := make([]*op, 0, 256)
	gap := time.NewTimer(time.Hour)
	gap.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	var retryC <-chan time.Time // non-nil while a reopen is scheduled
	wait := s.opts.RecoverInterval
	prev := 0
	for {
		if retryC == nil && s.failed.Load() != nil && s.broken.Load() == nil {
			retry.Reset(wait)
			retryC = retry.C
		}
		select {
		case o := <-s.queue:
			batch = append(batch[:0], o)
		case <-retryC:
			retryC = nil
			if err := s.reopen(); err != nil {
				s.m.reopens.WithLabelValues("failed").Inc()
				s.log.Warn("reopening the data file failed; writes stay refused", "error", err, "next_attempt_in", (2 * wait).String())
				wait = min(2*wait, max(RecoverIntervalMax, s.opts.RecoverInterval))
			} else {
				s.m.reopens.WithLabelValues("ok").Inc()
				s.log.Info("data file reopened after a failed commit; writes accepted again")
				wait = s.opts.RecoverInterval
			}
			continue
		case <-s.closing:
			retry.Stop()
			s.drainClosed()
			return
		}
		if s.failed.Load() != nil {
			// Refuse at once; no lingering.
			s.commit(batch)
			clear(batch)
			continue
		}
		rows := batch[0].rows
	drain:
		for rows < s.opts.MaxBatchRows {
			select {
			case o := <-s.queue:
				batch = append(batch, o)
				rows += o.rows
			default:
				break drain
			}
		}
		if prev > 1 {
			deadline := time.Now().Add(commitLingerMax)
		linger:
			for rows < s.opts.MaxBatchRows && time.Now().Before(deadline) {
				gap.Reset(commitLingerGap)
				select {
				case o := <-s.queue:
					batch = append(batch, o)
					rows += o.rows
					gap.Stop()
				case <-gap.C:
					break linger
				case <-s.closing:
					gap.Stop()
					break linger
				}
			}
		}
		prev = len(batch)
		s.commit(batch)
		clear(batch)
	}
}

func (s *Store) drainClosed() {
	for {
		select {
		case o := <-s.queue:
			o.done <- fmt.Errorf("boltstore: %s: %w", o.what, outbox.ErrClosed)
		default:
			return
		}
	}
}

// errOpFailed aborts a transaction after one op failed; the batch is then
// retried without that op.
var errOpFailed = errors.New("op failed")

// commit runs a batch in one bbolt write transaction. Per-op isolation: if
// one op's apply fails, the transaction is rolled back, that op gets its
// error, and the rest are retried in a fresh transaction, so one bad op
// never fails the others. A commit (fsync) failure fails every op of the
// batch: none of them is durable.
func (s *Store) commit(batch []*op) {
	s.batchMu.Lock()
	defer s.batchMu.Unlock()
	live := batch[:0:0]
	for _, o := range batch {
		if p := s.broken.Load(); p != nil {
			o.done <- fmt.Errorf("boltstore: %s: %w", o.what, *p)
			continue
		}
		if p := s.failed.Load(); p != nil {
			o.done <- notWritable(o.what, *p)
			continue
		}
		if err := o.ctx.Err(); err != nil {
			o.done <- err
			continue
		}
		live = append(live, o)
	}
	for len(live) > 0 {
		failed, opErr := -1, error(nil)
		var w *wtx
		var fnErr error // what the transaction's function returned
		start := time.Now()
		err := s.update(func(tx *bolt.Tx) error {
			var err error
			if w, err = newWtx(tx, s.opts.ShardCount); err != nil {
				fnErr = err
				return err
			}
			for i, o := range live {
				if err := s.applyOp(o, w); err != nil {
					failed, opErr, fnErr = i, err, errOpFailed
					return errOpFailed
				}
			}
			fnErr = w.flush()
			return fnErr
		})
		if failed >= 0 {
			if errors.Is(opErr, ErrCorrupt) && s.broken.Load() != nil {
				// bbolt panicked: fail the whole batch, the file is suspect.
				for _, o := range live {
					o.done <- fmt.Errorf("boltstore: %s: %w", o.what, opErr)
				}
				return
			}
			live[failed].done <- opErr
			live = slices.Delete(live, failed, failed+1)
			continue
		}
		if err == nil {
			s.m.commitDuration.Observe(time.Since(start).Seconds())
			s.m.batchOps.Observe(float64(len(live)))
			for i, d := range w.statusDelta {
				s.totals[i].Add(d)
			}
			if w.packed > 0 {
				s.m.packed.Add(float64(w.packed))
			}
			if w.expired > 0 {
				s.m.expired.Add(float64(w.expired))
			}
		} else if fnErr == nil && s.broken.Load() == nil {
			// The transaction was sound and bbolt's commit failed: a write,
			// an fsync, a file growth or a remap. Stop writing.
			s.fail(err, len(live))
			for _, o := range live {
				o.done <- notWritable(o.what+": commit", err)
			}
			return
		} else {
			s.log.Error("group commit failed", "ops", len(live), "error", err)
		}
		for _, o := range live {
			if err != nil {
				o.done <- fmt.Errorf("boltstore: %s: commit: %w", o.what, err)
			} else {
				o.done <- nil
			}
		}
		return
	}
}

// notWritable is the error of a write refused (or failed) because a commit
// failed: ErrNotWritable and the cause, both for errors.Is.
func notWritable(what string, cause error) error {
	if errors.Is(cause, ErrNotWritable) {
		return fmt.Errorf("boltstore: %s: %w", what, cause)
	}
	return fmt.Errorf("boltstore: %s: %w: %w", what, ErrNotWritable, cause)
}

// fail puts the store in the failed state after bbolt's commit returned
// err: every write is refused (ErrNotWritable) until the writer has
// reopened the data file (reopen). The first cause is kept.
func (s *Store) fail(err error, ops int) {
	if !s.failed.CompareAndSwap(nil, &err) {
		return
	}
	s.m.commitFailures.Inc()
	s.log.Error("commit failed: refusing every write until the data file is reopened (a failed fsync may have lost pages the process still sees)",
		"ops", ops, "error", err, "first_reopen_in", s.opts.RecoverInterval.String())
}

// update is db.Update with any panic (in flush or in bbolt's commit)
// turned into ErrCorrupt and the store marked broken.
func (s *Store) update(fn func(tx *bolt.Tx) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: bbolt panicked: %v", ErrCorrupt, r)
			s.broken.CompareAndSwap(nil, &err)
			s.log.Error("bbolt panicked in the writer; refusing further writes", "panic", fmt.Sprint(r))
		}
	}()
	return s.db.Update(fn)
}

// applyOp runs one op's apply, turning a bbolt panic into ErrCorrupt and
// marking the store broken.
func (s *Store) applyOp(o *op, w *wtx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("boltstore: %s: %w: bbolt panicked: %v", o.what, ErrCorrupt, r)
			s.broken.CompareAndSwap(nil, &err)
			s.log.Error("bbolt panicked in the writer; refusing further writes", "op", o.what, "panic", fmt.Sprint(r))
		}
	}()
	return o.apply(w)
}
