package boltstore

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// findBundle returns the bundle of shard whose key range holds key: the
// last bundle whose first key is ≤ key, with c positioned on it. bk is nil
// when there is none (no bundle of the shard, or key sorts before the
// first one).
//
// bbolt's Cursor.Prev stops at a leaf emptied earlier in the same write
// transaction and returns nil (v1.5.0: prev does not skip empty pages as
// next does), so the predecessor it finds is verified with Next, and
// the shard's bundles are walked from the first when it cannot be.
func findBundle(c *bolt.Cursor, shard uint32, key string) (bk, v []byte) {
	want := bundleKey(shard, key)
	prefix := want[:4]
	k, val := c.Seek(want)
	if k != nil && bytes.Equal(k, want) {
		return k, val
	}
	after := k
	var pk []byte
	if k == nil {
		pk, _ = c.Last()
	} else {
		pk, _ = c.Prev()
	}
	if pk != nil {
		if nk, _ := c.Next(); bytes.Equal(nk, after) {
			if !bytes.HasPrefix(pk, prefix) {
				return nil, nil
			}
			return c.Seek(pk)
		}
	}
	var fk []byte
	for k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && bytes.Compare(k, want) <= 0; k, _ = c.Next() {
		fk = append(fk[:0], k...)
	}
	if fk == nil {
		return nil, nil
	}
	return c.Seek(fk)
}

// lookupBundled finds the packed record of key (of shard) in the bundles
// bucket: one seek, a binary search over the bundle's restart points and
// a walk of at most bundleRestart records.
func lookupBundled(bundles *bolt.Bucket, shard uint32, key string) (outbox.Row, bool, error) {
	bk, v := findBundle(bundles.Cursor(), shard, key)
	if bk == nil {
		return outbox.Row{}, false, nil
	}
	br, err := openBundle(bk, v)
	if err != nil {
		return outbox.Row{}, false, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	row, ok, err := br.find([]byte(key))
	if err != nil {
		return outbox.Row{}, false, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return row, ok, nil
}

// getAny is getRow that also finds packed rows: bundled reports that the
// row is a record of a bundle (a done or cancelled row), not a rows entry.
func (w *wtx) getAny(rk []byte) (row outbox.Row, xfer, ok, bundled bool, err error) {
	row, xfer, ok, err = w.getRow(rk)
	if ok || err != nil {
		return row, xfer, ok, false, err
	}
	row, ok, err = lookupBundled(w.b.bundles, shards.ShardOf(string(rk), w.shardCount), string(rk))
	if !ok || err != nil {
		return row, false, false, false, err
	}
	return row, w.marked(rk), true, true, nil
}

// isBundled reports whether key (of shard) has a packed record.
func (w *wtx) isBundled(shard uint32, key string) (bool, error) {
	_, ok, err := lookupBundled(w.b.bundles, shard, key)
	return ok, err
}

// changeBundles adds rows to shard's bundles (sorted by key, none of them
// packed already) and removes the records of keys (packed). Every bundle
// touched is decoded, changed, encoded again (split at bundleMaxBytes)
// and its bexp entry replaced. Counters and digests are the caller's:
// packing moves a row without changing it, and a removal goes on through
// wtx.write.
func (w *wtx) changeBundles(shard uint32, add []outbox.Row, remove []string) error {
	type group struct {
		oldKey []byte
		adds   []outbox.Row
		rm     map[string]bool
	}
	groups := map[string]*group{}
	var order []string
	c := w.b.bundles.Cursor()
	at := func(key string, orFirst bool) (*group, error) {
		bk, _ := findBundle(c, shard, key)
		if bk == nil && orFirst {
			prefix := appendShard(nil, shard)
			if k, _ := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) {
				bk = k
			}
		}
		if bk == nil && !orFirst {
			return nil, fmt.Errorf("%w: no bundle of shard %d holds %q", ErrCorrupt, shard, key)
		}
		g := groups[string(bk)]
		if g == nil {
			g = &group{rm: map[string]bool{}}
			if bk != nil {
				g.oldKey = append([]byte(nil), bk...)
			}
			groups[string(bk)] = g
			order = append(order, string(bk))
		}
		return g, nil
	}
	for i := range add {
		g, err := at(add[i].DispatchKey, true)
		if err != nil {
			return err
		}
		g.adds = append(g.adds, add[i])
	}
	for _, k := range remove {
		g, err := at(k, false)
		if err != nil {
			return err
		}
		g.rm[k] = true
	}
	for _, gk := range order {
		g := groups[gk]
		var old []outbox.Row
		if g.oldKey != nil {
			br, err := openBundle(g.oldKey, w.b.bundles.Get(g.oldKey))
			if err != nil {
				return fmt.Errorf("%w: %w", ErrCorrupt, err)
			}
			if old, err = br.all(); err != nil {
				return fmt.Errorf("%w: %w", ErrCorrupt, err)
			}
			if err := w.deleteBundle(g.oldKey, old); err != nil {
				return err
			}
		}
		merged := make([]outbox.Row, 0, len(old)+len(g.adds))
		removed := 0
		i, j := 0, 0
		for i < len(old) || j < len(g.adds) {
			switch {
			case j == len(g.adds) || (i < len(old) && old[i].DispatchKey < g.adds[j].DispatchKey):
				if g.rm[old[i].DispatchKey] {
					removed++
				} else {
					merged = append(merged, old[i])
				}
				i++
			case i == len(old) || g.adds[j].DispatchKey < old[i].DispatchKey:
				merged = append(merged, g.adds[j])
				j++
			default:
				return fmt.Errorf("%w: %q is packed already in shard %d", ErrCorrupt, old[i].DispatchKey, shard)
			}
		}
		if removed != len(g.rm) {
			return fmt.Errorf("%w: shard %d: %d of %d keys to unpack are not in their bundle", ErrCorrupt, shard, len(g.rm)-removed, len(g.rm))
		}
		for _, eb := range encodeBundles(shard, merged) {
			if err := w.b.bundles.Put(eb.key, eb.val); err != nil {
				return fmt.Errorf("store bundle of shard %d: %w", shard, err)
			}
			if err := w.b.bexp.Put(bexpKey(eb.earliest, eb.key), present); err != nil {
				return fmt.Errorf("store bundle expiry of shard %d: %w", shard, err)
			}
		}
	}
	return nil
}

// deleteBundle removes a bundle and its bexp entry (rows: its records).
func (w *wtx) deleteBundle(bk []byte, rows []outbox.Row) error {
	var earliest time.Time
	for i := range rows {
		if i == 0 || rows[i].FinishedAt.Before(earliest) {
			earliest = rows[i].FinishedAt
		}
	}
	if err := w.b.bexp.Delete(bexpKey(earliest, bk)); err != nil {
		return err
	}
	return w.b.bundles.Delete(bk)
}

// unbundle removes one packed row's record (the row goes on through
// wtx.write: deleted, or rewritten as a rows entry).
func (w *wtx) unbundle(r *outbox.Row) error {
	return w.changeBundles(r.Shard, nil, []string{r.DispatchKey})
}

// roundTrips reports whether r, packed alone, decodes to exactly r.
func roundTrips(r *outbox.Row) bool {
	bw := newBundleWriter(r.FinishedAt.UnixNano())
	bw.add(r)
	br, err := openBundle(bundleKey(r.Shard, r.DispatchKey), bw.value())
	if err != nil {
		return false
	}
	got, err := br.all()
	return err == nil && len(got) == 1 && sameRow(&got[0], r)
}

// PackTombstones moves slim done and cancelled rows (every one the
// tombstone index lists) into their shards' bundles (see bundle.go), in
// transactions of at most GCBatchRows rows queued like any other write. A
// packed row is the same row to every reader (Get, Merge, ReadShard,
// ListRows, the digests and counters do not change); it stops costing
// its rows entry and two index entries (~280 bytes with 28-byte keys)
// and costs ~20 bytes of a bundle instead. Rows that would not decode to
// exactly themselves stay rows. It returns the number of rows packed.
// The tombstone GC loop (RunTombstoneGC) calls it every PackInterval.
func (s *Store) PackTombstones(ctx context.Context) (int, error) {
	total := 0
	var after []byte
	for {
		n, examined := 0, 0
		var next []byte
		err := s.submit(ctx, "pack tombstones", GCBatchRows, func(w *wtx) error {
			n, examined, next = 0, 0, nil
			var rks [][]byte
			c := w.b.tombs.Cursor()
			k, _ := c.First()
			if after != nil {
				k, _ = c.Seek(after)
				if bytes.Equal(k, after) {
					k, _ = c.Next()
				}
			}
			for ; k != nil && len(rks) < GCBatchRows; k, _ = c.Next() {
				if len(k) < timeKeyLen {
					return fmt.Errorf("%w: tombstone index key %x", ErrCorrupt, k)
				}
				rks = append(rks, rowKey(string(k[timeKeyLen:])))
				next = append(next[:0], k...)
			}
			examined = len(rks)
			byShard := map[uint32][]outbox.Row{}
			for _, rk := range rks {
				row, _, ok, err := w.getRow(rk)
				if err != nil {
					return err
				}
				if !ok || (row.Status != outbox.StatusDone && row.Status != outbox.StatusCancelled) {
					return fmt.Errorf("%w: tombstone index entry for %q without a done or cancelled row", ErrCorrupt, rk)
				}
				if !packable(&row) || !roundTrips(&row) {
					continue
				}
				byShard[row.Shard] = append(byShard[row.Shard], row)
			}
			for shard, rows := range byShard {
				slices.SortFunc(rows, func(a, b outbox.Row) int { return cmp.Compare(a.DispatchKey, b.DispatchKey) })
				if err := w.changeBundles(shard, rows, nil); err != nil {
					return err
				}
				for i := range rows {
					r := &rows[i]
					k := keysOf(r, false)
					for _, del := range []struct {
						b   *bolt.Bucket
						key []byte
					}{{w.b.rows, rowKey(r.DispatchKey)}, {w.b.byShard, k.byShard}, {w.b.tombs, k.tomb}} {
						if err := del.b.Delete(del.key); err != nil {
							return fmt.Errorf("pack row %q: %w", r.DispatchKey, err)
						}
					}
				}
				n += len(rows)
			}
			w.packed += n
			return nil
		})
		total += n
		if err != nil || examined < GCBatchRows {
			return total, err
		}
		// The rows left unpacked stay in the index: go on after them.
		after = next
	}
}

// expireBundles removes the packed rows finished before cut, bundle by
// bundle from the earliest (the bexp index), within one transaction: at
// most limit rows. It returns the rows removed.
func (w *wtx) expireBundles(cut time.Time, limit int) (int, error) {
	var bks [][]byte
	c := w.b.bexp.Cursor()
	for k, _ := c.First(); k != nil && len(bks) < limit; k, _ = c.Next() {
		if len(k) < timeKeyLen+4 {
			return 0, fmt.Errorf("%w: bundle expiry key %x", ErrCorrupt, k)
		}
		if !decodeTimeKey(k).Before(cut) {
			break
		}
		bks = append(bks, append([]byte(nil), k[timeKeyLen:]...))
	}
	n := 0
	for _, bk := range bks {
		if n >= limit {
			break
		}
		v := w.b.bundles.Get(bk)
		if v == nil {
			return n, fmt.Errorf("%w: bundle expiry entry for %x without a bundle", ErrCorrupt, bk)
		}
		br, err := openBundle(bk, v)
		if err != nil {
			return n, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		rows, err := br.all()
		if err != nil {
			return n, fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		var gone []outbox.Row
		var keys []string
		for i := range rows {
			if rows[i].FinishedAt.Before(cut) && n+len(gone) < limit {
				gone = append(gone, rows[i])
				keys = append(keys, rows[i].DispatchKey)
			}
		}
		if len(gone) == 0 {
			return n, fmt.Errorf("%w: bundle %x listed as expiring holds no row finished before %s", ErrCorrupt, bk, cut)
		}
		if err := w.changeBundles(br.shard, nil, keys); err != nil {
			return n, err
		}
		for i := range gone {
			rk := rowKey(gone[i].DispatchKey)
			if err := w.write(rk, &gone[i], w.marked(rk), nil, false, nil); err != nil {
				return n, err
			}
		}
		n += len(gone)
	}
	return n, nil
}
