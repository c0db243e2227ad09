package boltstore

import (
	"bytes"
	"fmt"

	"github.com/fairshard/fairshard/outbox"
	bolt "go.etcd.io/bbolt"
)

// buckets holds one transaction's handles on every bucket.
type buckets struct {
	rows, byShard, pending, claimed, tombs, dead, dlq, transfer, routes, ns, nsShard, shards, config, meta, digests,
	bundles, bexp *bolt.Bucket
}

func openBuckets(tx *bolt.Tx) (buckets, error) {
	var b buckets
	ptrs := []**bolt.Bucket{&b.rows, &b.byShard, &b.pending, &b.claimed, &b.tombs, &b.dead, &b.dlq,
		&b.transfer, &b.routes, &b.ns, &b.nsShard, &b.shards, &b.config, &b.meta, &b.digests, &b.bundles, &b.bexp}
	for i, name := range allBuckets {
		bk := tx.Bucket(name)
		if bk == nil {
			return b, fmt.Errorf("%w: bucket %q missing", ErrCorrupt, name)
		}
		*ptrs[i] = bk
	}
	return b, nil
}

type nsShard struct {
	ns    string
	shard uint32
}

// wtx is one write transaction of the writer goroutine. Every row change
// goes through write, which keeps all indexes in step with the row and
// accumulates counter deltas; flush applies the deltas once per commit, so a
// batch of 1000 rows of one namespace costs one counter update, not 1000.
type wtx struct {
	tx *bolt.Tx
	b  buckets
	// shardCount is the store's shard_count (packed rows are found by
	// their shard).
	shardCount uint32

	dNS      map[string]counts  // namespace → delta (nsCountsLen)
	dNSShard map[nsShard]counts // (namespace, shard) → delta (nssCountsLen)
	dShard   map[uint32]counts  // shard → delta (shCountsLen)
	dRoute   map[string]int64   // routeKey → delta of its "pending" entries
	dDigest  map[uint32]*digestDelta

	// xferState caches whether the transfer bucket is empty in this tx
	// (0 unknown, 1 empty, 2 maybe not), so getRow skips the mark lookup
	// in the common case of no handoff in progress.
	xferState int8
	// bundleState caches whether the bundles bucket is empty in this tx
	// (0 unknown, 1 empty, 2 maybe not), so Append and Merge skip the packed-row
	// lookup in a store with nothing packed.
	bundleState int8

	// statusDelta feeds the fairshard_store_rows gauge after commit.
	statusDelta [nsCountsLen]int64
	// expired counts tombstones removed by the sweep in this tx; packed
	// the rows the pack pass moved into bundles.
	expired int
	packed  int
}

// digestDelta is the change of one shard's digest within a transaction
// (sum wraps mod 2⁶⁴, as the digest does).
type digestDelta struct {
	rows int64
	sum  uint64
}

func newWtx(tx *bolt.Tx, shardCount uint32) (*wtx, error) {
	b, err := openBuckets(tx)
	if err != nil {
		return nil, err
	}
	// Mostly-append indexes (keys lead with a time that grows): fuller pages,
	// fewer splits. The rows bucket too: its pages are split at 90% when a
	// commit overfills them, so the leaves that slim tombstones are merged
	// into (see write) end up nearly full instead of half empty (100,000
	// tombstones take 15.4 MiB of leaves at 0.5, 10.8 MiB at 0.9).
	for _, bk := range []*bolt.Bucket{b.rows, b.byShard, b.pending, b.claimed, b.tombs, b.dead} {
		bk.FillPercent = 0.9
	}
	// Bundles are split at bundleMaxBytes (one leaf page each) and
	// rewritten in place: fill leaves fully.
	b.bundles.FillPercent = 1
	return &wtx{
		tx:         tx,
		b:          b,
		shardCount: shardCount,
		dNS:        make(map[string]counts),
		dNSShard:   make(map[nsShard]counts),
		dShard:     make(map[uint32]counts),
		dRoute:     make(map[string]int64),
		dDigest:    make(map[uint32]*digestDelta),
	}, nil
}

// getRow loads the row stored under rk, with its transfer mark. ok is false
// when there is none.
func (w *wtx) getRow(rk []byte) (row outbox.Row, xfer, ok bool, err error) {
	v := w.b.rows.Get(rk)
	if v == nil {
		return row, false, false, nil
	}
	row, err = decodeRow(rk, v)
	if err != nil {
		return row, false, false, fmt.Errorf("%w: %w", ErrCorrupt, err)
	}
	return row, w.marked(rk), true, nil
}

// marked reports whether the row under rk is marked in-transfer.
func (w *wtx) marked(rk []byte) bool {
	if w.xferState == 0 {
		w.xferState = 2
		if k, _ := w.b.transfer.Cursor().First(); k == nil {
			w.xferState = 1
		}
	}
	return w.xferState == 2 && w.b.transfer.Get(rk) != nil
}

// indexKeys are the secondary-index entries one row state owns.
type indexKeys struct {
	byShard []byte
	route   []byte // routes key, set iff pending != nil
	pending []byte
	claimed []byte
	tomb    []byte
	dead    []byte
	dlq     []byte
}

func keysOf(r *outbox.Row, xfer bool) indexKeys {
	var k indexKeys
	if r == nil {
		return k
	}
	k.byShard = byShardKey(r.Shard, r.CreatedAt, r.DispatchKey)
	switch r.Status {
	case outbox.StatusPending:
		if !xfer {
			k.route = routeKey(r.Namespace, r.TaskQueue)
			k.pending = pendingKey(k.route, r.VisibleAfter, r.DispatchKey)
		}
	case outbox.StatusClaimed:
		k.claimed = timeIndexKey(r.ClaimedAt, r.DispatchKey)
	case outbox.StatusDone, outbox.StatusCancelled:
		k.tomb = timeIndexKey(r.FinishedAt, r.DispatchKey)
	case outbox.StatusFailed:
		k.dead = timeIndexKey(r.FinishedAt, r.DispatchKey)
		k.dlq = dlqKey(r.Namespace, r.DispatchKey)
	}
	return k
}

// present is the value of every index entry. Not empty: inside a write
// transaction bbolt's Get returns nil for a key put with an empty value.
var present = []byte{1}

func swapIndex(b *bolt.Bucket, oldKey, newKey, val []byte) error {
	if bytes.Equal(oldKey, newKey) {
		return nil
	}
	if oldKey != nil {
		if err := b.Delete(oldKey); err != nil {
			return err
		}
	}
	if newKey != nil {
		if err := b.Put(newKey, val); err != nil {
			return err
		}
	}
	return nil
}

// write replaces the row stored under rk: old (nil: absent) with its transfer
// mark becomes nw (nil: delete) with its mark; nw == old (same pointer)
// changes only the mark. enc, when non-nil, is nw already encoded. Every index entry and counter follows in the same tx.
func (w *wtx) write(rk []byte, old *outbox.Row, oldXfer bool, nw *outbox.Row, newXfer bool, enc []byte) error {
	return w.writeFrom(rk, old, oldXfer, nw, newXfer, enc, false)
}

// writeFrom is write where old may be a packed row (oldPacked: a bundle
// record, already removed from its bundle by the caller, with no rows
// entry and no index entry). nw must then differ from old.
func (w *wtx) writeFrom(rk []byte, old *outbox.Row, oldXfer bool, nw *outbox.Row, newXfer bool, enc []byte, oldPacked bool) error {
	switch {
	case nw == nil:
		newXfer = false
		if err := w.b.rows.Delete(rk); err != nil {
			return err
		}
		if err := w.deleteAttempts(rk); err != nil {
			return err
		}
	case nw == old:
		// Only the transfer mark changes; the stored row stays.
	default:
		if enc == nil {
			enc = encodeRow(nil, nw)
		}
		if old != nil && outbox.IsSlim(nw) && !outbox.IsSlim(old) {
			// A row shrinking to its tombstone: delete it first, which marks
			// its leaf for bbolt's rebalance, so a leaf left under a quarter
			// full by the slimming is merged into its neighbour at commit
			// and its page freed. A Put alone rewrites the value in place and
			// never rebalances: the payload's bytes would stay allocated, as
			// empty space, for the whole tombstone retention.
			if err := w.b.rows.Delete(rk); err != nil {
				return fmt.Errorf("slim row %q: %w", nw.DispatchKey, err)
			}
		}
		if err := w.b.rows.Put(rk, enc); err != nil {
			return fmt.Errorf("store row %q: %w", nw.DispatchKey, err)
		}
	}
	if oldXfer != newXfer {
		var err error
		if newXfer {
			w.xferState = 2
			err = w.b.transfer.Put(rk, present)
		} else {
			err = w.b.transfer.Delete(rk)
		}
		if err != nil {
			return err
		}
	}
	ok, nk := keysOf(old, oldXfer), keysOf(nw, newXfer)
	if oldPacked {
		ok = indexKeys{}
	}
	var shardVal []byte
	if nw != nil {
		shardVal = appendShard(nil, nw.Shard)
	}
	for _, s := range [...]struct {
		b      *bolt.Bucket
		o, n   []byte
		newVal []byte
	}{
		{w.b.byShard, ok.byShard, nk.byShard, shardVal},
		{w.b.pending, ok.pending, nk.pending, present},
		{w.b.claimed, ok.claimed, nk.claimed, present},
		{w.b.tombs, ok.tomb, nk.tomb, present},
		{w.b.dead, ok.dead, nk.dead, present},
		{w.b.dlq, ok.dlq, nk.dlq, present},
	} {
		if err := swapIndex(s.b, s.o, s.n, s.newVal); err != nil {
			return err
		}
	}
	if !bytes.Equal(ok.route, nk.route) || (ok.pending == nil) != (nk.pending == nil) {
		if ok.route != nil {
			w.dRoute[string(ok.route)]--
		}
		if nk.route != nil {
			w.dRoute[string(nk.route)]++
		}
	}
	w.count(old, oldXfer, -1)
	w.count(nw, newXfer, +1)
	if nw != old {
		w.digest(old, -1)
		w.digest(nw, +1)
	}
	return nil
}

// digest adds (d = +1) or removes (d = -1) r's contribution to its
// shard's digest.
func (w *wtx) digest(r *outbox.Row, d int64) {
	if r == nil {
		return
	}
	dd := w.dDigest[r.Shard]
	if dd == nil {
		dd = &digestDelta{}
		w.dDigest[r.Shard] = dd
	}
	dd.rows += d
	dd.sum += uint64(d) * outbox.DigestOf(r)
}

func (w *wtx) count(r *outbox.Row, xfer bool, d int64) {
	if r == nil {
		return
	}
	i := nsIndex(r.Status)
	c := w.dNS[r.Namespace]
	if c == nil {
		c = make(counts, nsCountsLen)
		w.dNS[r.Namespace] = c
	}
	c[i] += d
	w.statusDelta[i] += d

	sc := w.dShard[r.Shard]
	if sc == nil {
		sc = make(counts, shCountsLen)
		w.dShard[r.Shard] = sc
	}
	switch r.Status {
	case outbox.StatusPending:
		sc[shPending] += d
	case outbox.StatusClaimed:
		sc[shClaimed] += d
	default:
		sc[shTerminal] += d
	}
	if xfer {
		sc[shTransfer] += d
	}

	if r.Status == outbox.StatusPending || r.Status == outbox.StatusClaimed {
		k := nsShard{r.Namespace, r.Shard}
		nc := w.dNSShard[k]
		if nc == nil {
			nc = make(counts, nssCountsLen)
			w.dNSShard[k] = nc
		}
		if r.Status == outbox.StatusPending {
			nc[nssPending] += d
		} else {
			nc[nssClaimed] += d
		}
	}
}

// flush applies the accumulated counter deltas. A counter driven below zero
// means the file's counters disagree with its rows: ErrCorrupt.
func (w *wtx) flush() error {
	for ns, d := range w.dNS {
		if err := addCounts(w.b.ns, []byte(ns), d); err != nil {
			return fmt.Errorf("namespace %q counters: %w", ns, err)
		}
	}
	for k, d := range w.dNSShard {
		if err := addCounts(w.b.nsShard, nsShardKey(k.ns, k.shard), d); err != nil {
			return fmt.Errorf("namespace %q shard %d counters: %w", k.ns, k.shard, err)
		}
	}
	for shard, d := range w.dShard {
		if err := addCounts(w.b.shards, appendShard(nil, shard), d); err != nil {
			return fmt.Errorf("shard %d counters: %w", shard, err)
		}
	}
	for shard, d := range w.dDigest {
		if err := addDigest(w.b.digests, shard, d); err != nil {
			return fmt.Errorf("shard %d digest: %w", shard, err)
		}
	}
	for rk, d := range w.dRoute {
		if err := addCounts(w.b.routes, []byte(rk), counts{d}); err != nil {
			return fmt.Errorf("route %x counter: %w", rk, err)
		}
	}
	return nil
}

func addCounts(b *bolt.Bucket, key []byte, d counts) error {
	if d.zero() {
		return nil
	}
	cur := make(counts, len(d))
	if v := b.Get(key); v != nil {
		var err error
		if cur, err = decodeCounts(v, len(d)); err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
	}
	for i := range cur {
		cur[i] += d[i]
		if cur[i] < 0 {
			return fmt.Errorf("%w: counter %d would go negative (%d)", ErrCorrupt, i, cur[i])
		}
	}
	if cur.zero() {
		return b.Delete(key)
	}
	return b.Put(key, cur.encode())
}

// addDigest applies d to a shard's stored digest. An entry whose row count
// reaches zero is deleted (its sum must then be zero too, or the file's
// digest disagrees with its rows: ErrCorrupt).
func addDigest(b *bolt.Bucket, shard uint32, d *digestDelta) error {
	if d.rows == 0 && d.sum == 0 {
		return nil
	}
	key := appendShard(nil, shard)
	var rows int64
	var sum uint64
	if v := b.Get(key); v != nil {
		var err error
		if rows, sum, err = decodeDigest(v); err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
	}
	rows += d.rows
	sum += d.sum
	switch {
	case rows < 0:
		return fmt.Errorf("%w: digest row count would go negative (%d)", ErrCorrupt, rows)
	case rows == 0 && sum != 0:
		return fmt.Errorf("%w: digest of an empty shard has sum %x", ErrCorrupt, sum)
	case rows == 0:
		return b.Delete(key)
	}
	return b.Put(key, digestVal(rows, sum))
}
