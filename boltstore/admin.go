package boltstore

import (
	"bytes"
	"context"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/internal/bincodec"
	"github.com/fairshard/fairshard/outbox"
)

// ListDeadLetters returns up to limit failed rows of namespace (any shard)
// whose dispatch_key sorts strictly after afterKey, ordered by dispatch_key:
// pass the last key of one page as afterKey of the next ("" starts at the
// beginning). limit ≤ 0 returns nothing. It has no byte bound: prefer
// ListDeadLetterPage wherever payloads may be large. Cost: one seek plus
// the page.
func (s *Store) ListDeadLetters(ctx context.Context, namespace, afterKey string, limit int) ([]outbox.Row, error) {
	p, err := s.ListDeadLetterPage(ctx, namespace, DeadLetterQuery{After: afterKey, Limit: limit})
	return p.Rows, err
}

// DeadLetterQuery asks for one page of a namespace's dead letters
// (outbox.DeadLetterQuery).
type DeadLetterQuery = outbox.DeadLetterQuery

// DeadLetterPage is one page of ListDeadLetterPage (outbox.DeadLetterPage).
type DeadLetterPage = outbox.DeadLetterPage

// ListDeadLetterPage returns one page of the failed rows of namespace (any
// shard) whose dispatch_key sorts strictly after q.After (and not after
// q.Through, when set), in dispatch_key order, bounded by q.Limit rows and
// q.MaxBytes bytes, with or without
// their payloads, only rows q.Keep accepts when it is set. The memory it
// uses is the page's: at most MaxBytes plus one row. Cost: one seek in the
// namespace's dead-letter index, one index step per row Keep refuses (its
// row is not read), one row lookup per row returned (and one more to tell
// More).
func (s *Store) ListDeadLetterPage(ctx context.Context, namespace string, q DeadLetterQuery) (DeadLetterPage, error) {
	var out DeadLetterPage
	if q.Limit <= 0 {
		return out, s.checkOpen("list dead letters")
	}
	err := s.view(ctx, "list dead letters", func(_ *bolt.Tx, b buckets) error {
		out = DeadLetterPage{}
		prefix := bincodec.AppendString(nil, namespace)
		size := 0
		c := b.dlq.Cursor()
		k, _ := c.Seek(dlqKey(namespace, q.After))
		for ; k != nil && bytes.HasPrefix(k, prefix); k, _ = c.Next() {
			dk := string(k[len(prefix):])
			if dk == q.After {
				continue
			}
			if q.Through != "" && dk > q.Through {
				break
			}
			if q.Keep != nil && !q.Keep(dk) {
				continue // not read: a backup's 1 MiB copy costs nothing here
			}
			if len(out.Rows) >= q.Limit {
				out.More = true
				break
			}
			rk := rowKey(dk)
			v := b.rows.Get(rk)
			if v == nil {
				return fmt.Errorf("%w: dead-letter index entry for %q without a row", ErrCorrupt, dk)
			}
			row, payloadLen, err := decodeRowPayload(rk, v, !q.WithoutPayload)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrCorrupt, err)
			}
			n := outbox.RowBytes(&row)
			if q.MaxBytes > 0 && len(out.Rows) > 0 && size+n > q.MaxBytes {
				out.More = true
				break
			}
			size += n
			out.Rows = append(out.Rows, row)
			out.PayloadBytes = append(out.PayloadBytes, payloadLen)
		}
		return nil
	})
	if err != nil {
		return DeadLetterPage{}, err
	}
	return out, nil
}

// Redrive turns failed rows of namespace back to pending in a new
// generation (outbox.ApplyRedrive: Attempt 1, LastError and FinishedAt
// cleared, VisibleAfter = now, Version.Gen + 1, so no stale copy of the
// dead letter can undo it). keys nil redrives
// every dead letter of the namespace (in transactions of at most 1000 rows);
// otherwise only the listed keys that are failed rows of that namespace
// (others are skipped). It returns the number of rows redriven.
func (s *Store) Redrive(ctx context.Context, namespace string, keys []string, now time.Time) (int, error) {
	return s.settleDeadLetters(ctx, "redrive", namespace, keys, now, outbox.ApplyRedrive)
}

// settleDeadLetters applies apply (outbox.ApplyRedrive, ApplyPurge) to
// namespace's dead letters: keys nil means every one, read from the
// dead-letter index in pages of at most GCBatchRows rows, each page in its
// own transaction; otherwise only the listed keys that are failed rows of
// that namespace (others are skipped). op names the operation in errors.
// It returns how many rows it changed.
func (s *Store) settleDeadLetters(ctx context.Context, op, namespace string, keys []string, now time.Time, apply func(*outbox.Row, time.Time) bool) (int, error) {
	if keys != nil {
		return s.settleDeadLetterKeys(ctx, op, namespace, keys, now, apply)
	}
	total := 0
	var lastFirst string
	for {
		var page []string
		err := s.view(ctx, op, func(_ *bolt.Tx, b buckets) error {
			prefix := bincodec.AppendString(nil, namespace)
			c := b.dlq.Cursor()
			for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && len(page) < GCBatchRows; k, _ = c.Next() {
				page = append(page, string(k[len(prefix):]))
			}
			return nil
		})
		if err != nil || len(page) == 0 {
			return total, err
		}
		if page[0] == lastFirst {
			// The same page twice: its rows were not changed last round.
			return total, fmt.Errorf("%w: dead-letter index lists rows that are not failed in namespace %q", ErrCorrupt, namespace)
		}
		lastFirst = page[0]
		n, err := s.settleDeadLetterKeys(ctx, op, namespace, page, now, apply)
		total += n
		if err != nil {
			return total, err
		}
	}
}

func (s *Store) settleDeadLetterKeys(ctx context.Context, op, namespace string, keys []string, now time.Time, apply func(*outbox.Row, time.Time) bool) (int, error) {
	if len(keys) == 0 {
		return 0, s.checkOpen(op)
	}
	n := 0
	err := s.submit(ctx, op, len(keys), func(w *wtx) error {
		n = 0
		for _, dk := range keys {
			rk := rowKey(dk)
			old, xfer, ok, err := w.getRow(rk)
			if err != nil {
				return err
			}
			if !ok || old.Status != outbox.StatusFailed || old.Namespace != namespace {
				continue
			}
			nw := old
			apply(&nw, now)
			if err := w.write(rk, &old, xfer, &nw, false, nil); err != nil {
				return err
			}
			n++
		}
		return nil
	})
	return n, err
}

// SaveConfigEntry durably stores value under key in the config bucket,
// replacing any previous value. The cluster layer persists its gossiped
// config through it; the store treats values as opaque bytes (copied).
// key must be 1 … MaxDispatchKeyBytes bytes (else an error wrapping
// ErrInvalidOptions, nothing written).
func (s *Store) SaveConfigEntry(ctx context.Context, key string, value []byte) error {
	if key == "" || len(key) > MaxDispatchKeyBytes {
		return fmt.Errorf("boltstore: save config entry: %w: key must be 1 to %d bytes", ErrInvalidOptions, MaxDispatchKeyBytes)
	}
	v := append([]byte{}, value...)
	return s.submit(ctx, "save config entry "+key, 1, func(w *wtx) error {
		return w.b.config.Put([]byte(key), v)
	})
}

// DeleteConfigEntry durably removes key from the config bucket; a missing
// key is a no-op.
func (s *Store) DeleteConfigEntry(ctx context.Context, key string) error {
	if key == "" {
		return s.checkOpen("delete config entry")
	}
	return s.submit(ctx, "delete config entry "+key, 1, func(w *wtx) error {
		return w.b.config.Delete([]byte(key))
	})
}

// LoadConfigEntries returns every config entry (copies).
func (s *Store) LoadConfigEntries(ctx context.Context) (map[string][]byte, error) {
	out := make(map[string][]byte)
	err := s.view(ctx, "load config entries", func(_ *bolt.Tx, b buckets) error {
		return b.config.ForEach(func(k, v []byte) error {
			out[string(k)] = append([]byte{}, v...)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}
