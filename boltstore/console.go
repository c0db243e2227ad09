package boltstore

import (
	"bytes"
	"cmp"
	"container/heap"
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

// ListRows returns a page of the rows (any shard, live and tombstones,
// packed or not) passing q's filters, ordered by dispatch_key after
// q.After (see outbox.RowQuery, outbox.RowPage). It merges the rows
// bucket with every shard's packed rows (a k-way merge over the shards'
// bundles) from the cursor and examines at most q.MaxScan rows
// (outbox.DefaultMaxScan if ≤ 0), so a selective filter answers a short
// page whose Next goes on where the scan stopped. Cost: one seek in the
// rows bucket and one per shard holding packed rows (plus decoding one
// bundle each), then the rows examined, in one short read transaction.
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
		packed, err := packedFrom(b, s.opts.ShardCount, q.After)
		if err != nil {
			return err
		}
		for scanned := 0; k != nil || packed.Len() > 0; {
			if scanned == budget {
				return nil
			}
			scanned++
			var row outbox.Row
			if k != nil && (packed.Len() == 0 || string(k) < packed.heads[0].cur().DispatchKey) {
				if row, err = decodeRow(k, v); err != nil {
					return fmt.Errorf("%w: %w", ErrCorrupt, err)
				}
				k, v = c.Next()
			} else {
				row = *packed.heads[0].cur()
				if err := packed.advance(); err != nil {
					return err
				}
			}
			page.Next = row.DispatchKey
			if !q.Matches(&row) {
				continue
			}
			page.Rows = append(page.Rows, row)
			if len(page.Rows) == q.Limit {
				if k == nil && packed.Len() == 0 {
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

// packedHead walks one shard's packed rows in key order, a bundle at a
// time.
type packedHead struct {
	c      *bolt.Cursor
	prefix []byte
	rows   []outbox.Row
	i      int
}

func (h *packedHead) cur() *outbox.Row { return &h.rows[h.i] }

// load decodes the bundle at (k, v) if it is the shard's; false when the
// shard has no more.
func (h *packedHead) load(k, v []byte) (bool, error) {
	if k == nil || !bytes.HasPrefix(k, h.prefix) {
		return false, nil
	}
	br, err := openBundle(k, v)
	if err != nil {
		return false, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	if h.rows, err = br.all(); err != nil {
		return false, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	h.i = 0
	return true, nil
}

// packedHeap merges the shards' packed rows by dispatch_key.
type packedHeap struct{ heads []*packedHead }

func (p *packedHeap) Len() int { return len(p.heads) }
func (p *packedHeap) Less(i, j int) bool {
	return p.heads[i].cur().DispatchKey < p.heads[j].cur().DispatchKey
}
func (p *packedHeap) Swap(i, j int) { p.heads[i], p.heads[j] = p.heads[j], p.heads[i] }
func (p *packedHeap) Push(x any)    { p.heads = append(p.heads, x.(*packedHead)) }
func (p *packedHeap) Pop() any {
	x := p.heads[len(p.heads)-1]
	p.heads = p.heads[:len(p.heads)-1]
	return x
}

// advance moves the smallest head on.
func (p *packedHeap) advance() error {
	h := p.heads[0]
	h.i++
	if h.i == len(h.rows) {
		more, err := h.load(h.c.Next())
		if err != nil {
			return err
		}
		if !more {
			heap.Pop(p)
			return nil
		}
	}
	heap.Fix(p, 0)
	return nil
}

// packedFrom positions a head on every shard's first packed row after
// the key after.
func packedFrom(b buckets, shardCount uint32, after string) (*packedHeap, error) {
	p := &packedHeap{}
	if k, _ := b.bundles.Cursor().First(); k == nil {
		return p, nil
	}
	for shard := range shardCount {
		h := &packedHead{c: b.bundles.Cursor(), prefix: appendShard(nil, shard)}
		k, _ := findBundle(h.c, shard, after)
		var v []byte
		if k == nil {
			k, v = h.c.Seek(h.prefix)
		} else {
			k, v = h.c.Seek(k)
		}
		for {
			more, err := h.load(k, v)
			if err != nil {
				return nil, err
			}
			if !more {
				break
			}
			for h.i < len(h.rows) && h.rows[h.i].DispatchKey <= after {
				h.i++
			}
			if h.i < len(h.rows) {
				p.heads = append(p.heads, h)
				break
			}
			k, v = h.c.Next()
		}
	}
	heap.Init(p)
	return p, nil
}

// PurgeDeadLetters turns dead letters of namespace into cancelled
// tombstones (outbox.ApplyPurge): keys nil purges every one (in
// transactions of at most GCBatchRows rows), otherwise only the listed
// keys that are failed rows of that namespace. It returns how many it
// purged.
func (s *Store) PurgeDeadLetters(ctx context.Context, namespace string, keys []string, now time.Time) (int, error) {
	return s.settleDeadLetters(ctx, "purge dead letters", namespace, keys, cmp.Or(now, s.now()), outbox.ApplyPurge)
}
