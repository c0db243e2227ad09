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

// The calls below are an operator's read-back: the attempt history kept
// beside each row, the row listing and the dead-letter purge.
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
// rows bucket and one per shard holding packed rows, then the rows
// examined, in one short read transaction; a bundle is decoded only when
// the merge reaches its keys (about one bundle per 100 packed rows the
// page examines, not one per shard).
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
		for scanned := 0; ; {
			if err := packed.settle(k); err != nil {
				return err
			}
			if k == nil && packed.Len() == 0 {
				break
			}
			if scanned == budget {
				return nil
			}
			scanned++
			var row outbox.Row
			if k != nil && (packed.Len() == 0 || string(k) < packed.heads[0].key()) {
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

// packedHead walks one shard's packed rows after a key, in key order, a
// bundle at a time. A bundle is decoded lazily: until then (rows nil) the
// head stands at a lower bound of its keys (lo: the bundle's first key,
// or the key the walk starts after), which is enough to order the heap.
type packedHead struct {
	c      *bolt.Cursor
	prefix []byte
	after  string
	bk, bv []byte // the bundle not decoded yet (rows nil)
	lo     string
	rows   []outbox.Row
	i      int
}

func (h *packedHead) cur() *outbox.Row { return &h.rows[h.i] }

// key is the head's current key if its bundle is decoded, else a lower
// bound of the keys it holds.
func (h *packedHead) key() string {
	if h.rows != nil {
		return h.rows[h.i].DispatchKey
	}
	return h.lo
}

// at places the head on the bundle (k, v) without decoding it; false
// when it is not the shard's (the shard has no more).
func (h *packedHead) at(k, v []byte) bool {
	if k == nil || !bytes.HasPrefix(k, h.prefix) {
		return false
	}
	h.bk, h.bv, h.rows, h.i = k, v, nil, 0
	h.lo = max(string(k[len(h.prefix):]), h.after)
	return true
}

// load decodes the head's bundle, skipping rows ≤ after; false when the
// shard has no more rows (every later bundle was empty after after).
func (h *packedHead) load() (bool, error) {
	for {
		br, err := openBundle(h.bk, h.bv)
		if err != nil {
			return false, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		rows, err := br.all()
		if err != nil {
			return false, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		i := 0
		for i < len(rows) && rows[i].DispatchKey <= h.after {
			i++
		}
		if i < len(rows) {
			h.rows, h.i = rows, i
			return true, nil
		}
		if !h.at(h.c.Next()) {
			return false, nil
		}
	}
}

// packedHeap merges the shards' packed rows by dispatch_key.
type packedHeap struct {
	heads []*packedHead
	loads int // bundles decoded (for the tests)
}

func (p *packedHeap) Len() int { return len(p.heads) }
func (p *packedHeap) Less(i, j int) bool {
	return p.heads[i].key() < p.heads[j].key()
}
func (p *packedHeap) Swap(i, j int) { p.heads[i], p.heads[j] = p.heads[j], p.heads[i] }
func (p *packedHeap) Push(x any)    { p.heads = append(p.heads, x.(*packedHead)) }
func (p *packedHeap) Pop() any {
	x := p.heads[len(p.heads)-1]
	p.heads = p.heads[:len(p.heads)-1]
	return x
}

// settle decodes the smallest head's bundle while it is not decoded and
// its lower bound is not above k (k nil: always), so that the smallest
// head is decoded whenever the merge takes a packed row next. Heads
// whose bundles are not reached stay undecoded.
func (p *packedHeap) settle(k []byte) error {
	for len(p.heads) > 0 && p.heads[0].rows == nil && (k == nil || p.heads[0].lo <= string(k)) {
		p.loads++
		more, err := p.heads[0].load()
		if err != nil {
			return err
		}
		if !more {
			heap.Pop(p)
			continue
		}
		heap.Fix(p, 0)
	}
	return nil
}

// advance moves the smallest head (decoded) on; at the end of its bundle
// it stands on the shard's next bundle, undecoded.
func (p *packedHeap) advance() error {
	h := p.heads[0]
	h.i++
	if h.i == len(h.rows) && !h.at(h.c.Next()) {
		heap.Pop(p)
		return nil
	}
	heap.Fix(p, 0)
	return nil
}

// packedFrom positions a head on every shard's bundle holding the first
// packed key after the key after, without decoding any bundle's rows (a
// bundle that may hold keys ≤ after is searched for its first key after
// it by its restart points).
func packedFrom(b buckets, shardCount uint32, after string) (*packedHeap, error) {
	p := &packedHeap{}
	if k, _ := b.bundles.Cursor().First(); k == nil {
		return p, nil
	}
	for shard := range shardCount {
		h := &packedHead{c: b.bundles.Cursor(), prefix: appendShard(nil, shard), after: after}
		k, _ := findBundle(h.c, shard, after)
		var v []byte
		if k == nil {
			k, v = h.c.Seek(h.prefix)
		} else {
			k, v = h.c.Seek(k)
		}
		// A bundle that may hold keys ≤ after: its first key after
		// after, found by its restart points (keys only), is the bound.
		for ; h.at(k, v); k, v = h.c.Next() {
			if h.lo > after {
				p.heads = append(p.heads, h)
				break
			}
			br, err := openBundle(k, v)
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
			}
			first, ok, err := br.firstKeyAfter([]byte(after))
			if err != nil {
				return nil, fmt.Errorf("%w: %w", ErrCorrupt, err)
			}
			if ok {
				h.lo = first
				p.heads = append(p.heads, h)
				break
			}
		}
	}
	heap.Init(p)
	return p, nil
}

// firstKeyAfter returns the bundle's first key greater than after:
// binary search over the restart points, then a walk of at most
// bundleRestart keys (other fields skipped, no row built).
func (br *bundleReader) firstKeyAfter(after []byte) (string, bool, error) {
	lo, hi := 0, len(br.restarts)/4
	for lo < hi {
		mid := (lo + hi) / 2
		if err := br.seekRestart(mid); err != nil {
			return "", false, err
		}
		if err := br.nextKey(); err != nil {
			return "", false, err
		}
		if bytes.Compare(br.key, after) <= 0 {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if err := br.seekRestart(max(lo-1, 0)); err != nil {
		return "", false, err
	}
	for br.i < br.n {
		if err := br.nextKey(); err != nil {
			return "", false, err
		}
		if bytes.Compare(br.key, after) > 0 {
			return string(br.key), true, nil
		}
		if err := br.rest(nil); err != nil {
			return "", false, err
		}
	}
	return "", false, nil
}

// PurgeDeadLetters turns dead letters of namespace into cancelled
// tombstones (outbox.ApplyPurge): keys nil purges every one (in
// transactions of at most GCBatchRows rows), otherwise only the listed
// keys that are failed rows of that namespace. It returns how many it
// purged.
func (s *Store) PurgeDeadLetters(ctx context.Context, namespace string, keys []string, now time.Time) (int, error) {
	return s.settleDeadLetters(ctx, "purge dead letters", namespace, keys, cmp.Or(now, s.now()), outbox.ApplyPurge)
}
