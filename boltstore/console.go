package boltstore

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/outbox"
)

// The calls below are an operator's read-back (issue 17 item 2): the
// attempt history kept beside each row, the row listing and the
// dead-letter purge.
//
//	attempts  dispatch_key → JSON [outbox.Attempt…], at most outbox.MaxAttemptHistory
//
// The attempts bucket is created at Open when missing (files written
// before it) and is not part of the indexed layout (codec.go): Check does
// not count it, and an entry whose row is gone is harmless (the row's
// removal deletes it in the same transaction; see wtx.write).
var bucketAttempts = []byte("attempts")

// ensureAttemptsBucket creates the attempts bucket in an existing or new
// file (initFile's transaction).
func ensureAttemptsBucket(tx *bolt.Tx) error {
	if _, err := tx.CreateBucketIfNotExists(bucketAttempts); err != nil {
		return fmt.Errorf("create bucket %q: %w", bucketAttempts, err)
	}
	return nil
}

// settleRecording is settle that also appends the settled attempt to the
// row's history, in the same transaction, when the change applies.
func (s *Store) settleRecording(ctx context.Context, what, dispatchKey string, outcome outbox.AttemptOutcome,
	code int, errText string, now time.Time, change func(r *outbox.Row) bool) error {
	rk := rowKey(dispatchKey)
	return s.submit(ctx, what, 1, func(w *wtx) error {
		old, xfer, ok, err := w.getRow(rk)
		if err != nil || !ok {
			return err
		}
		nw := old
		if !change(&nw) {
			return nil
		}
		if err := w.write(rk, &old, xfer, &nw, false, nil); err != nil {
			return err
		}
		return w.recordAttempt(rk, outbox.SettledAttempt(&old, outcome, code, errText, now))
	})
}

// recordAttempt appends a to the history of the row at rk.
func (w *wtx) recordAttempt(rk []byte, a outbox.Attempt) error {
	bk := w.tx.Bucket(bucketAttempts)
	if bk == nil {
		return fmt.Errorf("%w: bucket %q missing", ErrCorrupt, bucketAttempts)
	}
	var hist []outbox.Attempt
	v := bk.Get(rk)
	if v == nil && a.Outcome == outbox.AttemptDone {
		return nil // delivered at the first try: nothing to keep (outbox.Attempt)
	}
	if v != nil {
		if err := json.Unmarshal(v, &hist); err != nil {
			return fmt.Errorf("%w: attempts of %q: %w", ErrCorrupt, rk, err)
		}
	}
	enc, err := json.Marshal(outbox.RecordAttempt(hist, a))
	if err != nil {
		return err
	}
	return bk.Put(rk, enc)
}

// deleteAttempts removes the history of a row being removed.
func (w *wtx) deleteAttempts(rk []byte) error {
	if bk := w.tx.Bucket(bucketAttempts); bk != nil {
		return bk.Delete(rk)
	}
	return nil
}

// Attempts returns the row's last attempts (at most
// outbox.MaxAttemptHistory), oldest first; none (nil error) for a key
// without history. Cost: one lookup.
func (s *Store) Attempts(ctx context.Context, dispatchKey string) ([]outbox.Attempt, error) {
	var out []outbox.Attempt
	err := s.view(ctx, "read attempts", func(tx *bolt.Tx, _ buckets) error {
		bk := tx.Bucket(bucketAttempts)
		if bk == nil {
			return nil
		}
		v := bk.Get(rowKey(dispatchKey))
		if v == nil {
			return nil
		}
		if err := json.Unmarshal(v, &out); err != nil {
			return fmt.Errorf("%w: attempts of %q: %w", ErrCorrupt, dispatchKey, err)
		}
		return nil
	})
	return out, err
}

// ListRows returns a page of the rows (any shard, live and tombstones)
// passing q's filters, ordered by dispatch_key after q.After (see
// outbox.RowQuery, outbox.RowPage). It walks the rows bucket from the
// cursor and examines at most q.MaxScan rows (outbox.DefaultMaxScan if
// ≤ 0), so a selective filter answers a short page whose Next goes on
// where the scan stopped. Cost: one seek plus the rows examined, in one
// short read transaction.
func (s *Store) ListRows(ctx context.Context, q outbox.RowQuery) (outbox.RowPage, error) {
	var page outbox.RowPage
	if q.Limit <= 0 {
		return page, s.checkOpen("list rows")
	}
	budget := cmp.Or(max(q.MaxScan, 0), outbox.DefaultMaxScan)
	err := s.view(ctx, "list rows", func(_ *bolt.Tx, b buckets) error {
		page = outbox.RowPage{}
		c := b.rows.Cursor()
		k, v := c.Seek(rowKey(q.After))
		if k != nil && bytes.Equal(k, rowKey(q.After)) {
			k, v = c.Next()
		}
		for scanned := 0; k != nil; k, v = c.Next() {
			if scanned == budget {
				return nil
			}
			scanned++
			page.Next = string(k)
			row, err := decodeRow(k, v)
			if err != nil {
				return fmt.Errorf("%w: %w", ErrCorrupt, err)
			}
			if !q.Matches(&row) {
				continue
			}
			page.Rows = append(page.Rows, row)
			if len(page.Rows) == q.Limit {
				if nk, _ := c.Next(); nk == nil {
					page.Next = ""
				}
				return nil
			}
		}
		page.Next = ""
		return nil
	})
	if err != nil {
		return outbox.RowPage{}, err
	}
	return page, nil
}

// PurgeDeadLetters turns dead letters of namespace into cancelled
// tombstones (outbox.ApplyPurge): keys nil purges every one (in
// transactions of at most GCBatchRows rows), otherwise only the listed
// keys that are failed rows of that namespace. It returns how many it
// purged.
func (s *Store) PurgeDeadLetters(ctx context.Context, namespace string, keys []string, now time.Time) (int, error) {
	return s.settleDeadLetters(ctx, "purge dead letters", namespace, keys, cmp.Or(now, s.now()), outbox.ApplyPurge)
}
