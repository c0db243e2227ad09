package transfer_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/outbox/memstore"
	"github.com/fairshard/fairshard/shards"
	"github.com/fairshard/fairshard/transfer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const shardCount = 16

var (
	ctx = context.Background()
	t0  = time.Date(2026, 7, 8, 9, 10, 11, 0, time.UTC)
)

// Both stores implement both sides.
var (
	_ transfer.Source = (*boltstore.Store)(nil)
	_ transfer.Sink   = (*boltstore.Store)(nil)
	_ transfer.Source = (*memstore.Store)(nil)
	_ transfer.Sink   = (*memstore.Store)(nil)
)

// openStore opens a real bbolt store on a fresh file; it is Check'ed and
// closed at cleanup.
func openStore(t testing.TB) *boltstore.Store {
	t.Helper()
	path := filepath.Join(t.TempDir(), "outbox.db")
	s, err := boltstore.Open(path, boltstore.Options{ShardCount: shardCount, LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Check(context.Background()); err != nil && !errors.Is(err, outbox.ErrClosed) {
			t.Errorf("check %s: %v", path, err)
		}
		_ = s.Close()
	})
	return s
}

// fill appends n rows (payload bytes each) and returns their keys. Some are
// then settled so the shards also hold tombstones and claimed rows.
func fill(t testing.TB, s *boltstore.Store, n, payload int) []string {
	t.Helper()
	keys := make([]string, n)
	for i := 0; i < n; i += 200 {
		var rows []outbox.Row
		for j := i; j < min(i+200, n); j++ {
			keys[j] = fmt.Sprintf("row-%05d", j)
			rows = append(rows, outbox.Row{DispatchKey: keys[j], WorkflowID: "wf", Namespace: "ns", TaskQueue: "q",
				Payload: make([]byte, payload), CreatedAt: t0.Add(time.Duration(j) * time.Millisecond)})
		}
		if _, err := s.Append(ctx, rows); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

func allShards() []uint32 {
	out := make([]uint32, shardCount)
	for i := range out {
		out[i] = uint32(i)
	}
	return out
}

// digests returns the source's digest of every shard.
func digests(t testing.TB, s interface {
	ShardDigest(context.Context, uint32) (outbox.ShardDigest, error)
}) map[uint32]outbox.ShardDigest {
	t.Helper()
	out := map[uint32]outbox.ShardDigest{}
	for _, sh := range allShards() {
		d, err := s.ShardDigest(ctx, sh)
		if err != nil {
			t.Fatal(err)
		}
		out[sh] = d
	}
	return out
}

func newMover(t testing.TB, src transfer.Source, cfg transfer.MoverConfig) *transfer.Mover {
	t.Helper()
	cfg.ReleaseBackoff = cmp.Or(cfg.ReleaseBackoff, time.Millisecond)
	mv, err := transfer.NewMover(src, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return mv
}

// assertMoved checks that every key is at dst exactly as the source held
// it (digests equal), that the source holds none of them nor any mark, and
// that nothing is stranded.
func assertMoved(t *testing.T, src, dst *boltstore.Store, before map[uint32]outbox.ShardDigest, mv *transfer.Mover, keys []string) {
	t.Helper()
	for _, k := range keys {
		if _, err := src.Get(ctx, k); !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("row %q still at the source: %v", k, err)
		}
		if _, err := dst.Get(ctx, k); err != nil {
			t.Fatalf("row %q not at the sink: %v", k, err)
		}
	}
	if after := digests(t, dst); !equalDigests(after, before) {
		t.Fatalf("sink digests differ from the source's before the move:\n got %v\nwant %v", after, before)
	}
	if n, err := src.MarkedRows(ctx); err != nil || n != 0 {
		t.Fatalf("source still has %d rows marked in-transfer (%v)", n, err)
	}
	if fs, err := src.ForeignShards(ctx); err != nil || len(fs) != 0 {
		t.Fatalf("source still lists foreign shards %v (%v)", fs, err)
	}
	if n := mv.Stranded(); n != 0 {
		t.Fatalf("mover reports %d stranded rows", n)
	}
}

func equalDigests(a, b map[uint32]outbox.ShardDigest) bool {
	for sh, d := range a {
		if b[sh] != d {
			return false
		}
	}
	return len(a) == len(b)
}

func TestMoveGathersShardsIntoBoundedBatches(t *testing.T) {
	src, dst := openStore(t), openStore(t)
	keys := fill(t, src, 1200, 100)
	// Some tombstones travel too.
	rows, err := src.Claim(ctx, outbox.ClaimParams{Limit: 50, Now: t0.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range rows {
		if err := src.Complete(ctx, outbox.CompleteParams{DispatchKey: r.DispatchKey, Claim: r.Version, Now: t0}); err != nil {
			t.Fatal(err)
		}
	}
	before := digests(t, src)
	src.SetOwnedShards([]uint32{})
	rec := &recordingSink{Sink: dst}
	mv := newMover(t, src, transfer.MoverConfig{Limits: transfer.Limits{MaxRows: 500, MaxBytes: 1 << 20}})
	st, err := mv.Move(ctx, rec, allShards())
	if err != nil {
		t.Fatal(err)
	}
	if st.Rows != 1200 || st.Deleted != 1200 || st.Merged.Created != 1200 || st.Batches != 3 {
		t.Fatalf("stats %+v, want 1200 rows in 3 batches gathered across shards", st)
	}
	for _, b := range rec.batches {
		if len(b) > 500 {
			t.Fatalf("batch of %d rows, max 500", len(b))
		}
	}
	assertMoved(t, src, dst, before, mv, keys)
}

// TestMoveLargeRows: 120 rows of 1 MiB payloads move in batches bounded by
// bytes (the first bug: batches bounded by rows alone were
// hundreds of MiB).
func TestMoveLargeRows(t *testing.T) {
	if testing.Short() {
		t.Skip("writes 1 GiB of rows")
	}
	src, dst := openStore(t), openStore(t)
	keys := fill(t, src, 120, 1<<20)
	before := digests(t, src)
	src.SetOwnedShards([]uint32{})
	rec := &recordingSink{Sink: dst}
	const budget = 4 << 20 // 120 rows here; node.TestHandoffMovesLargeRows moves 500 over HTTP
	mv := newMover(t, src, transfer.MoverConfig{Limits: transfer.Limits{MaxRows: 500, MaxBytes: budget}})
	st, err := mv.Move(ctx, rec, allShards())
	if err != nil {
		t.Fatal(err)
	}
	maxRow := outbox.RowBytes(&outbox.Row{DispatchKey: keys[0], WorkflowID: "wf", Namespace: "ns", TaskQueue: "q", Payload: make([]byte, 1<<20)})
	for i, b := range rec.batches {
		if n := bytesOf(b); n > budget+maxRow {
			t.Fatalf("batch %d holds %d bytes, over the %d budget plus one row", i, n, budget)
		}
	}
	if st.Rows != 120 || len(rec.batches) < 120*(1<<20)/(budget+maxRow) {
		t.Fatalf("moved %d rows in %d batches", st.Rows, len(rec.batches))
	}
	assertMoved(t, src, dst, before, mv, keys)
}

func bytesOf(rows []outbox.Row) int {
	n := 0
	for i := range rows {
		n += outbox.RowBytes(&rows[i])
	}
	return n
}

// recordingSink records the batches it forwards.
type recordingSink struct {
	transfer.Sink
	mu      sync.Mutex
	batches [][]outbox.Row
}

func (r *recordingSink) Merge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
	res, err := r.Sink.Merge(ctx, rows)
	if err == nil {
		r.mu.Lock()
		r.batches = append(r.batches, rows)
		r.mu.Unlock()
	}
	return res, err
}

// faultSource fails ReadShard, CompleteTransfer or AbortTransfer the
// given number of times (after the real call for CompleteTransfer when
// commitThenFail: the rows are gone but the caller sees an error).
type faultSource struct {
	*boltstore.Store
	failRead, failComplete, failAbort atomic.Int32
	reads                             []outbox.ShardRead
	multiCalls                        int
	mu                                sync.Mutex
}

var errInjected = errors.New("injected fault")

func take(c *atomic.Int32) bool {
	for {
		n := c.Load()
		if n <= 0 {
			return false
		}
		if c.CompareAndSwap(n, n-1) {
			return true
		}
	}
}

func (f *faultSource) ReadShard(ctx context.Context, p outbox.ShardRead) (outbox.ShardPage, error) {
	f.mu.Lock()
	f.reads = append(f.reads, p)
	f.mu.Unlock()
	if take(&f.failRead) {
		return outbox.ShardPage{}, errInjected
	}
	return f.Store.ReadShard(ctx, p)
}

func (f *faultSource) ReadShards(ctx context.Context, reads []outbox.ShardRead, maxRows, maxBytes int) ([]outbox.ShardPage, error) {
	f.mu.Lock()
	f.reads = append(f.reads, reads...)
	f.multiCalls++
	f.mu.Unlock()
	if take(&f.failRead) {
		return nil, errInjected
	}
	return f.Store.ReadShards(ctx, reads, maxRows, maxBytes)
}

func (f *faultSource) CompleteTransfer(ctx context.Context, keys []string) (int, error) {
	if take(&f.failComplete) {
		return 0, errInjected
	}
	return f.Store.CompleteTransfer(ctx, keys)
}

func (f *faultSource) AbortTransfer(ctx context.Context, keys []string) (int, error) {
	if take(&f.failAbort) {
		return 0, errInjected
	}
	return f.Store.AbortTransfer(ctx, keys)
}

// faultSink fails before applying (a send that never arrived) or after
// applying (the receiver committed, the ack was lost).
type faultSink struct {
	transfer.Sink
	failBefore, failAfter atomic.Int32
	calls                 atomic.Int32
}

func (f *faultSink) Merge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
	f.calls.Add(1)
	if take(&f.failBefore) {
		return outbox.MergeResult{}, errInjected
	}
	res, err := f.Sink.Merge(ctx, rows)
	if err == nil && take(&f.failAfter) {
		return outbox.MergeResult{}, errInjected
	}
	return res, err
}

// TestMoveSurvivesAFaultAtEachStep injects a failure at each step of a
// move (begin = the marking read, send, receiver apply, complete, abort),
// once and persistently, then lets later passes run as the node's handoff
// loop would. Every row must end at the sink exactly once, with nothing
// left at the source, no mark left, nothing stranded.
func TestMoveSurvivesAFaultAtEachStep(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inject func(src *faultSource, sink *faultSink)
		// wantErr is what the first pass reports.
		wantErr error
	}{
		{"begin fails", func(s *faultSource, _ *faultSink) { s.failRead.Store(1) }, errInjected},
		{"send fails", func(_ *faultSource, k *faultSink) { k.failBefore.Store(1) }, errInjected},
		{"receiver applies, ack lost", func(_ *faultSource, k *faultSink) { k.failAfter.Store(1) }, errInjected},
		{"complete fails, retried at once", func(s *faultSource, _ *faultSink) { s.failComplete.Store(2) }, nil},
		{"complete keeps failing: stranded", func(s *faultSource, _ *faultSink) { s.failComplete.Store(7) }, transfer.ErrStranded},
		{"abort fails, retried at once", func(s *faultSource, k *faultSink) { k.failBefore.Store(1); s.failAbort.Store(2) }, errInjected},
		{"abort keeps failing: stranded", func(s *faultSource, k *faultSink) { k.failBefore.Store(1); s.failAbort.Store(9) }, transfer.ErrStranded},
		{"every step fails once", func(s *faultSource, k *faultSink) {
			s.failRead.Store(1)
			k.failBefore.Store(1)
			k.failAfter.Store(1)
			s.failComplete.Store(1)
			s.failAbort.Store(1)
		}, errInjected},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, dst := openStore(t), openStore(t)
			keys := fill(t, store, 300, 50)
			before := digests(t, store)
			store.SetOwnedShards([]uint32{})
			src := &faultSource{Store: store}
			sink := &faultSink{Sink: dst}
			tc.inject(src, sink)
			mv := newMover(t, src, transfer.MoverConfig{Limits: transfer.Limits{MaxRows: 64}, ReleaseAttempts: 3})
			_, err := mv.Move(ctx, sink, allShards())
			if tc.wantErr == nil && err != nil {
				t.Fatalf("first pass: %v, want the release retried within the call", err)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("first pass: %v, want %v", err, tc.wantErr)
			}
			if errors.Is(err, transfer.ErrStranded) {
				// The bug this guards: rows left marked are not claimable,
				// but they are counted and their shard still listed.
				n, _ := store.MarkedRows(ctx)
				if n == 0 || mv.Stranded() != n {
					t.Fatalf("stranded: store has %d marked rows, mover reports %d", n, mv.Stranded())
				}
				if fs, _ := store.ForeignShards(ctx); len(fs) == 0 {
					t.Fatal("shards with stranded marks are not listed as foreign")
				}
			}
			// Later passes (the handoff loop) until the source is empty.
			deadline := time.Now().Add(10 * time.Second)
			for {
				fs, err := store.ForeignShards(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if len(fs) == 0 && mv.Stranded() == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("source still lists %v after 10 s of passes (stranded %d)", fs, mv.Stranded())
				}
				_, _ = mv.Move(ctx, sink, fs)
			}
			assertMoved(t, store, dst, before, mv, keys)
		})
	}
}

// TestMoveResumesAfterABrokenStream: after a failed send, the next call
// continues each shard after the last batch the sink acknowledged instead
// of rescanning it from the start.
func TestMoveResumesAfterABrokenStream(t *testing.T) {
	store, dst := openStore(t), openStore(t)
	keys := fill(t, store, 400, 20)
	before := digests(t, store)
	store.SetOwnedShards([]uint32{})
	src := &faultSource{Store: store}
	sink := &faultSink{Sink: dst}
	// One shard, batches of 5: the third batch's send fails.
	shard := shards.ShardOf(keys[0], shardCount)
	mv := newMover(t, src, transfer.MoverConfig{Limits: transfer.Limits{MaxRows: 5}})
	ok := &countdownSink{Sink: sink, okCalls: 2}
	if _, err := mv.Move(ctx, ok, []uint32{shard}); !errors.Is(err, errInjected) {
		t.Fatalf("first pass: %v, want the injected send failure", err)
	}
	src.mu.Lock()
	ackedToken := src.reads[1].After // the read after the first acked batch…
	second := len(src.reads)
	src.mu.Unlock()
	if len(ackedToken) == 0 {
		t.Fatal("the second batch was read from the shard's start")
	}
	if _, err := mv.Move(ctx, sink, []uint32{shard}); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	resumed := src.reads[second].After
	src.mu.Unlock()
	if len(resumed) == 0 || string(resumed) <= string(ackedToken) {
		t.Fatalf("second pass started at %x, want after the second acked batch (past %x)", resumed, ackedToken)
	}
	// The shard's rows behind the resume point were moved by the first
	// pass; finish every shard.
	if _, err := mv.Move(ctx, sink, allShards()); err != nil {
		t.Fatal(err)
	}
	assertMoved(t, store, dst, before, mv, keys)
}

// countdownSink acknowledges okCalls calls, then fails every call.
type countdownSink struct {
	transfer.Sink
	okCalls int
}

func (c *countdownSink) Merge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
	if c.okCalls == 0 {
		return outbox.MergeResult{}, errInjected
	}
	c.okCalls--
	return c.Sink.Merge(ctx, rows)
}

// TestMoveSkipsClaimedAndOwnedShards: claimed rows wait at the source; a
// shard owned again is skipped without an error.
func TestMoveSkipsClaimedAndOwnedShards(t *testing.T) {
	src, dst := openStore(t), openStore(t)
	fill(t, src, 100, 10)
	claimed, err := src.Claim(ctx, outbox.ClaimParams{Limit: 7, Now: t0.Add(time.Hour)})
	if err != nil || len(claimed) != 7 {
		t.Fatalf("claim: %d %v", len(claimed), err)
	}
	owned := shards.ShardOf(claimed[0].DispatchKey, shardCount)
	src.SetOwnedShards([]uint32{owned})
	mv := newMover(t, src, transfer.MoverConfig{})
	st, err := mv.Move(ctx, dst, allShards())
	if err != nil {
		t.Fatal(err)
	}
	left := 0
	for _, c := range claimed {
		r, err := src.Get(ctx, c.DispatchKey)
		if err != nil || r.Status != outbox.StatusClaimed {
			t.Fatalf("claimed row %q moved or changed: %+v %v", c.DispatchKey, r, err)
		}
		left++
	}
	ownedRows := 0
	for i := range 100 {
		if shards.ShardOf(fmt.Sprintf("row-%05d", i), shardCount) == owned {
			ownedRows++
		}
	}
	if want := 100 - ownedRows - countNotOn(claimed, owned); st.Rows != want {
		t.Fatalf("moved %d rows, want %d (all but the owned shard's and the claimed ones)", st.Rows, want)
	}
}

func countNotOn(rows []outbox.Row, shard uint32) int {
	n := 0
	for _, r := range rows {
		if r.Shard != shard {
			n++
		}
	}
	return n
}

// TestCopyResumesAndDeletesNothing: a copy (replica sync) leaves the
// source as it was, and a broken copy continues from its token without
// resending acknowledged pages.
func TestCopyResumesAndDeletesNothing(t *testing.T) {
	src, dst := openStore(t), openStore(t)
	keys := fill(t, src, 300, 30)
	shard := shards.ShardOf(keys[0], shardCount)
	var onShard []string
	for _, k := range keys {
		if shards.ShardOf(k, shardCount) == shard {
			onShard = append(onShard, k)
		}
	}
	// A claimed row is copied as it is (the sink stores it pending).
	scope := outbox.ClaimScope{Namespace: "ns", TaskQueue: "q"}
	if _, err := src.Claim(ctx, outbox.ClaimParams{Scope: &scope, Limit: 1, Now: t0.Add(time.Hour)}); err != nil {
		t.Fatal(err)
	}
	before := digests(t, src)
	rec := &recordingSink{Sink: dst}
	broken := &countdownSink{Sink: rec, okCalls: 2}
	tok, st, err := transfer.Copy(ctx, src, broken, shard, nil, transfer.Limits{MaxRows: 4})
	if !errors.Is(err, errInjected) || st.Rows != 8 || len(tok) == 0 {
		t.Fatalf("broken copy: %d rows, token %x, %v; want 8 rows, a token and the injected error", st.Rows, tok, err)
	}
	tok, st, err = transfer.Copy(ctx, src, rec, shard, tok, transfer.Limits{MaxRows: 4})
	if err != nil || st.Rows != len(onShard)-8 {
		t.Fatalf("resumed copy: %d rows %v, want the %d left", st.Rows, err, len(onShard)-8)
	}
	var copied []string
	for _, b := range rec.batches {
		for _, r := range b {
			copied = append(copied, r.DispatchKey)
		}
	}
	if !slices.Equal(sorted(copied), sorted(onShard)) {
		t.Fatalf("copied %d rows (%d distinct), want each of the shard's %d once", len(copied), len(slices.Compact(sorted(copied))), len(onShard))
	}
	if after := digests(t, src); !equalDigests(after, before) {
		t.Fatal("the copy changed the source")
	}
	d, _ := dst.ShardDigest(ctx, shard)
	if d != before[shard] {
		t.Fatalf("sink digest %+v, source %+v", d, before[shard])
	}
	if n, _ := src.MarkedRows(ctx); n != 0 {
		t.Fatalf("a copy marked %d rows", n)
	}
	// A copy from the final token finds nothing more.
	if _, st, err := transfer.Copy(ctx, src, rec, shard, tok, transfer.Limits{}); err != nil || st.Rows != 0 {
		t.Fatalf("copy past the end: %+v %v", st, err)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}

// TestMoveBetweenMemstores: the in-memory store is a Source and a Sink too.
func TestMoveBetweenMemstores(t *testing.T) {
	src, dst := memstore.New(shardCount), memstore.New(shardCount)
	var rows []outbox.Row
	for i := range 50 {
		rows = append(rows, outbox.Row{DispatchKey: fmt.Sprintf("m%02d", i), Namespace: "ns", TaskQueue: "q"})
	}
	if _, err := src.Append(ctx, rows); err != nil {
		t.Fatal(err)
	}
	src.SetOwnedShards([]uint32{})
	mv := newMover(t, src, transfer.MoverConfig{Limits: transfer.Limits{MaxRows: 7}})
	st, err := mv.Move(ctx, dst, allShards())
	if err != nil || st.Rows != 50 || st.Deleted != 50 {
		t.Fatalf("moved %+v %v", st, err)
	}
	if d, _ := src.ShardDigests(ctx); len(d) != 0 {
		t.Fatalf("source still holds %v", d)
	}
	if d, _ := dst.ShardDigests(ctx); len(d) == 0 {
		t.Fatal("sink holds nothing")
	}
}

func TestMoverMetrics(t *testing.T) {
	store, dst := openStore(t), openStore(t)
	fill(t, store, 40, 10)
	store.SetOwnedShards([]uint32{})
	src := &faultSource{Store: store}
	src.failComplete.Store(4) // more than the attempts: stranded
	reg := prometheus.NewPedanticRegistry()
	mv := newMover(t, src, transfer.MoverConfig{ReleaseAttempts: 2, Registerer: reg})
	if _, err := mv.Move(ctx, dst, allShards()); !errors.Is(err, transfer.ErrStranded) {
		t.Fatalf("move: %v", err)
	}
	want := `
# HELP fairshard_transfer_release_failures_total CompleteTransfer or AbortTransfer calls that failed (each is retried; see fairshard_transfer_stranded_rows).
# TYPE fairshard_transfer_release_failures_total counter
fairshard_transfer_release_failures_total 2
# HELP fairshard_transfer_stranded_rows Rows left marked in-transfer (not claimable) because their release failed; retried before any new batch. Hopefully 0.
# TYPE fairshard_transfer_stranded_rows gauge
fairshard_transfer_stranded_rows 40
# HELP fairshard_transfer_rows_total Rows moved to another node and acknowledged durable there (handoff and drain).
# TYPE fairshard_transfer_rows_total counter
fairshard_transfer_rows_total 40
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "fairshard_transfer_release_failures_total",
		"fairshard_transfer_stranded_rows", "fairshard_transfer_rows_total"); err != nil {
		t.Fatal(err)
	}
	fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := mv.Flush(fctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	if got := testutil.ToFloat64(mustGauge(t, reg, "fairshard_transfer_stranded_rows")); got != 0 {
		t.Fatalf("stranded gauge %v after Flush", got)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

func mustGauge(t *testing.T, reg *prometheus.Registry, name string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "copy"})
			g.Set(mf.GetMetric()[0].GetGauge().GetValue())
			return g
		}
	}
	t.Fatalf("no metric %s", name)
	return nil
}

// TestRetryStrandedReleasesAShardOwnedAgain: marks whose AbortTransfer kept
// failing are released by RetryStranded even when nothing is left to move
// (the shard is owned here again): its rows become claimable.
func TestRetryStrandedReleasesAShardOwnedAgain(t *testing.T) {
	store, dst := openStore(t), openStore(t)
	keys := fill(t, store, 40, 10)
	store.SetOwnedShards([]uint32{})
	src := &faultSource{Store: store}
	src.failAbort.Store(5)
	sink := &faultSink{Sink: dst}
	sink.failBefore.Store(1)
	mv := newMover(t, src, transfer.MoverConfig{ReleaseAttempts: 2})
	if _, err := mv.Move(ctx, sink, allShards()); !errors.Is(err, transfer.ErrStranded) {
		t.Fatalf("move: %v, want the abort stranded", err)
	}
	store.SetOwnedShards(nil) // ownership came back
	if rows, _ := store.Claim(ctx, outbox.ClaimParams{Limit: 100, Now: t0.Add(time.Hour)}); len(rows) != 0 {
		t.Fatalf("claimed %d rows still marked in-transfer", len(rows))
	}
	if err := mv.RetryStranded(ctx); !errors.Is(err, transfer.ErrStranded) {
		t.Fatalf("first retry: %v, want still stranded (2 of 5 failures left)", err)
	}
	if err := mv.RetryStranded(ctx); err != nil {
		t.Fatalf("second retry: %v", err)
	}
	rows, err := store.Claim(ctx, outbox.ClaimParams{Limit: 100, Now: t0.Add(time.Hour)})
	if err != nil || mv.Stranded() != 0 {
		t.Fatalf("after the retries: claim %v, stranded %d", err, mv.Stranded())
	}
	if n, _ := store.MarkedRows(ctx); n != 0 {
		t.Fatalf("%d rows still marked", n)
	}
	if len(rows) != len(keys) {
		t.Fatalf("claimed %d rows after the release, want all %d", len(rows), len(keys))
	}
}

// TestMoveMarksManyShardsInOneCall: a batch gathered from a few rows of
// every shard is marked with one ReadShards call (one commit at the
// source), not one call per shard, and a shard owned again is skipped.
func TestMoveMarksManyShardsInOneCall(t *testing.T) {
	store, dst := openStore(t), openStore(t)
	keys := fill(t, store, 48, 10) // ~3 rows in each of 16 shards
	owned := shards.ShardOf(keys[0], shardCount)
	store.SetOwnedShards([]uint32{owned})
	src := &faultSource{Store: store}
	mv := newMover(t, src, transfer.MoverConfig{})
	st, err := mv.Move(ctx, dst, allShards())
	if err != nil {
		t.Fatal(err)
	}
	onOwned := 0
	for _, k := range keys {
		if shards.ShardOf(k, shardCount) == owned {
			onOwned++
		}
	}
	if st.Rows != len(keys)-onOwned || st.Batches != 1 {
		t.Fatalf("moved %+v, want %d rows in one batch (all but the owned shard's)", st, len(keys)-onOwned)
	}
	if src.multiCalls != 1 {
		t.Fatalf("%d ReadShards calls for one batch over %d shards, want 1", src.multiCalls, shardCount)
	}
	for _, k := range keys {
		_, err := store.Get(ctx, k)
		if shards.ShardOf(k, shardCount) == owned && err != nil {
			t.Fatalf("row %q of the owned shard moved: %v", k, err)
		}
	}
}
