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
// last bundle whose first key is ≤ key. bk is nil when there is none (no
// bundle of the shard, or key sorts before the first one). c is left
// anywhere: a caller that walks on from bk seeks it first.
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
	var pk, pv []byte
	if k == nil {
		pk, pv = c.Last()
	} else {
		pk, pv = c.Prev()
	}
	if pk != nil {
		if nk, _ := c.Next(); bytes.Equal(nk, after) {
			if !bytes.HasPrefix(pk, prefix) {
				return nil, nil
			}
			return pk, pv
		}
	}
	var fk, fv []byte
	for k, v := c.Seek(prefix); k != nil && bytes.HasPrefix(k, prefix) && bytes.Compare(k, want) <= 0; k, v = c.Next() {
		fk, fv = k, v
	}
	return fk, fv
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
	if w.noBundles() {
		return outbox.Row{}, false, false, false, nil
	}
	row, ok, err = lookupBundled(w.b.bundles, shards.ShardOf(string(rk), w.shardCount), string(rk))
	if !ok || err != nil {
		return row, false, false, false, err
	}
	return row, w.marked(rk), true, true, nil
}

// noBundles reports whether the bundles bucket is empty, checked once per
// transaction (bundleState), so a store with nothing packed pays one
// cursor step per transaction and no bundle lookups.
func (w *wtx) noBundles() bool {
	if w.bundleState == 0 {
		w.bundleState = 2
		if k, _ := w.b.bundles.Cursor().First(); k == nil {
			w.bundleState = 1
		}
	}
	return w.bundleState == 1
}

// isBundled reports whether key (of shard) has a packed record; a store
// with nothing packed skips the lookup (noBundles).
func (w *wtx) isBundled(shard uint32, key string) (bool, error) {
	if w.noBundles() {
		return false, nil
	}
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
	w.bundleState = 2 // bundles may exist from here on
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
		for _, eb := range encodeBundles(shard, merged, w.tx.DB().Info().PageSize) {
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

// roundTrips reports whether r, packed alone, decodes to exactly r
// (what packable promises; the tests hold every shape of row to it).
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

// Pack pass sizes: a call reads up to packScanRows keys of the tombstone
// index (one page), groups them by shard and packs them in transactions of whole
// shards holding at most packTxRows rows, so a bundle is rewritten at
// most once per pass (not once per transaction: a 1,000-row transaction
// touches most shards).
const (
	packScanRows = 50_000
	packTxRows   = 1024
)

// PackTombstones moves slim done and cancelled rows listed by the
// tombstone index into their shards' bundles (see bundle.go), one page
// per call: it reads at most packScanRows (50,000) keys of the index,
// after where the previous call's full page ended (from the start after
// a page that was not full), and packs them in transactions of whole
// shards (at most packTxRows rows each), queued like any other write;
// so one call is bounded however many rows wait (a format 2 file just
// upgraded) and the caller can interleave expiry. Calling it until it
// returns 0 packs everything (except in the rare case of a full page
// whose rows all stay rows, which returns 0 while more may follow;
// RunTombstoneGC goes on past it). A packed row is the same row to every reader
// (Get, Merge, ReadShard, ListRows, the digests and counters do not
// change); it stops costing its rows entry and two index entries (~280
// bytes with 28-byte keys) and costs ~20 bytes of a bundle instead. Rows
// that would not decode to exactly themselves stay rows. It returns the
// number of rows packed. The tombstone GC loop (RunTombstoneGC) calls it
// every PackInterval, and again at once while a call read a full page
// (letting a due expiry sweep run first).
func (s *Store) PackTombstones(ctx context.Context) (int, error) {
	n, _, err := s.packPage(ctx)
	return n, err
}

// packPage is one PackTombstones call; more reports that the page was
// full (the index may hold more keys after it: call again soon).
func (s *Store) packPage(ctx context.Context) (total int, more bool, err error) {
	s.packMu.Lock()
	defer s.packMu.Unlock()
	after := s.packAfter
	{
		var byShard map[uint32][][]byte
		var last []byte
		scanned := 0
		err := s.view(ctx, "pack tombstones: read the index", func(_ *bolt.Tx, b buckets) error {
			byShard = map[uint32][][]byte{}
			c := b.tombs.Cursor()
			k, _ := c.First()
			if after != nil {
				k, _ = c.Seek(after)
				if bytes.Equal(k, after) {
					k, _ = c.Next()
				}
			}
			for ; k != nil && scanned < s.packPageRows; k, _ = c.Next() {
				if len(k) < timeKeyLen {
					return fmt.Errorf("%w: tombstone index key %x", ErrCorrupt, k)
				}
				rk := rowKey(string(k[timeKeyLen:]))
				shard := shards.ShardOf(string(rk), s.opts.ShardCount)
				byShard[shard] = append(byShard[shard], rk)
				last = append(last[:0], k...)
				scanned++
			}
			return nil
		})
		if err != nil {
			return total, false, err
		}
		order := make([]uint32, 0, len(byShard))
		for shard := range byShard {
			order = append(order, shard)
		}
		slices.Sort(order)
		for len(order) > 0 {
			n, batch := 0, 0
			for batch < len(order) && (batch == 0 || n+len(byShard[order[batch]]) <= packTxRows) {
				n += len(byShard[order[batch]])
				batch++
			}
			packed, err := s.packShards(ctx, order[:batch], byShard, n)
			total += packed
			if err != nil {
				return total, false, err
			}
			order = order[batch:]
		}
		if scanned < s.packPageRows {
			s.packAfter = nil
			return total, false, nil
		}
		// The rows left unpacked stay in the index: the next call goes
		// on after them.
		s.packAfter = last
		return total, true, nil
	}
}

// packShards packs, in one transaction, the rows of keys (by shard) that
// are still slim done or cancelled rows and round-trip; rows changed or
// gone since the index was read are skipped. It returns the rows packed.
func (s *Store) packShards(ctx context.Context, order []uint32, keys map[uint32][][]byte, rows int) (int, error) {
	n := 0
	err := s.submit(ctx, "pack tombstones", rows, func(w *wtx) error {
		n = 0
		for _, shard := range order {
			var pack []outbox.Row
			for _, rk := range keys[shard] {
				row, _, ok, err := w.getRow(rk)
				if err != nil {
					return err
				}
				if !ok || !packable(&row) {
					continue
				}
				pack = append(pack, row)
			}
			if len(pack) == 0 {
				continue
			}
			slices.SortFunc(pack, func(a, b outbox.Row) int { return cmp.Compare(a.DispatchKey, b.DispatchKey) })
			if err := w.changeBundles(shard, pack, nil); err != nil {
				return err
			}
			for i := range pack {
				r := &pack[i]
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
			n += len(pack)
		}
		w.packed += n
		return nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
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
