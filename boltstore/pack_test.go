package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"
	"pgregory.net/rapid"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/outbox/outboxtest"
)

// eagerPack is a Store that packs every finished row into its bundle
// right after the call that finished it (and before a sweep), so the
// contract suite meets packed rows wherever it reads a done or cancelled
// one.
type eagerPack struct {
	*Store
	t      *testing.T
	packed *int
}

func (e eagerPack) pack() {
	e.t.Helper()
	n, err := e.PackTombstones(ctx)
	if err != nil {
		e.t.Fatalf("pack: %v", err)
	}
	*e.packed += n
}

func (e eagerPack) Complete(ctx context.Context, p outbox.CompleteParams) error {
	defer e.pack()
	return e.Store.Complete(ctx, p)
}

func (e eagerPack) Cancel(ctx context.Context, p outbox.CancelParams) (bool, error) {
	defer e.pack()
	return e.Store.Cancel(ctx, p)
}

func (e eagerPack) Merge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
	defer e.pack()
	return e.Store.Merge(ctx, rows)
}

func (e eagerPack) PurgeDeadLetters(ctx context.Context, namespace string, keys []string, now time.Time) (int, error) {
	defer e.pack()
	return e.Store.PurgeDeadLetters(ctx, namespace, keys, now)
}

func (e eagerPack) ExpireTombstones(ctx context.Context) (int, error) {
	e.pack()
	return e.Store.ExpireTombstones(ctx)
}

// TestStoreContractPacked runs the shared outbox.Store suite, unchanged,
// against a store that packs finished rows at once: a packed row must be
// the same row to every call (Get, Append's dedupe, Merge, ReadShard and
// its marks, digests, counters, ListRows, expiry). Every case's file is
// Check'ed at cleanup, bundles included.
func TestStoreContractPacked(t *testing.T) {
	total := 0
	t.Cleanup(func() {
		// The cases finish rows in every way (complete, cancel, purge,
		// merge of finished copies): many must have been packed.
		if total < 20 {
			t.Errorf("the suite packed %d rows: the packed path was not exercised", total)
		}
		t.Logf("%d rows packed over the suite", total)
	})
	outboxtest.RunStoreSuite(t, func(t *testing.T) outbox.Store {
		s, _ := newTestStore(t, func(o *Options) { o.ShardCount = 64 })
		n := 0
		t.Cleanup(func() { total += n })
		return eagerPack{Store: s, t: t, packed: &n}
	})
}

// finishVariety appends n rows of every shape a tombstone can have and
// finishes them by every path: keys that spell their workflow
// ("{workflow_id}:{ordinal}") or not, with or without a workflow, several
// routes and activity types; completed at their first try, after retries
// (last error; some errors larger than a bundle), cancelled with and
// without a reason, dead letters (which stay rows), a redriven dead
// letter completed (generation 1). Times differ per row (nanoseconds
// included). It returns the keys by final status.
func finishVariety(t *testing.T, s *Store, b *testBundle, prefix string, n int) map[outbox.Status][]string {
	t.Helper()
	rows := make([]outbox.Row, n)
	for i := range rows {
		r := outbox.Row{Namespace: fmt.Sprintf("ns%d", i%3), TaskQueue: fmt.Sprintf("q%d", i%2), ActivityType: fmt.Sprintf("act%d", i%3),
			Payload: []byte(strings.Repeat("x", 100+i%50)), ContentType: "application/json",
			CreatedAt: b.clock.Now().Add(time.Duration(i)*time.Millisecond + time.Duration(i%7)), Attempt: 1}
		switch i % 4 {
		case 0:
			r.WorkflowID, r.Ordinal = fmt.Sprintf("%s-wf-%d", prefix, i%9), uint64(i)
			r.DispatchKey = outbox.DefaultDispatchKey(r.WorkflowID, r.Ordinal)
		case 1:
			r.DispatchKey, r.WorkflowID, r.Ordinal = fmt.Sprintf("%s-k-%d", prefix, i), "w", uint64(i)
		case 2:
			r.DispatchKey = fmt.Sprintf("%s-k-%d", prefix, i)
		case 3:
			r.DispatchKey, r.WorkflowID, r.Ordinal = fmt.Sprintf("%s:%d", prefix, i), "other", 7
		}
		if i%11 == 0 {
			r.VisibleAfter = r.CreatedAt.Add(time.Second) // delayed
		}
		rows[i] = r
	}
	mustAppend(t, s, rows...)
	claim := func() []outbox.Row {
		b.clock.Advance(time.Minute)
		got, err := s.Claim(ctx, outbox.ClaimParams{Limit: 2 * n, Now: b.clock.Now()})
		must(t, err)
		return got
	}
	out := map[outbox.Status][]string{}
	at := func(i int) time.Time {
		return b.clock.Now().Add(time.Duration(i)*time.Microsecond + time.Duration(i%13))
	}
	var again []string
	for i, r := range claim() {
		switch i % 5 {
		case 0:
			msg := "503 unavailable"
			if i%50 == 0 {
				msg = strings.Repeat("e", 3*bundleMaxBytes)
			}
			must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: r.DispatchKey, Claim: r.Version, VisibleAfter: b.clock.Now(), LastError: msg, StatusCode: 503}))
			again = append(again, r.DispatchKey)
		case 1:
			must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: r.DispatchKey, Claim: r.Version, LastError: "400", Now: at(i)}))
			out[outbox.StatusFailed] = append(out[outbox.StatusFailed], r.DispatchKey)
		case 2:
			must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: r.DispatchKey, Claim: r.Version, VisibleAfter: b.clock.Now().Add(time.Hour)}))
			reason := ""
			if i%10 == 2 {
				reason = "withdrawn"
			}
			if ok, err := s.Cancel(ctx, outbox.CancelParams{DispatchKey: r.DispatchKey, Reason: reason, Now: at(i)}); err != nil || !ok {
				t.Fatalf("cancel %s: %v %v", r.DispatchKey, ok, err)
			}
			out[outbox.StatusCancelled] = append(out[outbox.StatusCancelled], r.DispatchKey)
		default:
			must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: r.DispatchKey, Claim: r.Version, Now: at(i)}))
			out[outbox.StatusDone] = append(out[outbox.StatusDone], r.DispatchKey)
		}
	}
	// One dead letter redriven: generation 1.
	redriven := out[outbox.StatusFailed][0]
	out[outbox.StatusFailed] = out[outbox.StatusFailed][1:]
	fr := mustGet(t, s, redriven)
	if n, err := s.Redrive(ctx, fr.Namespace, []string{redriven}, b.clock.Now()); err != nil || n != 1 {
		t.Fatalf("redrive: %d %v", n, err)
	}
	for i, r := range claim() {
		must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: r.DispatchKey, Claim: r.Version, Now: at(i)}))
		out[outbox.StatusDone] = append(out[outbox.StatusDone], r.DispatchKey)
	}
	if len(out[outbox.StatusDone]) != n-len(out[outbox.StatusFailed])-len(out[outbox.StatusCancelled]) || len(again) == 0 {
		t.Fatalf("finished %d done, %d failed, %d cancelled of %d", len(out[outbox.StatusDone]), len(out[outbox.StatusFailed]), len(out[outbox.StatusCancelled]), n)
	}
	if r := mustGet(t, s, redriven); r.Version.Gen != 1 || r.Status != outbox.StatusDone {
		t.Fatalf("redriven row: %s %v", r.Status, r.Version)
	}
	return out
}

// allRows lists every row s holds, by key.
func allRows(t *testing.T, s *Store) map[string]outbox.Row {
	t.Helper()
	out := map[string]outbox.Row{}
	q := outbox.RowQuery{Limit: 500}
	for {
		page, err := s.ListRows(ctx, q)
		must(t, err)
		for _, r := range page.Rows {
			if _, dup := out[r.DispatchKey]; dup {
				t.Fatalf("ListRows lists %q twice", r.DispatchKey)
			}
			out[r.DispatchKey] = r
		}
		if page.Next == "" {
			return out
		}
		q.After = page.Next
	}
}

// bucketKeys counts the entries of a bucket.
func bucketKeys(t *testing.T, s *Store, name []byte) int {
	t.Helper()
	n := 0
	must(t, s.db.View(func(tx *bolt.Tx) error { n = tx.Bucket(name).Stats().KeyN; return nil }))
	return n
}

// TestPackedRowsReadAsRows: every done and cancelled row, whatever its
// shape, is packed by the pack pass, and then reads back identical in
// every field (Get, ListRows in key order across bundles and rows),
// dedupes an append of its key, and leaves the digests and namespace
// stats as they were; dead letters stay rows; bundles split as they
// fill; the packed file checks and reopens the same.
func TestPackedRowsReadAsRows(t *testing.T) {
	t.Parallel()
	s, b := newTestStore(t, func(o *Options) { o.ShardCount = 4 })
	const n = 2000
	keys := finishVariety(t, s, b, "v", n)
	before := allRows(t, s)
	digests, err := s.ShardDigests(ctx)
	must(t, err)
	stats, err := s.NamespaceStats(ctx)
	must(t, err)
	packed, err := s.PackTombstones(ctx)
	must(t, err)
	if want := len(keys[outbox.StatusDone]) + len(keys[outbox.StatusCancelled]); packed != want {
		t.Fatalf("packed %d rows, want the %d done and cancelled", packed, want)
	}
	if got := bucketKeys(t, s, bucketRows); got != len(keys[outbox.StatusFailed]) {
		t.Fatalf("%d rows entries left, want the %d dead letters", got, len(keys[outbox.StatusFailed]))
	}
	if nb := bucketKeys(t, s, bucketBundles); nb < 2*4 {
		t.Fatalf("%d bundles for %d packed rows over 4 shards: they did not split", nb, packed)
	}
	mustCheck(t, s)
	assertSameRows(t, s, before)
	assertSameDigests(t, s, digests)
	if st, err := s.NamespaceStats(ctx); err != nil || !reflect.DeepEqual(st, stats) {
		t.Fatalf("namespace stats after packing: %+v %v, want %+v", st, err, stats)
	}
	var dup []outbox.Row
	for k := range before {
		dup = append(dup, row(k, "ns", "q"))
	}
	for i, o := range mustAppend(t, s, dup...) {
		if o != outbox.AppendDuplicate {
			t.Fatalf("append of the stored key %q: %s", dup[i].DispatchKey, o)
		}
	}
	// Settles of packed rows are no-ops, as for any finished row.
	k := keys[outbox.StatusDone][0]
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: k, Claim: before[k].Version}))
	if ok, err := s.Cancel(ctx, outbox.CancelParams{DispatchKey: k}); ok || err != nil {
		t.Fatalf("cancel of a packed done row: %v %v", ok, err)
	}
	// A second pass finds nothing to pack; the rows read the same after
	// a restart.
	if n, err := s.PackTombstones(ctx); err != nil || n != 0 {
		t.Fatalf("second pack: %d %v", n, err)
	}
	s = reopen(t, s, b)
	assertSameRows(t, s, before)
	assertSameDigests(t, s, digests)
}

// TestPackedRowsExpire: packed rows leave at the end of their retention
// like any tombstone (counted, digests and counters follow, their keys
// can be appended anew), bundle by bundle from the earliest, and a
// bundle holding rows of both sides of the cut keeps the younger ones.
func TestPackedRowsExpire(t *testing.T) {
	t.Parallel()
	s, b := newTestStore(t, func(o *Options) { o.ShardCount = 4; o.TombstoneRetention = 24 * time.Hour })
	old := finishVariety(t, s, b, "old", 400)
	b.clock.Advance(2 * time.Hour)
	young := finishVariety(t, s, b, "young", 400)
	if _, err := s.PackTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	mustCheck(t, s)
	b.clock.Advance(23 * time.Hour) // past the old rows' retention, not the young ones'
	n, err := s.ExpireTombstones(ctx)
	must(t, err)
	oldGone := len(old[outbox.StatusDone]) + len(old[outbox.StatusCancelled])
	if n != oldGone {
		t.Fatalf("expired %d, want the %d old done and cancelled rows", n, oldGone)
	}
	mustCheck(t, s)
	for _, k := range append(old[outbox.StatusDone], old[outbox.StatusCancelled]...) {
		if _, err := s.Get(ctx, k); !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("expired packed row %q: %v", k, err)
		}
	}
	for _, k := range append(young[outbox.StatusDone], young[outbox.StatusCancelled]...) {
		mustGet(t, s, k)
	}
	if out := mustAppend(t, s, row(old[outbox.StatusDone][0], "ns", "q")); out[0] != outbox.AppendCreated {
		t.Fatalf("append of an expired key: %s", out[0])
	}
	b.clock.Advance(3 * time.Hour)
	if _, err := s.ExpireTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	if nb, ne := bucketKeys(t, s, bucketBundles), bucketKeys(t, s, bucketBExp); nb != 0 || ne != 0 {
		t.Fatalf("after every packed row expired: %d bundles, %d expiry entries", nb, ne)
	}
	st, err := s.NamespaceStats(ctx)
	must(t, err)
	for ns, v := range st {
		if v.Done+v.Cancelled != 0 {
			t.Fatalf("namespace %s after expiry: %+v", ns, v)
		}
	}
}

// TestMergeOntoPackedRows: incoming copies meet a packed row as they
// would its rows entry: a stale live copy or the same state is skipped
// (the row stays packed), a newer state (another generation, a later
// terminal state) replaces it and leaves its bundle.
func TestMergeOntoPackedRows(t *testing.T) {
	t.Parallel()
	s, b := newTestStore(t, func(o *Options) { o.ShardCount = 4 })
	keys := finishVariety(t, s, b, "m", 200)
	if _, err := s.PackTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	done := mustGet(t, s, keys[outbox.StatusDone][1])
	stale := done
	stale.Status, stale.Version, stale.FinishedAt, stale.Payload = outbox.StatusPending, outbox.FirstVersion, time.Time{}, []byte("p")
	res, err := s.Merge(ctx, []outbox.Row{stale, done})
	if err != nil || res.Skipped != 2 {
		t.Fatalf("stale and same copies onto a packed row: %+v %v", res, err)
	}
	if got := mustGet(t, s, done.DispatchKey); !sameRow(&got, &done) {
		t.Fatalf("packed row after merges: %+v", got)
	}
	if bucketKeys(t, s, bucketRows) != len(keys[outbox.StatusFailed]) {
		t.Fatal("a skipped merge unpacked the row")
	}
	// A newer generation (a redrive elsewhere) and a later terminal state.
	redriven := done
	redriven.Status, redriven.Version, redriven.FinishedAt = outbox.StatusPending, outbox.Version{Gen: done.Version.Gen + 1, Seq: 99}, time.Time{}
	redriven.Payload = []byte("again")
	cancelled := mustGet(t, s, keys[outbox.StatusCancelled][0])
	later := cancelled
	later.Status = outbox.StatusDone // done outranks cancelled in a generation
	res, err = s.Merge(ctx, []outbox.Row{redriven, later})
	if err != nil || res.Updated != 2 {
		t.Fatalf("newer copies onto packed rows: %+v %v", res, err)
	}
	mustCheck(t, s)
	if got := mustGet(t, s, done.DispatchKey); got.Status != outbox.StatusPending || got.Version != redriven.Version || string(got.Payload) != "again" {
		t.Fatalf("packed row after a newer generation: %s %v %q", got.Status, got.Version, got.Payload)
	}
	if got := mustGet(t, s, later.DispatchKey); got.Status != outbox.StatusDone {
		t.Fatalf("packed cancelled row after a done copy: %s", got.Status)
	}
	claimed, err := s.Claim(ctx, outbox.ClaimParams{Limit: 10, Now: b.clock.Now()})
	must(t, err)
	if len(claimed) != 1 || claimed[0].DispatchKey != done.DispatchKey {
		t.Fatalf("claim after the redriven copy: %v", claimed)
	}
	if n, err := s.PackTombstones(ctx); err != nil || n != 1 {
		t.Fatalf("repack of the row made done by the merge: %d %v", n, err)
	}
	mustCheck(t, s)
}

// TestReadShardPagesPackedRows: a shard read in small pages returns every
// row of the shard once, live rows first and packed ones after, with
// tokens that survive a restart; a move marks packed rows like others,
// Open clears those marks, AbortTransfer unmarks and CompleteTransfer
// deletes them.
func TestReadShardPagesPackedRows(t *testing.T) {
	t.Parallel()
	s, b := newTestStore(t, func(o *Options) { o.ShardCount = 4 })
	finishVariety(t, s, b, "r", 600)
	if _, err := s.PackTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	var live []outbox.Row
	for i := range 50 {
		live = append(live, row(fmt.Sprintf("live-%d", i), "ns", "q"))
	}
	mustAppend(t, s, live...)
	const shard = 1
	want := map[string]bool{}
	for k, r := range allRows(t, s) {
		if r.Shard == shard {
			want[k] = true
		}
	}
	read := func(mark bool) []string {
		var got []string
		p := outbox.ShardRead{Shard: shard, MaxRows: 7, MaxBytes: 4000, Mark: mark}
		for pages := 0; ; pages++ {
			page, err := s.ReadShard(ctx, p)
			must(t, err)
			for _, r := range page.Rows {
				got = append(got, r.DispatchKey)
			}
			if page.Done {
				return got
			}
			p.After = page.Next
			if pages == 10 && !mark {
				s = reopen(t, s, b) // tokens are durable
			}
		}
	}
	got := read(false)
	if len(got) < 3*7*10/2 {
		t.Fatalf("shard read of %d rows: too few pages to test a restart mid-read", len(got))
	}
	seen := map[string]bool{}
	for _, k := range got {
		if seen[k] || !want[k] {
			t.Fatalf("shard read returned %q twice or from another shard", k)
		}
		seen[k] = true
	}
	if len(seen) != len(want) {
		t.Fatalf("shard read returned %d of the shard's %d rows", len(seen), len(want))
	}
	// A move: the shard is not ours.
	s.SetOwnedShards([]uint32{0, 2, 3})
	marked := read(true)
	if n, err := s.MarkedRows(ctx); err != nil || n != len(marked) || len(marked) < len(want)/2 {
		t.Fatalf("marked %d rows (%v), read %d of %d", n, err, len(marked), len(want))
	}
	s = reopen(t, s, b) // Open clears marks, packed rows' included
	s.SetOwnedShards([]uint32{0, 2, 3})
	if n, err := s.MarkedRows(ctx); err != nil || n != 0 {
		t.Fatalf("marks after reopen: %d %v", n, err)
	}
	marked = read(true)
	half := marked[:len(marked)/2]
	if n, err := s.AbortTransfer(ctx, half); err != nil || n != len(half) {
		t.Fatalf("abort: %d %v", n, err)
	}
	if n, err := s.CompleteTransfer(ctx, marked); err != nil || n != len(marked)-len(half) {
		t.Fatalf("complete: %d %v, want %d", n, err, len(marked)-len(half))
	}
	mustCheck(t, s)
	marked = read(true)
	if n, err := s.CompleteTransfer(ctx, marked); err != nil || n != len(marked) {
		t.Fatalf("complete the rest: %d %v", n, err)
	}
	mustCheck(t, s)
	for k := range want {
		if r, err := s.Get(ctx, k); err == nil && r.Status != outbox.StatusClaimed {
			t.Fatalf("row %q (%s) of the moved shard is still here", k, r.Status)
		}
	}
}

// TestBundleLookupSeesRowsPackedInTheSameTransaction: the "no bundle at
// all" shortcut of Append's packed-row lookup is per transaction and is
// dropped by the first bundle written, so an append coalesced into the
// commit of the pack pass that packed its key still finds it.
func TestBundleLookupSeesRowsPackedInTheSameTransaction(t *testing.T) {
	t.Parallel()
	s, b := newTestStore(t)
	r := row("k", "ns", "q")
	outbox.NewRow(&r, b.clock.Now())
	r.Status, r.FinishedAt, r.Version = outbox.StatusDone, b.clock.Now(), outbox.Version{Seq: 2}
	r.Shard = shardOf(r.DispatchKey)
	outbox.Slim(&r)
	must(t, s.submit(ctx, "test", 1, func(w *wtx) error {
		if ok, err := w.isBundled(r.Shard, r.DispatchKey); ok || err != nil {
			return fmt.Errorf("before packing: %v %v", ok, err)
		}
		if err := w.changeBundles(r.Shard, []outbox.Row{r}, nil); err != nil {
			return err
		}
		if ok, err := w.isBundled(r.Shard, r.DispatchKey); !ok || err != nil {
			return fmt.Errorf("after packing in the same transaction: %v %v", ok, err)
		}
		return w.changeBundles(r.Shard, nil, []string{r.DispatchKey})
	}))
}

// TestCompactKeepsPackedRows: fairshard compact copies the bundles with
// everything else: the compacted file counts packed rows among its rows,
// checks, and answers every row as before.
func TestCompactKeepsPackedRows(t *testing.T) {
	t.Parallel()
	s, b := newTestStore(t, func(o *Options) { o.ShardCount = 4 })
	finishVariety(t, s, b, "c", 300)
	if _, err := s.PackTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	before := allRows(t, s)
	must(t, s.Close())
	res, err := Compact(ctx, b.path, CompactOptions{})
	if err != nil || res.Rows != int64(len(before)) {
		t.Fatalf("compact: %+v %v, want %d rows", res, err, len(before))
	}
	opts := b.opts
	opts.Registerer = prometheus.NewPedanticRegistry()
	s2, err := Open(b.path, opts)
	must(t, err)
	cleanupCheck(t, s2)
	if bucketKeys(t, s2, bucketBundles) == 0 {
		t.Fatal("the compacted file has no bundles")
	}
	assertSameRows(t, s2, before)
}

// TestBundleRecordsRoundTrip (property): any slim done or cancelled row
// that packable accepts decodes from a bundle to exactly itself (every
// field, times to the nanosecond), alone and among others sharing key
// prefixes, across restart points and splits; and a bundle's lookup finds
// each of its keys and no other.
func TestBundleRecordsRoundTrip(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		base := time.Unix(rapid.Int64Range(-1<<33, 1<<33).Draw(rt, "base"), rapid.Int64Range(0, 999_999_999).Draw(rt, "nanos")).UTC()
		at := func(label string) time.Time {
			return base.Add(time.Duration(rapid.Int64Range(-1<<50, 1<<50).Draw(rt, label)))
		}
		n := rapid.IntRange(1, 300).Draw(rt, "rows")
		keys := map[string]bool{}
		var rows []outbox.Row
		for i := 0; len(rows) < n; i++ {
			k := rapid.SampledFrom([]string{"", "wf", "wf-1", "a:b", "load-c1-"}).Draw(rt, "prefix") +
				rapid.StringMatching(`[a-z0-9:]{0,12}`).Draw(rt, "key")
			if k == "" || keys[k] {
				continue
			}
			keys[k] = true
			r := outbox.Row{DispatchKey: k, Namespace: rapid.SampledFrom([]string{"ns", "ns2"}).Draw(rt, "ns"),
				TaskQueue: "q", ActivityType: rapid.SampledFrom([]string{"", "send"}).Draw(rt, "at"),
				Status:  rapid.SampledFrom([]outbox.Status{outbox.StatusDone, outbox.StatusCancelled}).Draw(rt, "status"),
				Attempt: rapid.Uint32().Draw(rt, "attempt"), Shard: 3,
				Version:   outbox.Version{Gen: rapid.Uint32().Draw(rt, "gen"), Seq: rapid.Uint64().Draw(rt, "seq")},
				CreatedAt: at("created"), FinishedAt: at("finished"),
				LastError: rapid.SampledFrom([]string{"", "503", strings.Repeat("e", 5000)}).Draw(rt, "err")}
			r.VisibleAfter = r.CreatedAt
			if rapid.Bool().Draw(rt, "delayed") {
				r.VisibleAfter = at("visible")
			}
			switch rapid.IntRange(0, 2).Draw(rt, "workflow") {
			case 1:
				if wf, ord, ok := keyWorkflow(k); ok {
					r.WorkflowID, r.Ordinal = wf, ord
				}
			case 2:
				r.WorkflowID, r.Ordinal = rapid.StringMatching(`[a-z:]{0,6}`).Draw(rt, "wf"), rapid.Uint64().Draw(rt, "ord")
			}
			if r.Version.Seq == 0 && rapid.Bool().Draw(rt, "seqIsAttemptPlus1") {
				r.Version.Seq = uint64(r.Attempt) + 1
			}
			if !packable(&r) {
				rt.Fatalf("row %+v not packable", r)
			}
			if !roundTrips(&r) {
				rt.Fatalf("row %+v does not round-trip alone", r)
			}
			rows = append(rows, r)
		}
		slices.SortFunc(rows, func(a, b outbox.Row) int { return strings.Compare(a.DispatchKey, b.DispatchKey) })
		got := 0
		for _, eb := range encodeBundles(3, rows, os.Getpagesize()) {
			br, err := openBundle(eb.key, eb.val)
			if err != nil {
				rt.Fatal(err)
			}
			dec, err := br.all()
			if err != nil {
				rt.Fatal(err)
			}
			for i := range dec {
				if !sameRow(&dec[i], &rows[got+i]) {
					rt.Fatalf("record %d decodes to %+v, want %+v", got+i, dec[i], rows[got+i])
				}
				found, ok, err := br.find([]byte(dec[i].DispatchKey))
				if err != nil || !ok || !sameRow(&found, &rows[got+i]) {
					rt.Fatalf("find %q: %v %v", dec[i].DispatchKey, ok, err)
				}
				if _, ok, _ := br.find([]byte(dec[i].DispatchKey + "\x00")); ok {
					rt.Fatalf("find of a key not in the bundle succeeded")
				}
			}
			if len(eb.val) > bundleMaxBytes && len(dec) > 1 {
				rt.Fatalf("bundle of %d records is %d bytes", len(dec), len(eb.val))
			}
			got += len(dec)
		}
		if got != len(rows) {
			rt.Fatalf("bundles hold %d of %d rows", got, len(rows))
		}
	})
}

// TestPackedRowsExpireInManyTransactions: more expired packed rows than
// one sweep transaction takes (GCBatchRows) are all removed by one
// ExpireTombstones, bundles cut part-way included.
func TestPackedRowsExpireInManyTransactions(t *testing.T) {
	t.Parallel()
	s, b := newTestStore(t, func(o *Options) { o.ShardCount = 2 })
	keys := finishVariety(t, s, b, "many", 3000)
	if _, err := s.PackTombstones(ctx); err != nil {
		t.Fatal(err)
	}
	finished := len(keys[outbox.StatusDone]) + len(keys[outbox.StatusCancelled])
	if finished <= 2*GCBatchRows {
		t.Fatalf("only %d finished rows: the test needs more than two sweep transactions", finished)
	}
	b.clock.Advance(25 * time.Hour)
	n, err := s.ExpireTombstones(ctx)
	if err != nil || n != finished {
		t.Fatalf("expired %d (%v), want %d", n, err, finished)
	}
	mustCheck(t, s)
	if nb := bucketKeys(t, s, bucketBundles); nb != 0 {
		t.Fatalf("%d bundles left", nb)
	}
	if got := bucketKeys(t, s, bucketRows); got != len(keys[outbox.StatusFailed]) {
		t.Fatalf("%d rows left, want the %d dead letters", got, len(keys[outbox.StatusFailed]))
	}
}

// TestBundlesFitOnePageWithLongKeys: with 80- and 120-byte dispatch_keys
// (a bundle's key is 4 bytes more, and every restart point stores a whole key)
// every bundle of more than one record fits one leaf page by the size
// rule (page header 16 + element header 16 + key + value ≤ the bbolt page
// size): encodeBundles of every run length from 1 to 600 rows (totals
// just under bundleMaxBytes included), and bundles grown by many pack
// passes in a store.
func TestBundlesFitOnePageWithLongKeys(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ps := os.Getpagesize()
	for _, kl := range []int{80, 120} {
		var run []outbox.Row
		for i := range 600 {
			r := row(fmt.Sprintf("%s-%08d", strings.Repeat("k", kl-9), i*37), "ns", "q")
			r.Status, r.Attempt, r.Version = outbox.StatusDone, 1, outbox.Version{Seq: 2}
			r.CreatedAt, r.VisibleAfter, r.FinishedAt = at, at, at.Add(time.Duration(i)*time.Second)
			r.Payload, r.ContentType = nil, ""
			run = append(run, r)
		}
		for m := 1; m <= len(run); m++ {
			for _, eb := range encodeBundles(0, run[:m], ps) {
				if need := bundleLeafOverhead + len(eb.key) + len(eb.val); eb.n > 1 && need > ps {
					t.Fatalf("%d-byte keys, %d rows: a bundle of %d records needs a leaf of %d bytes, page is %d", kl, m, eb.n, need, ps)
				}
			}
		}
	}

	s, b := newTestStore(t, func(o *Options) { o.ShardCount = 1 })
	const n, rounds = 3000, 10
	key := func(i int) string { return fmt.Sprintf("%s-%08d", strings.Repeat("k", 71), (i*7919)%n) }
	for r := range rounds {
		var rows []outbox.Row
		for i := r * n / rounds; i < (r+1)*n/rounds; i++ {
			rows = append(rows, row(key(i), "ns", "q"))
		}
		mustAppend(t, s, rows...)
		completeAndPack(t, s, b, len(rows))
	}
	mustCheck(t, s)
	pageSize := s.db.Info().PageSize
	bundles, biggest := 0, 0
	must(t, s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketBundles).ForEach(func(k, v []byte) error {
			bundles++
			biggest = max(biggest, len(v))
			if need := bundleLeafOverhead + len(k) + len(v); need > pageSize {
				t.Errorf("bundle %q: a leaf holding it needs %d bytes, page is %d", k, need, pageSize)
			}
			return nil
		})
	}))
	if bundles < 2 || biggest < pageSize/2 {
		t.Fatalf("%d bundles, biggest %d bytes: the test did not fill bundles", bundles, biggest)
	}
	t.Logf("%d bundles, biggest value %d bytes, page %d", bundles, biggest, pageSize)
}

// completeAndPack claims up to limit visible rows a minute later, completes
// each and packs until nothing is left to pack (packAll).
func completeAndPack(t *testing.T, s *Store, b *testBundle, limit int) {
	t.Helper()
	b.clock.Advance(time.Minute)
	got, err := s.Claim(ctx, outbox.ClaimParams{Limit: limit, Now: b.clock.Now()})
	must(t, err)
	for _, c := range got {
		must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: c.DispatchKey, Claim: c.Version, Now: b.clock.Now()}))
	}
	_, err = packAll(ctx, s)
	must(t, err)
}

// TestListRowsDecodesOnlyTheBundlesItReaches: the packed-row merge of
// ListRows decodes a shard's bundle only when the merge reaches its keys
// (20 rows taken from 64 shards' bundles decode at most 21 bundles, not
// one per shard), and pages through every packed row in key order whatever the
// page size and start key.
func TestListRowsDecodesOnlyTheBundlesItReaches(t *testing.T) {
	t.Parallel()
	const shardCount, n = 64, 3200
	s, b := newTestStore(t, func(o *Options) { o.ShardCount = shardCount })
	var rows []outbox.Row
	for i := range n {
		rows = append(rows, row(fmt.Sprintf("key-%06d", i), "ns", "q"))
	}
	mustAppend(t, s, rows...)
	completeAndPack(t, s, b, n)
	if bucketKeys(t, s, bucketBundles) < shardCount {
		t.Fatalf("want bundles on every shard, got %d", bucketKeys(t, s, bucketBundles))
	}
	for _, after := range []string{"", "key-001500"} {
		must(t, s.view(ctx, "test", func(_ *bolt.Tx, bk buckets) error {
			p, err := packedFrom(bk, shardCount, after)
			must(t, err)
			prev := after
			for range 20 {
				must(t, p.settle(nil))
				if p.Len() == 0 {
					t.Fatalf("after %q: packed rows ran out", after)
				}
				k := p.heads[0].cur().DispatchKey
				if k <= prev {
					t.Fatalf("after %q: %q follows %q", after, k, prev)
				}
				prev = k
				must(t, p.advance())
			}
			if p.loads > 21 {
				t.Fatalf("after %q: 20 rows decoded %d bundles (of %d shards), want at most one per row taken and one more", after, p.loads, shardCount)
			}
			return nil
		}))
	}
	var keys []string
	q := outbox.RowQuery{Limit: 7, After: "key-000100"}
	for {
		page, err := s.ListRows(ctx, q)
		must(t, err)
		keys = append(keys, keysOfRows(page.Rows)...)
		if page.Next == "" {
			break
		}
		q.After = page.Next
	}
	if len(keys) != n-101 || !slices.IsSorted(keys) || keys[0] != "key-000101" {
		t.Fatalf("ListRows after key-000100 in pages of 7: %d keys (want %d), sorted %v, first %q", len(keys), n-101, slices.IsSorted(keys), keys[0])
	}
}

// TestPackTombstonesPacksOnePagePerCall: one PackTombstones call reads at
// most one page of the tombstone index (packPageRows keys), later calls go
// on after it until one returns 0 with everything packed; RunTombstoneGC
// calls it again at once while pages are full (4 pages packed within 5 s
// with a PackInterval of 2 s).
func TestPackTombstonesPacksOnePagePerCall(t *testing.T) {
	t.Parallel()
	const n, page = 180, 50
	finish := func(s *Store, b *testBundle, prefix string) {
		var rows []outbox.Row
		for i := range n {
			rows = append(rows, row(fmt.Sprintf("%s-%04d", prefix, i), "ns", "q"))
		}
		mustAppend(t, s, rows...)
		b.clock.Advance(time.Minute)
		got, err := s.Claim(ctx, outbox.ClaimParams{Limit: n, Now: b.clock.Now()})
		must(t, err)
		for _, c := range got {
			must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: c.DispatchKey, Claim: c.Version, Now: b.clock.Now()}))
		}
	}
	s, b := newTestStore(t, func(o *Options) { o.ShardCount = 4 })
	s.packPageRows = page
	finish(s, b, "a")
	calls, total := 0, 0
	for {
		p, err := s.PackTombstones(ctx)
		must(t, err)
		if p > page {
			t.Fatalf("one call packed %d rows, page is %d", p, page)
		}
		calls++
		total += p
		if p == 0 {
			break
		}
	}
	if total != n || calls != n/page+2 || bucketKeys(t, s, bucketTombs) != 0 {
		t.Fatalf("packed %d of %d rows in %d calls (want %d), %d index entries left", total, n, calls, n/page+2, bucketKeys(t, s, bucketTombs))
	}
	mustCheck(t, s)

	// RunTombstoneGC: the first pack call comes at PackInterval (2 s);
	// the 4 pages then follow at once, not a PackInterval apart (8 s).
	s2, b2 := newTestStore(t, func(o *Options) { o.ShardCount = 4; o.PackInterval = 2 * time.Second })
	s2.packPageRows = page
	finish(s2, b2, "b")
	gcCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s2.RunTombstoneGC(gcCtx, 10*time.Millisecond) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	poll.Eventually(t, 5*time.Second, "the reopened store to pack every tombstone", func() (bool, string) { return bucketKeys(t, s2, bucketTombs) == 0, "" })
}
