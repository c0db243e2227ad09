package boltstore

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/fairshard/fairshard/internal/bincodec"
	"github.com/fairshard/fairshard/outbox"
)

// Bundles (file format 3): finished rows packed many to a value.
//
//	bundles  shard(4) ‖ first dispatch_key   → bundle (below)
//	bexp     time(12) ‖ shard(4) ‖ first key → 1   time = the bundle's earliest FinishedAt
//
// A done or cancelled row starts as a slim row in "rows" (with its byshard
// and tombs entries, ~280 bytes of leaves with 28-byte keys); the pack
// pass (Store.PackTombstones) moves it into its shard's bundles, where it
// costs ~20 bytes: no B+tree element, no index entry, its key front-coded
// against the previous key. A shard's bundles cover disjoint key ranges
// (a bundle holds the keys from its own first key to the next bundle's),
// so a lookup is one seek: the last bundle whose first key is ≤ the key.
// Inside a bundle the records are sorted by dispatch_key; every
// bundleRestart-th record stores its whole key (a restart point), and the
// restart offsets let a lookup binary-search to within bundleRestart
// records. A bundle grows to bundleMaxBytes and is then split in equal
// parts, so a change rewrites one leaf page.
//
// The packing is lossless: a record keeps every field a slim row has
// (outbox.Slim), so Get, Merge, the digests, ReadShard and the console see
// the same row whether it is packed or not; a row that would not
// round-trip exactly (a time outside what int64 nanoseconds hold, a
// claim time on a finished row: packable) stays a row. Routes (namespace,
// task_queue, activity_type) are a table at the head of the bundle; a
// workflow_id and ordinal that the key spells ("{workflow_id}:{ordinal}",
// outbox.DefaultDispatchKey) cost one flag bit.
//
// Bundle value: format(1)=bundleV1, uvarint routes, per route
// str(namespace) str(task_queue) str(activity_type), varint base (unix ns,
// the first restart's previous FinishedAt), uvarint records, uvarint body
// length, the body (records), then one uint32 big-endian body offset per
// restart point (records 0, 16, 32, …).
//
// Record: uvarint shared (key bytes shared with the previous record's
// key; 0 at a restart), uvarint suffix length, suffix, flags(1), uvarint
// attempt, [uvarint gen if bgGen], [uvarint seq unless bgSeq], uvarint route,
// varint FinishedAt − previous FinishedAt (ns; the previous of a restart
// is base), varint FinishedAt − CreatedAt (ns), [varint FinishedAt −
// VisibleAfter if bgVisible], [str workflow_id, uvarint ordinal if
// bgWorkflow], [str last_error if bgError].
const (
	bundleV1 = 1
	// bundleMaxBytes is the size a bundle is split at, just under a
	// page: a bundle is one leaf page of its own, and a change rewrites
	// that page only. Bundles are split into parts of equal size, so they
	// are 2,000 to 4,000 bytes: leaves ~75 % full (measured: quarter-page
	// bundles split greedily left leaves ~60 % full, 42 bytes a packed
	// row allocated against 30).
	bundleMaxBytes = 4000
	// bundleRestart is the distance between restart points.
	bundleRestart = 16
)

// Record flags.
const (
	bgCancelled   = 1 << iota // status cancelled (else done)
	bgError                   // last_error follows
	bgGen                     // gen follows (else 0)
	bgVisible                 // VisibleAfter differs from CreatedAt
	bgKeyWorkflow             // workflow_id and ordinal are what the key spells
	bgWorkflow                // workflow_id and ordinal follow
	bgSeq                     // seq is attempt + 1 (not stored): finished at its last attempt, no re-arm
)

var (
	bucketBundles = []byte("bundles")
	bucketBExp    = []byte("bexp")
)

type bundleRoute struct{ ns, tq, at string }

// bundleKey is a bundles-bucket key: shard(4) ‖ first dispatch_key.
func bundleKey(shard uint32, firstKey string) []byte {
	return append(appendShard(make([]byte, 0, 4+len(firstKey)), shard), firstKey...)
}

// bexpKey is a bexp-bucket key: time(12) ‖ bundle key.
func bexpKey(earliest time.Time, bk []byte) []byte {
	return append(appendTimeKey(make([]byte, 0, timeKeyLen+len(bk)), earliest), bk...)
}

// keyWorkflow splits a key of the form DefaultDispatchKey(workflow,
// ordinal) back into its parts; ok is false for any other key.
func keyWorkflow(key string) (wf string, ord uint64, ok bool) {
	i := strings.LastIndexByte(key, ':')
	if i < 0 {
		return "", 0, false
	}
	ord, err := strconv.ParseUint(key[i+1:], 10, 64)
	if err != nil || strconv.FormatUint(ord, 10) != key[i+1:] {
		return "", 0, false
	}
	return key[:i], ord, true
}

// nsOK reports whether t round-trips through int64 nanoseconds.
func nsOK(t time.Time) bool {
	if t.IsZero() {
		return false
	}
	return t.Unix() > math.MinInt64/1_000_000_000+1 && t.Unix() < math.MaxInt64/1_000_000_000-1
}

// packable reports whether r can be packed into a bundle losslessly: a
// slim done or cancelled row with its times in range and no claim time
// (every other field has an exact encoding; roundTrips checks it in the
// tests).
func packable(r *outbox.Row) bool {
	return outbox.IsSlim(r) && r.ClaimedAt.IsZero() && nsOK(r.CreatedAt) && nsOK(r.FinishedAt) &&
		(r.VisibleAfter.Equal(r.CreatedAt) || nsOK(r.VisibleAfter))
}

// bundleWriter encodes a run of records (sorted by key) into one bundle.
type bundleWriter struct {
	routes   []bundleRoute
	routeIdx map[bundleRoute]int
	body     []byte
	restarts []uint32
	n        int
	prevKey  string
	prevFin  int64
	base     int64
	earliest time.Time
	first    string
	rec      []byte // scratch
}

func newBundleWriter(base int64) *bundleWriter {
	return &bundleWriter{routeIdx: map[bundleRoute]int{}, base: base}
}

// size is the bundle's encoded size so far.
func (bw *bundleWriter) size() int {
	n := 1 + 10 + 10 + 10 + 3 + len(bw.body) + 4*len(bw.restarts)
	for _, r := range bw.routes {
		n += 6 + len(r.ns) + len(r.tq) + len(r.at)
	}
	return n
}

// add encodes r as the next record (r sorted after the previous one),
// appending it to the body and its route to the table if new.
func (bw *bundleWriter) add(r *outbox.Row) {
	restart := bw.n%bundleRestart == 0
	if restart {
		bw.restarts = append(bw.restarts, uint32(len(bw.body)))
		bw.prevKey, bw.prevFin = "", bw.base
	}
	if bw.n == 0 {
		bw.first = r.DispatchKey
	}
	shared := 0
	for shared < len(bw.prevKey) && shared < len(r.DispatchKey) && bw.prevKey[shared] == r.DispatchKey[shared] {
		shared++
	}
	rt := bundleRoute{r.Namespace, r.TaskQueue, r.ActivityType}
	ri, ok := bw.routeIdx[rt]
	if !ok {
		ri = len(bw.routes)
		bw.routeIdx[rt] = ri
		bw.routes = append(bw.routes, rt)
	}
	var flags byte
	if r.Status == outbox.StatusCancelled {
		flags |= bgCancelled
	}
	if r.LastError != "" {
		flags |= bgError
	}
	if r.Version.Gen != 0 {
		flags |= bgGen
	}
	if !r.VisibleAfter.Equal(r.CreatedAt) {
		flags |= bgVisible
	}
	if wf, ord, ok := keyWorkflow(r.DispatchKey); ok && wf == r.WorkflowID && ord == r.Ordinal {
		flags |= bgKeyWorkflow
	} else if r.WorkflowID != "" || r.Ordinal != 0 {
		flags |= bgWorkflow
	}
	if r.Version.Seq == uint64(r.Attempt)+1 {
		flags |= bgSeq
	}
	fin := r.FinishedAt.UnixNano()
	b := bw.body
	b = binary.AppendUvarint(b, uint64(shared))
	b = bincodec.AppendString(b, r.DispatchKey[shared:])
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(r.Attempt))
	if flags&bgGen != 0 {
		b = binary.AppendUvarint(b, uint64(r.Version.Gen))
	}
	if flags&bgSeq == 0 {
		b = binary.AppendUvarint(b, r.Version.Seq)
	}
	b = binary.AppendUvarint(b, uint64(ri))
	b = binary.AppendVarint(b, fin-bw.prevFin)
	b = binary.AppendVarint(b, fin-r.CreatedAt.UnixNano())
	if flags&bgVisible != 0 {
		b = binary.AppendVarint(b, fin-r.VisibleAfter.UnixNano())
	}
	if flags&bgWorkflow != 0 {
		b = bincodec.AppendString(b, r.WorkflowID)
		b = binary.AppendUvarint(b, r.Ordinal)
	}
	if flags&bgError != 0 {
		b = bincodec.AppendString(b, r.LastError)
	}
	bw.body = b
	bw.prevKey, bw.prevFin = r.DispatchKey, fin
	if bw.n == 0 || r.FinishedAt.Before(bw.earliest) {
		bw.earliest = r.FinishedAt
	}
	bw.n++
}

// value returns the encoded bundle.
func (bw *bundleWriter) value() []byte {
	v := make([]byte, 0, bw.size())
	v = append(v, bundleV1)
	v = binary.AppendUvarint(v, uint64(len(bw.routes)))
	for _, r := range bw.routes {
		v = bincodec.AppendString(bincodec.AppendString(bincodec.AppendString(v, r.ns), r.tq), r.at)
	}
	v = binary.AppendVarint(v, bw.base)
	v = binary.AppendUvarint(v, uint64(bw.n))
	v = binary.AppendUvarint(v, uint64(len(bw.body)))
	v = append(v, bw.body...)
	for _, o := range bw.restarts {
		v = binary.BigEndian.AppendUint32(v, o)
	}
	return v
}

// encodedBundle is one bundle ready to store.
type encodedBundle struct {
	key      []byte
	val      []byte
	earliest time.Time
	n        int
}

// bundleLeafOverhead is what a bbolt leaf page holding one element costs
// besides the element's key and value: the page header (16 bytes) and
// one leaf element header (16 bytes).
const bundleLeafOverhead = 16 + 16

// bundleLimit is the most a bundle's value may take so that it is one
// leaf page of its own: bundleMaxBytes, or less when the page minus the
// leaf overhead minus the bundle key (4 + len(first key)) is smaller.
func bundleLimit(pageSize int, firstKey string) int {
	return min(bundleMaxBytes, pageSize-bundleLeafOverhead-4-len(firstKey))
}

// writerMark is a bundleWriter's state before an add, to undo it.
type writerMark struct {
	body, restarts, n, routes int
	prevKey, first            string
	prevFin                   int64
	earliest                  time.Time
}

func (bw *bundleWriter) mark() writerMark {
	return writerMark{len(bw.body), len(bw.restarts), bw.n, len(bw.routes), bw.prevKey, bw.first, bw.prevFin, bw.earliest}
}

// undo takes the writer back to m (the records added since are dropped).
func (bw *bundleWriter) undo(m writerMark) {
	for _, r := range bw.routes[m.routes:] {
		delete(bw.routeIdx, r)
	}
	bw.routes = bw.routes[:m.routes]
	bw.body, bw.restarts, bw.n = bw.body[:m.body], bw.restarts[:m.restarts], m.n
	bw.prevKey, bw.first, bw.prevFin, bw.earliest = m.prevKey, m.first, m.prevFin, m.earliest
}

// encodeBundles packs rows (one shard's, sorted by key, distinct) into
// bundles: one if they fit in bundleMaxBytes, else as many as needed, cut
// at record boundaries into parts of about equal size (a bundle that
// overflows by a few rows splits in two halves, not into a full bundle
// and a tiny one). Whatever the shares, no bundle of more than one record
// is larger than bundleLimit(pageSize, its first key), measured with the
// writer that encodes it (a record that becomes a restart point stores
// its whole key), so each fits one leaf page of pageSize bytes.
func encodeBundles(shard uint32, rows []outbox.Row, pageSize int) []encodedBundle {
	if len(rows) == 0 {
		return nil
	}
	base := rows[0].FinishedAt.UnixNano()
	// Sizes: encode once to learn each record's size.
	sizer := newBundleWriter(base)
	ends := make([]int, len(rows)) // body length after record i
	for i := range rows {
		sizer.add(&rows[i])
		ends[i] = len(sizer.body)
	}
	parts := 1
	if total := sizer.size(); total > bundleMaxBytes {
		parts = (total + bundleMaxBytes - 1) / bundleMaxBytes
	}
	out := make([]encodedBundle, 0, parts)
	bw := newBundleWriter(base)
	start := 0
	for i := range rows {
		// Cut before row i once the part has its share of the body, or
		// if row i would take it past its limit (a record larger than
		// that is a bundle of its own).
		share := len(out) < parts-1 && (ends[i]-start)*parts > ends[len(ends)-1]
		if bw.n > 0 && !share {
			m := bw.mark()
			bw.add(&rows[i])
			if bw.size() <= bundleLimit(pageSize, bw.first) {
				continue
			}
			bw.undo(m)
		}
		if bw.n > 0 {
			out = append(out, encodedBundle{key: bundleKey(shard, bw.first), val: bw.value(), earliest: bw.earliest, n: bw.n})
			bw = newBundleWriter(base)
			start = ends[i-1]
		}
		bw.add(&rows[i])
	}
	out = append(out, encodedBundle{key: bundleKey(shard, bw.first), val: bw.value(), earliest: bw.earliest, n: bw.n})
	return out
}

// bundleReader walks one bundle's records.
type bundleReader struct {
	shard      uint32
	nroutes    int
	routeTable []byte
	routes     []bundleRoute // decoded by loadRoutes
	base       int64
	n          int
	body       []byte
	restarts   []byte // uint32 offsets

	// walk state
	d       bincodec.Reader
	i       int
	key     []byte
	prevFin int64
}

func openBundle(bk, v []byte) (*bundleReader, error) {
	if len(bk) < 4 {
		return nil, fmt.Errorf("bundle key %x: %w", bk, errBadValue)
	}
	if len(v) < 1 || v[0] != bundleV1 {
		return nil, fmt.Errorf("bundle %x: %w (header)", bk, errBadValue)
	}
	br := &bundleReader{shard: binary.BigEndian.Uint32(bk)}
	d := bincodec.NewReader(v[1:])
	nr := d.Uvarint()
	if nr > uint64(len(v)) {
		return nil, fmt.Errorf("bundle %x: %w (routes)", bk, errBadValue)
	}
	// The route table is decoded when a record is (routes); a lookup
	// that misses never does.
	br.nroutes = int(nr)
	br.routeTable = d.Rest()
	for range 3 * nr {
		d.Bytes(math.MaxInt)
	}
	br.routeTable = br.routeTable[:len(br.routeTable)-len(d.Rest())]
	br.base = d.Varint()
	n := d.Uvarint()
	bl := d.Uvarint()
	rest := d.Rest()
	if d.Err() != nil || n == 0 || n > uint64(len(v)) || bl > uint64(len(rest)) {
		return nil, fmt.Errorf("bundle %x: %w (counts)", bk, errBadValue)
	}
	br.n = int(n)
	br.body = rest[:bl]
	br.restarts = rest[bl:]
	if len(br.restarts) != 4*((br.n+bundleRestart-1)/bundleRestart) {
		return nil, fmt.Errorf("bundle %x: %w (restarts)", bk, errBadValue)
	}
	return br, nil
}

// loadRoutes decodes the route table (once).
func (br *bundleReader) loadRoutes() error {
	if br.routes != nil || br.nroutes == 0 {
		return nil
	}
	d := bincodec.NewReader(br.routeTable)
	routes := make([]bundleRoute, br.nroutes)
	for i := range routes {
		routes[i] = bundleRoute{d.RawString(math.MaxInt), d.RawString(math.MaxInt), d.RawString(math.MaxInt)}
	}
	if d.Err() != nil {
		return fmt.Errorf("bundle routes: %w", errBadValue)
	}
	br.routes = routes
	return nil
}

// seekRestart positions the walk at restart point j.
func (br *bundleReader) seekRestart(j int) error {
	off := binary.BigEndian.Uint32(br.restarts[4*j:])
	if int(off) > len(br.body) {
		return fmt.Errorf("bundle restart %d: %w", j, errBadValue)
	}
	br.d.Reset(br.body[off:])
	br.i = j * bundleRestart
	br.key = br.key[:0]
	br.prevFin = br.base
	return nil
}

// nextKey decodes the next record's key (into br.key, valid until the
// next call) and returns the rest of the record for decodeRest.
func (br *bundleReader) nextKey() error {
	shared := br.d.Uvarint()
	suf := br.d.Bytes(math.MaxInt)
	if br.d.Err() != nil || shared > uint64(len(br.key)) {
		return fmt.Errorf("bundle record %d: %w", br.i, errBadValue)
	}
	if br.i%bundleRestart == 0 && shared != 0 {
		return fmt.Errorf("bundle record %d: %w (restart shares a prefix)", br.i, errBadValue)
	}
	br.key = append(br.key[:shared], suf...)
	return nil
}

// rest decodes the fields after the key; with into nil it only skips
// them (keeping the FinishedAt chain).
func (br *bundleReader) rest(into *outbox.Row) error {
	d := &br.d
	flags := d.Byte()
	attempt := d.Uvarint()
	gen := uint64(0)
	if flags&bgGen != 0 {
		gen = d.Uvarint()
	}
	seq := attempt + 1
	if flags&bgSeq == 0 {
		seq = d.Uvarint()
	}
	ri := d.Uvarint()
	fin := br.prevFin + d.Varint()
	created := fin - d.Varint()
	visible := created
	if flags&bgVisible != 0 {
		visible = fin - d.Varint()
	}
	var wf, lastErr string
	var ord uint64
	if flags&bgWorkflow != 0 {
		wf = d.RawString(math.MaxInt)
		ord = d.Uvarint()
	}
	if flags&bgError != 0 {
		lastErr = d.RawString(math.MaxInt)
	}
	if d.Err() != nil || ri >= uint64(br.nroutes) || attempt > math.MaxUint32 || gen > math.MaxUint32 {
		return fmt.Errorf("bundle record %d (%q): %w", br.i, br.key, errBadValue)
	}
	br.prevFin = fin
	br.i++
	if into == nil {
		return nil
	}
	if err := br.loadRoutes(); err != nil {
		return err
	}
	rt := br.routes[ri]
	*into = outbox.Row{
		DispatchKey:  string(br.key),
		WorkflowID:   wf,
		Ordinal:      ord,
		Namespace:    rt.ns,
		TaskQueue:    rt.tq,
		ActivityType: rt.at,
		Status:       outbox.StatusDone,
		Attempt:      uint32(attempt),
		VisibleAfter: time.Unix(0, visible).UTC(),
		CreatedAt:    time.Unix(0, created).UTC(),
		FinishedAt:   time.Unix(0, fin).UTC(),
		LastError:    lastErr,
		Shard:        br.shard,
		Version:      outbox.Version{Gen: uint32(gen), Seq: seq},
	}
	if flags&bgCancelled != 0 {
		into.Status = outbox.StatusCancelled
	}
	if flags&bgKeyWorkflow != 0 {
		into.WorkflowID, into.Ordinal, _ = keyWorkflow(into.DispatchKey)
	}
	return nil
}

// all decodes every record, in key order (copies: valid after the tx).
func (br *bundleReader) all() ([]outbox.Row, error) {
	out := make([]outbox.Row, br.n)
	for i := range out {
		if i%bundleRestart == 0 {
			if err := br.seekRestart(i / bundleRestart); err != nil {
				return nil, err
			}
		}
		if err := br.nextKey(); err != nil {
			return nil, err
		}
		if i > 0 && bytes.Compare(br.key, []byte(out[i-1].DispatchKey)) <= 0 {
			return nil, fmt.Errorf("bundle record %d (%q): %w (out of order)", i, br.key, errBadValue)
		}
		if err := br.rest(&out[i]); err != nil {
			return nil, err
		}
	}
	if br.d.Len() != 0 {
		return nil, fmt.Errorf("bundle: %w (%d bytes after the last record)", errBadValue, br.d.Len())
	}
	return out, nil
}

// find looks key up: binary search over the restart points, then a walk
// of at most bundleRestart records.
func (br *bundleReader) find(key []byte) (outbox.Row, bool, error) {
	nrs := len(br.restarts) / 4
	// Find the first restart whose key is > key. Invariant: restarts
	// before lo have keys ≤ key, restarts from hi on have keys > key; the
	// record, if present, follows restart lo-1.
	lo, hi := 0, nrs
	for lo < hi {
		mid := (lo + hi) / 2
		if err := br.seekRestart(mid); err != nil {
			return outbox.Row{}, false, err
		}
		if err := br.nextKey(); err != nil {
			return outbox.Row{}, false, err
		}
		if bytes.Compare(br.key, key) <= 0 {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	if lo == 0 {
		return outbox.Row{}, false, nil
	}
	if err := br.seekRestart(lo - 1); err != nil {
		return outbox.Row{}, false, err
	}
	for br.i < br.n && br.i < lo*bundleRestart {
		if err := br.nextKey(); err != nil {
			return outbox.Row{}, false, err
		}
		switch c := bytes.Compare(br.key, key); {
		case c == 0:
			var r outbox.Row
			err := br.rest(&r)
			return r, err == nil, err
		case c > 0:
			return outbox.Row{}, false, nil
		}
		if err := br.rest(nil); err != nil {
			return outbox.Row{}, false, err
		}
	}
	return outbox.Row{}, false, nil
}

// sameRow reports whether a and b hold the same values in every field
// (times as instants): a packed record must decode to exactly the row.
func sameRow(a, b *outbox.Row) bool {
	return a.DispatchKey == b.DispatchKey && a.WorkflowID == b.WorkflowID && a.Ordinal == b.Ordinal &&
		a.Namespace == b.Namespace && a.TaskQueue == b.TaskQueue && a.ActivityType == b.ActivityType &&
		bytes.Equal(a.Payload, b.Payload) && (a.Payload == nil) == (b.Payload == nil) && a.ContentType == b.ContentType &&
		a.Status == b.Status && a.Attempt == b.Attempt && a.VisibleAfter.Equal(b.VisibleAfter) &&
		a.ClaimedAt.Equal(b.ClaimedAt) && a.CreatedAt.Equal(b.CreatedAt) && a.FinishedAt.Equal(b.FinishedAt) &&
		a.LastError == b.LastError && a.Shard == b.Shard && a.Version == b.Version
}
