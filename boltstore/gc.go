package boltstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/fairshard/fairshard/outbox"
	bolt "go.etcd.io/bbolt"
)

// ExpireTombstones deletes the tombstones whose retention has ended at the
// store clock's now: done and cancelled rows with FinishedAt older than
// TombstoneRetention, failed rows (dead letters) older than
// DeadLetterRetention, packed or not. It works in transactions of at most GCBatchRows rows,
// queued like any other write, so it never holds the writer long. It
// returns the number of rows deleted. Cost: for rows not packed, the
// rows deleted, via the tombstone indexes ordered by FinishedAt; for
// packed rows, a rewrite (decode, encode, one leaf page) of the bundle
// holding each, found via the bexp index: bundles hold key ranges whose
// rows finished at different times, so a sweep often rewrites one whole
// bundle per expired row (docs/adr/0049-packed-tombstones-format-3.md).
func (s *Store) ExpireTombstones(ctx context.Context) (int, error) {
	total := 0
	for {
		now := s.now()
		tombCut := now.Add(-s.opts.TombstoneRetention)
		deadCut := now.Add(-s.opts.DeadLetterRetention)
		n := 0
		err := s.submit(ctx, "expire tombstones", GCBatchRows, func(w *wtx) error {
			n = 0
			for _, idx := range []struct {
				b   *bolt.Bucket
				cut time.Time
			}{{w.b.tombs, tombCut}, {w.b.dead, deadCut}} {
				var dks []string
				c := idx.b.Cursor()
				for k, _ := c.First(); k != nil && n+len(dks) < GCBatchRows; k, _ = c.Next() {
					if len(k) < timeKeyLen {
						return fmt.Errorf("%w: tombstone index key %x", ErrCorrupt, k)
					}
					if !decodeTimeKey(k).Before(idx.cut) {
						break
					}
					dks = append(dks, string(k[timeKeyLen:]))
				}
				for _, dk := range dks {
					rk := rowKey(dk)
					old, xfer, ok, err := w.getRow(rk)
					if err != nil {
						return err
					}
					if !ok || !old.Status.Terminal() {
						return fmt.Errorf("%w: tombstone index entry for %q without a terminal row", ErrCorrupt, dk)
					}
					if err := w.write(rk, &old, xfer, nil, false, nil); err != nil {
						return err
					}
				}
				n += len(dks)
			}
			if n < GCBatchRows {
				m, err := w.expireBundles(tombCut, GCBatchRows-n)
				if err != nil {
					return err
				}
				n += m
			}
			w.expired += n
			return nil
		})
		total += n
		if err != nil || n < GCBatchRows {
			return total, err
		}
	}
}

// RunTombstoneGC calls ExpireTombstones every interval and PackTombstones
// every Options.PackInterval until ctx ends, then returns nil. While a
// pack call reports a full page (more rows may wait, as after upgrading
// a big format 2 file) it calls PackTombstones again at once, but runs a
// due ExpireTombstones first, so packing never holds off expiry longer
// than one page. Errors are logged and the loop goes on; after Close it
// returns the ErrClosed error.
func (s *Store) RunTombstoneGC(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	p := time.NewTicker(s.opts.PackInterval)
	defer p.Stop()
	now := make(chan time.Time, 1) // ready while pack pages are full
	more := false
	for {
		what := "tombstone sweep"
		var n int
		var err error
		pack := p.C
		if more {
			select {
			case now <- time.Time{}:
			default:
			}
			pack = now
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		default:
			// No sweep due: wait for either.
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
			case <-pack:
				what = "tombstone pack"
			}
		}
		if what == "tombstone pack" {
			n, more, err = s.packPage(ctx)
		} else {
			n, err = s.ExpireTombstones(ctx)
		}
		switch {
		case err == nil:
			if n > 0 {
				s.log.Debug(what, slog.Int("rows", n))
			}
		case ctx.Err() != nil:
			return nil
		case isClosed(err):
			return err
		default:
			s.log.Warn(what+" failed", slog.Any("error", err))
		}
	}
}

func isClosed(err error) bool { return errors.Is(err, outbox.ErrClosed) }
