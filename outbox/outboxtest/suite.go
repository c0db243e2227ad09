// Package outboxtest is the contract suite every outbox.Store runs
// (STYLE §6: one shared suite, called once per implementation). It pins the
// behaviour of outbox.Store's doc comments: insert-or-ignore appends, atomic
// exactly-once claims in (visible_after, dispatch_key) order, held-workflow
// exclusion, stale-claim re-arm, settle transitions fenced by the claim they
// settle, cancel, row versions, CLAIMED-only counts, the pending-routes
// listing, owned-shard scoping, and the shard-level calls every store
// offers beside the contract (merging incoming copies, shard reads with
// in-transfer marks, per-shard digests) and what a node reads and keeps
// there (dead-letter pages, namespace stats, held claims, config entries).
// A store lacking one of those methods fails the suite: it cannot stand
// behind a node.
//
// Use it from a _test.go file:
//
//	func TestContract(t *testing.T) {
//		outboxtest.RunStoreSuite(t, func(t *testing.T) outbox.Store { return newStore(t, 64) })
//	}
//
// The factory is called once per case and must return an empty store over
// at least 16 shards; it owns its cleanup (t.Cleanup).
package outboxtest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// ShardScoped is the method through which a store is told which shards
// this node owns. A store without it fails the suite.
type ShardScoped interface {
	SetOwnedShards(owned []uint32)
}

// Merger stores copies of rows received from other nodes (handoff, sync,
// replication) through outbox.NormalizeIncoming and outbox.Merge. A store
// without it fails the suite.
type Merger interface {
	Merge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error)
}

// ShardReader is a store's side of moving or copying a shard (package
// transfer's Source). A store without it fails the suite.
type ShardReader interface {
	ShardScoped
	ReadShard(ctx context.Context, p outbox.ShardRead) (outbox.ShardPage, error)
	CompleteTransfer(ctx context.Context, keys []string) (int, error)
	AbortTransfer(ctx context.Context, keys []string) (int, error)
	ForeignShards(ctx context.Context) ([]uint32, error)
	ShardCount() uint32
}

// MultiShardReader is a marking read of several shards in one call against
// one shared budget (package transfer's ShardsReader). A store without it
// fails the suite.
type MultiShardReader interface {
	ReadShards(ctx context.Context, reads []outbox.ShardRead, maxRows, maxBytes int) ([]outbox.ShardPage, error)
}

// Digester reads the per-shard digests a store maintains. A store without
// it fails the suite.
type Digester interface {
	ShardDigest(ctx context.Context, shard uint32) (outbox.ShardDigest, error)
	ShardDigests(ctx context.Context) ([]outbox.ShardDigest, error)
}

// need returns s as a T or fails the test naming the missing method set.
func need[T any](t *testing.T, s outbox.Store, what string) T {
	t.Helper()
	v, ok := s.(T)
	if !ok {
		t.Fatalf("store %T lacks %s: every store must offer it", s, what)
	}
	return v
}

// T0 is the suite's fixed base instant; rows are created relative to it so
// results never depend on the wall clock.
var T0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// Row builds a pending row with the given key and route, created and
// visible at T0, with a small JSON payload. Tests adjust fields as needed.
func Row(key, namespace, taskQueue string) outbox.Row {
	return outbox.Row{
		DispatchKey:  key,
		WorkflowID:   "wf-" + key,
		Ordinal:      1,
		Namespace:    namespace,
		TaskQueue:    taskQueue,
		ActivityType: "send",
		Payload:      []byte(`{"k":"` + key + `"}`),
		ContentType:  "application/json",
		CreatedAt:    T0,
		VisibleAfter: T0,
	}
}

// RunStoreSuite runs every contract case against fresh stores from newStore.
func RunStoreSuite(t *testing.T, newStore func(t *testing.T) outbox.Store) {
	t.Helper()
	cases := []struct {
		name string
		run  func(t *testing.T, s outbox.Store)
	}{
		{"AppendCreatesWithDefaults", testAppendDefaults},
		{"AppendDuplicateAcrossBatches", testAppendDuplicate},
		{"AppendDuplicateInsideOneBatch", testAppendDuplicateInBatch},
		{"AppendInvalidRowWritesNothing", testAppendInvalid},
		{"AppendAfterTombstoneIsDuplicate", testAppendAfterTombstone},
		{"GetMissingIsNotFound", testGetMissing},
		{"ClaimOrderAndFlip", testClaimOrder},
		{"ClaimLimitZeroClaimsNothing", testClaimLimitZero},
		{"ClaimBatchIsAllOrNothing", testClaimBatch},
		{"InvisibleRowsNeitherClaimedNorListed", testInvisible},
		{"ScopedClaimStaysInRoute", testScopedClaim},
		{"HeldRowsSkippedWithoutStarvingRoute", testHeldSkipped},
		{"ConcurrentClaimsAreExactlyOnce", testConcurrentClaims},
		{"RearmStale", testRearm},
		{"RearmIgnoresRecentAndTerminal", testRearmIgnores},
		{"SettleTransitions", testSettle},
		{"SettleMissingKeyIsNoop", testSettleMissing},
		{"SettleFencedByClaim", testSettleFenced},
		{"CancelPendingOnly", testCancel},
		{"EveryChangeRaisesTheVersion", testVersions},
		{"CountsAreClaimedOnlyAndBucketed", testCounts},
		{"PendingRoutesDistinctSorted", testPendingRoutes},
		{"OwnedShardScoping", testOwnedShards},
		{"MergeIncomingCopies", testMergeIncoming},
		{"MergeRedriveBeatsStaleDeadLetter", testMergeRedrive},
		{"TombstonesAreSlim", testSlimTombstones},
		{"ShardReadPagesMarksAndTokens", testShardRead},
		{"ShardReadsShareOneBudget", testShardReads},
		{"ShardDigestsFollowEveryChange", testDigests},
		// What a node reads and keeps beside the contract (node.go).
		{"DeadLetterPages", testDeadLetterPages},
		{"DeadLetterPageBudget", testDeadLetterBudget},
		{"NamespaceStatsCoverEveryShard", testNamespaceStats},
		{"CountClaimedHeldIgnoresOwnership", testCountClaimedHeld},
		{"ConfigEntries", testConfigEntries},
		// An operator's read-back (console.go).
		{"AttemptHistory", testAttemptHistory},
		{"ListRows", testListRows},
		{"PurgeDeadLetters", testPurgeDeadLetters},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newStore(t))
		})
	}
}

var ctx = context.Background()

func mustAppend(t *testing.T, s outbox.Store, rows ...outbox.Row) []outbox.AppendOutcome {
	t.Helper()
	out, err := s.Append(ctx, rows)
	if err != nil {
		t.Fatalf("Append(%d rows): %v", len(rows), err)
	}
	if len(out) != len(rows) {
		t.Fatalf("Append returned %d outcomes for %d rows", len(out), len(rows))
	}
	return out
}

func mustGet(t *testing.T, s outbox.Store, key string) outbox.Row {
	t.Helper()
	r, err := s.Get(ctx, key)
	if err != nil {
		t.Fatalf("Get(%q): %v", key, err)
	}
	return r
}

func mustClaim(t *testing.T, s outbox.Store, p outbox.ClaimParams) []outbox.Row {
	t.Helper()
	rows, err := s.Claim(ctx, p)
	if err != nil {
		t.Fatalf("Claim(%+v): %v", p, err)
	}
	return rows
}

func keysOf(rows []outbox.Row) []string {
	out := make([]string, len(rows))
	for i := range rows {
		out[i] = rows[i].DispatchKey
	}
	return out
}

func wantKeys(t *testing.T, what string, rows []outbox.Row, want ...string) {
	t.Helper()
	if got := keysOf(rows); !slices.Equal(got, want) {
		t.Fatalf("%s: got keys %v, want %v", what, got, want)
	}
}

func wantStatus(t *testing.T, s outbox.Store, key string, want outbox.Status) outbox.Row {
	t.Helper()
	r := mustGet(t, s, key)
	if r.Status != want {
		t.Fatalf("row %q: status %q, want %q", key, r.Status, want)
	}
	return r
}

func testAppendDefaults(t *testing.T, s outbox.Store) {
	in := Row("a", "ns", "q")
	in.Payload = []byte{0, 1, 2, 0xff}
	in.ContentType = "application/octet-stream"
	in.Ordinal = 42
	in.VisibleAfter = time.Time{} // defaults to CreatedAt
	in.Attempt = 0                // defaults to 1
	if out := mustAppend(t, s, in); out[0] != outbox.AppendCreated {
		t.Fatalf("outcome %q, want created", out[0])
	}
	got := wantStatus(t, s, "a", outbox.StatusPending)
	if got.Attempt != 1 {
		t.Errorf("Attempt = %d, want 1", got.Attempt)
	}
	if !got.VisibleAfter.Equal(T0) || !got.CreatedAt.Equal(T0) {
		t.Errorf("VisibleAfter %v CreatedAt %v, want both %v", got.VisibleAfter, got.CreatedAt, T0)
	}
	if !got.ClaimedAt.IsZero() || !got.FinishedAt.IsZero() {
		t.Errorf("ClaimedAt %v FinishedAt %v, want zero", got.ClaimedAt, got.FinishedAt)
	}
	if string(got.Payload) != string(in.Payload) || got.ContentType != in.ContentType {
		t.Errorf("payload %x %q, want %x %q", got.Payload, got.ContentType, in.Payload, in.ContentType)
	}
	if got.WorkflowID != in.WorkflowID || got.Ordinal != 42 || got.ActivityType != "send" ||
		got.Namespace != "ns" || got.TaskQueue != "q" {
		t.Errorf("fields not preserved: %+v", got)
	}
	// The same key always lands on the same shard.
	again := mustGet(t, s, "a")
	if again.Shard != got.Shard {
		t.Errorf("shard changed between reads: %d then %d", got.Shard, again.Shard)
	}
	// A caller-supplied status is ignored: appends are always pending.
	in2 := Row("b", "ns", "q")
	in2.Status = outbox.StatusDone
	mustAppend(t, s, in2)
	wantStatus(t, s, "b", outbox.StatusPending)
}

func testAppendDuplicate(t *testing.T, s outbox.Store) {
	mustAppend(t, s, Row("a", "ns", "q"))
	dup := Row("a", "other", "q2")
	dup.Payload = []byte("changed")
	out := mustAppend(t, s, dup, Row("b", "ns", "q"))
	if out[0] != outbox.AppendDuplicate || out[1] != outbox.AppendCreated {
		t.Fatalf("outcomes %v, want [duplicate created]", out)
	}
	got := mustGet(t, s, "a")
	if got.Namespace != "ns" || string(got.Payload) != `{"k":"a"}` {
		t.Fatalf("duplicate append changed the stored row: %+v", got)
	}
}

func testAppendDuplicateInBatch(t *testing.T, s outbox.Store) {
	first := Row("a", "ns", "q1")
	second := Row("a", "ns", "q2")
	out := mustAppend(t, s, first, second, Row("c", "ns", "q1"))
	if !slices.Equal(out, []outbox.AppendOutcome{outbox.AppendCreated, outbox.AppendDuplicate, outbox.AppendCreated}) {
		t.Fatalf("outcomes %v, want [created duplicate created]", out)
	}
	if got := mustGet(t, s, "a"); got.TaskQueue != "q1" {
		t.Fatalf("first row of the batch must win: task_queue %q", got.TaskQueue)
	}
}

func testAppendInvalid(t *testing.T, s outbox.Store) {
	for name, mutate := range map[string]func(*outbox.Row){
		"no key":        func(r *outbox.Row) { r.DispatchKey = "" },
		"no namespace":  func(r *outbox.Row) { r.Namespace = "" },
		"no task_queue": func(r *outbox.Row) { r.TaskQueue = "" },
	} {
		bad := Row("bad", "ns", "q")
		mutate(&bad)
		_, err := s.Append(ctx, []outbox.Row{Row("good-"+name, "ns", "q"), bad})
		if !errors.Is(err, outbox.ErrInvalidRow) {
			t.Fatalf("%s: err %v, want ErrInvalidRow", name, err)
		}
		if _, err := s.Get(ctx, "good-"+name); !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("%s: the valid row of a rejected batch was stored (Get err %v)", name, err)
		}
	}
}

func testAppendAfterTombstone(t *testing.T, s outbox.Store) {
	mustAppend(t, s, Row("a", "ns", "q"), Row("b", "ns", "q"))
	mustClaim(t, s, outbox.ClaimParams{Limit: 2, Now: T0})
	if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: "a", Claim: claimOf(t, s, "a"), Now: T0}); err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(ctx, outbox.FailParams{DispatchKey: "b", Claim: claimOf(t, s, "b"), LastError: "x", Now: T0}); err != nil {
		t.Fatal(err)
	}
	out := mustAppend(t, s, Row("a", "ns", "q"), Row("b", "ns", "q"))
	if out[0] != outbox.AppendDuplicate || out[1] != outbox.AppendDuplicate {
		t.Fatalf("append over tombstones: %v, want both duplicate", out)
	}
	wantStatus(t, s, "a", outbox.StatusDone)
	wantStatus(t, s, "b", outbox.StatusFailed)
}

func testGetMissing(t *testing.T, s outbox.Store) {
	if _, err := s.Get(ctx, "nope"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("Get missing: err %v, want ErrNotFound", err)
	}
}

func testClaimOrder(t *testing.T, s outbox.Store) {
	c := Row("c", "ns", "q")
	b := Row("b", "ns", "q")
	b.VisibleAfter = T0.Add(-time.Minute) // oldest visibility first
	a := Row("a", "ns", "q")
	d := Row("d", "ns2", "q")
	mustAppend(t, s, c, b, a, d)
	now := T0.Add(time.Second)
	got := mustClaim(t, s, outbox.ClaimParams{Limit: 3, Now: now})
	wantKeys(t, "first claim", got, "b", "a", "c")
	for _, r := range got {
		if r.Status != outbox.StatusClaimed || !r.ClaimedAt.Equal(now) {
			t.Fatalf("claimed row %q: status %q claimed_at %v, want claimed at %v", r.DispatchKey, r.Status, r.ClaimedAt, now)
		}
		stored := wantStatus(t, s, r.DispatchKey, outbox.StatusClaimed)
		if !stored.ClaimedAt.Equal(now) {
			t.Fatalf("stored claimed_at %v, want %v", stored.ClaimedAt, now)
		}
	}
	wantKeys(t, "second claim", mustClaim(t, s, outbox.ClaimParams{Limit: 10, Now: now}), "d")
	wantKeys(t, "third claim", mustClaim(t, s, outbox.ClaimParams{Limit: 10, Now: now}))
}

// batchClaimer is the one-transaction claim of a whole sweep
// (backpressure.BatchClaimer), which every store of the node implements.
type batchClaimer interface {
	ClaimBatch(ctx context.Context, run func(claim func(outbox.ClaimParams) ([]outbox.Row, error)) error) error
}

// testClaimBatch: the claims of one ClaimBatch take effect together when
// run returns nil, and none of them when it returns an error.
func testClaimBatch(t *testing.T, s outbox.Store) {
	bc, ok := s.(batchClaimer)
	if !ok {
		t.Fatalf("%T has no ClaimBatch", s)
	}
	mustAppend(t, s, Row("a", "ns", "q"), Row("b", "ns", "q"), Row("c", "ns2", "q"))
	now := T0.Add(time.Second)
	failed := errors.New("the sweep failed")
	err := bc.ClaimBatch(ctx, func(claim func(outbox.ClaimParams) ([]outbox.Row, error)) error {
		scope := outbox.ClaimScope{Namespace: "ns", TaskQueue: "q"}
		if rows, err := claim(outbox.ClaimParams{Limit: 2, Now: now, Scope: &scope}); err != nil || len(rows) != 2 {
			t.Fatalf("claim inside the batch: %d rows, %v", len(rows), err)
		}
		return failed
	})
	if !errors.Is(err, failed) {
		t.Fatalf("ClaimBatch = %v, want run's error", err)
	}
	for _, k := range []string{"a", "b", "c"} {
		wantStatus(t, s, k, outbox.StatusPending)
	}
	var got []outbox.Row
	err = bc.ClaimBatch(ctx, func(claim func(outbox.ClaimParams) ([]outbox.Row, error)) error {
		got = got[:0] // run may be called more than once
		for _, ns := range []string{"ns", "ns2"} {
			scope := outbox.ClaimScope{Namespace: ns, TaskQueue: "q"}
			rows, err := claim(outbox.ClaimParams{Limit: 10, Now: now, Scope: &scope})
			if err != nil {
				return err
			}
			got = append(got, rows...)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	wantKeys(t, "batch", got, "a", "b", "c")
	for _, k := range []string{"a", "b", "c"} {
		wantStatus(t, s, k, outbox.StatusClaimed)
	}
}

func testClaimLimitZero(t *testing.T, s outbox.Store) {
	mustAppend(t, s, Row("a", "ns", "q"))
	wantKeys(t, "limit 0", mustClaim(t, s, outbox.ClaimParams{Limit: 0, Now: T0}))
	wantStatus(t, s, "a", outbox.StatusPending)
}

func testInvisible(t *testing.T, s outbox.Store) {
	later := Row("later", "ns", "q")
	later.VisibleAfter = T0.Add(time.Hour)
	mustAppend(t, s, later, Row("now", "ns2", "q"))
	routes, err := s.PendingRoutes(ctx, T0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(routes, []outbox.ClaimScope{{Namespace: "ns2", TaskQueue: "q"}}) {
		t.Fatalf("routes at T0: %v, want only ns2/q", routes)
	}
	wantKeys(t, "claim at T0", mustClaim(t, s, outbox.ClaimParams{Limit: 10, Now: T0}), "now")
	scope := outbox.ClaimScope{Namespace: "ns", TaskQueue: "q"}
	wantKeys(t, "scoped claim at T0", mustClaim(t, s, outbox.ClaimParams{Scope: &scope, Limit: 10, Now: T0}))
	// Once visible, it is both listed and claimable.
	routes, err = s.PendingRoutes(ctx, T0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(routes, []outbox.ClaimScope{scope}) {
		t.Fatalf("routes at T0+1h: %v, want ns/q", routes)
	}
	wantKeys(t, "claim at T0+1h", mustClaim(t, s, outbox.ClaimParams{Limit: 10, Now: T0.Add(time.Hour)}), "later")
}

func testScopedClaim(t *testing.T, s outbox.Store) {
	mustAppend(t, s, Row("a1", "a", "q1"), Row("a2", "a", "q2"), Row("b1", "b", "q1"), Row("a3", "a", "q1"))
	scope := outbox.ClaimScope{Namespace: "a", TaskQueue: "q1"}
	wantKeys(t, "scoped", mustClaim(t, s, outbox.ClaimParams{Scope: &scope, Limit: 10, Now: T0}), "a1", "a3")
	wantStatus(t, s, "a2", outbox.StatusPending)
	wantStatus(t, s, "b1", outbox.StatusPending)
}

func testHeldSkipped(t *testing.T, s outbox.Store) {
	// Held rows come first in claim order; the limit must still fill from
	// the unheld rows behind them.
	var rows []outbox.Row
	for i := range 5 {
		r := Row(fmt.Sprintf("h%d", i), "ns", "q")
		r.WorkflowID = "held-wf"
		r.VisibleAfter = T0.Add(-time.Hour)
		rows = append(rows, r)
	}
	for i := range 3 {
		rows = append(rows, Row(fmt.Sprintf("u%d", i), "ns", "q"))
	}
	mustAppend(t, s, rows...)
	held := map[string]struct{}{"held-wf": {}}
	scope := outbox.ClaimScope{Namespace: "ns", TaskQueue: "q"}
	got := mustClaim(t, s, outbox.ClaimParams{Scope: &scope, Limit: 3, Now: T0, ExcludeWorkflows: held})
	wantKeys(t, "scoped claim excluding held", got, "u0", "u1", "u2")
	got = mustClaim(t, s, outbox.ClaimParams{Limit: 10, Now: T0, ExcludeWorkflows: held})
	wantKeys(t, "unscoped claim excluding held", got)
	for i := range 5 {
		wantStatus(t, s, fmt.Sprintf("h%d", i), outbox.StatusPending)
	}
	// Released: they flow.
	got = mustClaim(t, s, outbox.ClaimParams{Limit: 10, Now: T0})
	wantKeys(t, "after release", got, "h0", "h1", "h2", "h3", "h4")
}

func testConcurrentClaims(t *testing.T, s outbox.Store) {
	const n = 400
	rows := make([]outbox.Row, n)
	for i := range rows {
		rows[i] = Row(fmt.Sprintf("k%04d", i), fmt.Sprintf("ns%d", i%3), fmt.Sprintf("q%d", i%2))
	}
	mustAppend(t, s, rows...)
	var mu sync.Mutex
	seen := map[string]int{}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Go(func() {
			for {
				p := outbox.ClaimParams{Limit: 7, Now: T0}
				if w%2 == 0 {
					sc := outbox.ClaimScope{Namespace: fmt.Sprintf("ns%d", w%3), TaskQueue: "q0"}
					p.Scope = &sc
				}
				got, err := s.Claim(ctx, p)
				if err != nil {
					errs <- err
					return
				}
				if len(got) == 0 {
					return
				}
				mu.Lock()
				for _, r := range got {
					seen[r.DispatchKey]++
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(seen) != n {
		t.Fatalf("claimed %d distinct rows, want %d", len(seen), n)
	}
	for k, c := range seen {
		if c != 1 {
			t.Fatalf("row %q claimed %d times", k, c)
		}
	}
}

func testRearm(t *testing.T, s outbox.Store) {
	mustAppend(t, s, Row("a", "ns", "q"), Row("b", "ns", "q"), Row("c", "ns", "q"))
	mustClaim(t, s, outbox.ClaimParams{Limit: 1, Now: T0.Add(2 * time.Second)})  // a
	mustClaim(t, s, outbox.ClaimParams{Limit: 1, Now: T0.Add(1 * time.Second)})  // b, claimed earlier
	mustClaim(t, s, outbox.ClaimParams{Limit: 1, Now: T0.Add(10 * time.Second)}) // c, after cut-off
	if err := s.Retry(ctx, outbox.RetryParams{DispatchKey: "zz"}); err != nil {
		t.Fatal(err)
	}
	vis := T0.Add(time.Minute)
	got, err := s.RearmStale(ctx, outbox.RearmParams{OlderThan: T0.Add(5 * time.Second), VisibleAfter: vis, Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	wantKeys(t, "rearm oldest first, limit 1", got, "b")
	got, err = s.RearmStale(ctx, outbox.RearmParams{OlderThan: T0.Add(5 * time.Second), VisibleAfter: vis, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	wantKeys(t, "rearm rest", got, "a")
	for _, k := range []string{"a", "b"} {
		r := wantStatus(t, s, k, outbox.StatusPending)
		if !r.VisibleAfter.Equal(vis) || r.Attempt != 1 || !r.ClaimedAt.IsZero() {
			t.Fatalf("re-armed %q: visible_after %v attempt %d claimed_at %v", k, r.VisibleAfter, r.Attempt, r.ClaimedAt)
		}
	}
	wantStatus(t, s, "c", outbox.StatusClaimed)
	// Re-armed rows are not claimable before their new visible_after.
	wantKeys(t, "claim before visible", mustClaim(t, s, outbox.ClaimParams{Limit: 10, Now: vis.Add(-time.Nanosecond)}))
	wantKeys(t, "claim at visible", mustClaim(t, s, outbox.ClaimParams{Limit: 10, Now: vis}), "a", "b")
}

func testRearmIgnores(t *testing.T, s outbox.Store) {
	mustAppend(t, s, Row("done", "ns", "q"), Row("failed", "ns", "q"), Row("live", "ns", "q"), Row("excluded", "ns", "q"))
	mustClaim(t, s, outbox.ClaimParams{Limit: 10, Now: T0})
	// attempt survives re-arm
	if err := s.Retry(ctx, outbox.RetryParams{DispatchKey: "live", Claim: claimOf(t, s, "live"), NextAttempt: 3, VisibleAfter: T0, LastError: "boom"}); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, outbox.ClaimParams{Limit: 10, Now: T0})
	if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: "done", Claim: claimOf(t, s, "done"), Now: T0}); err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(ctx, outbox.FailParams{DispatchKey: "failed", Claim: claimOf(t, s, "failed"), LastError: "x", Now: T0}); err != nil {
		t.Fatal(err)
	}
	got, err := s.RearmStale(ctx, outbox.RearmParams{
		OlderThan: T0.Add(time.Hour), VisibleAfter: T0, Limit: 10,
		ExcludeKeys: map[string]struct{}{"excluded": {}},
	})
	if err != nil {
		t.Fatal(err)
	}
	wantKeys(t, "rearm", got, "live")
	if r := wantStatus(t, s, "live", outbox.StatusPending); r.Attempt != 3 {
		t.Fatalf("re-arm changed attempt to %d, want 3", r.Attempt)
	}
	wantStatus(t, s, "done", outbox.StatusDone)
	wantStatus(t, s, "failed", outbox.StatusFailed)
	wantStatus(t, s, "excluded", outbox.StatusClaimed)
	// A claim exactly at the cut-off is not older than it.
	got, err = s.RearmStale(ctx, outbox.RearmParams{OlderThan: T0, VisibleAfter: T0, Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	wantKeys(t, "rearm at cut-off", got)
}

func testSettle(t *testing.T, s outbox.Store) {
	mustAppend(t, s, Row("ok", "ns", "q"), Row("retry", "ns", "q"), Row("dead", "ns", "q"), Row("x-pend", "ns", "q"))
	claims := map[string]outbox.Version{}
	for _, r := range mustClaim(t, s, outbox.ClaimParams{Limit: 3, Now: T0}) { // dead, ok, retry (x-pend stays pending)
		claims[r.DispatchKey] = r.Version
	}
	fin := T0.Add(time.Second)
	if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: "ok", Claim: claims["ok"], Now: fin}); err != nil {
		t.Fatal(err)
	}
	r := wantStatus(t, s, "ok", outbox.StatusDone)
	if !r.FinishedAt.Equal(fin) || !r.ClaimedAt.IsZero() {
		t.Fatalf("done row: finished_at %v claimed_at %v, want %v and zero", r.FinishedAt, r.ClaimedAt, fin)
	}
	next := T0.Add(time.Minute)
	if err := s.Retry(ctx, outbox.RetryParams{DispatchKey: "retry", Claim: claims["retry"], NextAttempt: 2, VisibleAfter: next, LastError: "503"}); err != nil {
		t.Fatal(err)
	}
	r = wantStatus(t, s, "retry", outbox.StatusPending)
	if r.Attempt != 2 || !r.VisibleAfter.Equal(next) || r.LastError != "503" || !r.ClaimedAt.IsZero() {
		t.Fatalf("retried row: %+v", r)
	}
	if err := s.Fail(ctx, outbox.FailParams{DispatchKey: "dead", Claim: claims["dead"], LastError: "400 bad", Now: fin}); err != nil {
		t.Fatal(err)
	}
	r = wantStatus(t, s, "dead", outbox.StatusFailed)
	if r.LastError != "400 bad" || !r.FinishedAt.Equal(fin) {
		t.Fatalf("failed row: %+v", r)
	}
	// Retry and Fail apply only to the claim they settle: never to a
	// pending row.
	pend := claimOf(t, s, "x-pend")
	if err := s.Retry(ctx, outbox.RetryParams{DispatchKey: "x-pend", Claim: pend, NextAttempt: 5, VisibleAfter: next}); err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(ctx, outbox.FailParams{DispatchKey: "x-pend", Claim: pend, LastError: "late", Now: fin}); err != nil {
		t.Fatal(err)
	}
	if r := wantStatus(t, s, "x-pend", outbox.StatusPending); r.Attempt != 1 || r.LastError != "" {
		t.Fatalf("retry or fail of a pending row changed it: %+v", r)
	}
	// Terminal rows stay terminal, whatever the fence.
	for _, k := range []string{"ok", "dead"} {
		v := claimOf(t, s, k)
		must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: k, Claim: v, Now: fin}))
		must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: k, Claim: v, LastError: "late", Now: fin}))
		must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: k, Claim: v, NextAttempt: 2, VisibleAfter: next}))
	}
	wantStatus(t, s, "ok", outbox.StatusDone)
	wantStatus(t, s, "dead", outbox.StatusFailed)
	// Complete applies to a pending row of the claim's generation: a late
	// success after the row went back to pending.
	if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: "retry", Claim: claims["retry"], Now: fin}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, s, "retry", outbox.StatusDone)
	wantKeys(t, "only x-pend left to claim", mustClaim(t, s, outbox.ClaimParams{Limit: 10, Now: next}), "x-pend")
}

// testSettleFenced: a settle from a claim that was re-armed and claimed
// again is a no-op; the current claim's settle applies.
func testSettleFenced(t *testing.T, s outbox.Store) {
	mustAppend(t, s, Row("a", "ns", "q"), Row("b", "ns", "q"), Row("c", "ns", "q"))
	first := map[string]outbox.Version{}
	for _, r := range mustClaim(t, s, outbox.ClaimParams{Limit: 3, Now: T0}) {
		first[r.DispatchKey] = r.Version
	}
	// Every claim outlives its visibility timeout and is claimed again.
	rearmed, err := s.RearmStale(ctx, outbox.RearmParams{OlderThan: T0.Add(time.Minute), VisibleAfter: T0, Limit: 10})
	if err != nil || len(rearmed) != 3 {
		t.Fatalf("re-arm: %d rows, %v", len(rearmed), err)
	}
	second := map[string]outbox.Version{}
	for _, r := range mustClaim(t, s, outbox.ClaimParams{Limit: 3, Now: T0.Add(time.Second)}) {
		second[r.DispatchKey] = r.Version
		if r.Version == first[r.DispatchKey] {
			t.Fatalf("row %q claimed twice at the same version %v", r.DispatchKey, r.Version)
		}
	}
	fin := T0.Add(2 * time.Second)
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "a", Claim: first["a"], Now: fin}))
	must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: "b", Claim: first["b"], NextAttempt: 2, VisibleAfter: fin, LastError: "stale"}))
	must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: "c", Claim: first["c"], LastError: "stale", Now: fin}))
	for _, k := range []string{"a", "b", "c"} {
		r := wantStatus(t, s, k, outbox.StatusClaimed)
		if r.Version != second[k] || r.Attempt != 1 || r.LastError != "" {
			t.Fatalf("stale settle changed row %q: %+v", k, r)
		}
	}
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "a", Claim: second["a"], Now: fin}))
	must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: "b", Claim: second["b"], NextAttempt: 2, VisibleAfter: fin, LastError: "503"}))
	must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: "c", Claim: second["c"], LastError: "400", Now: fin}))
	wantStatus(t, s, "a", outbox.StatusDone)
	if r := wantStatus(t, s, "b", outbox.StatusPending); r.Attempt != 2 || r.LastError != "503" {
		t.Fatalf("current claim's retry: %+v", r)
	}
	wantStatus(t, s, "c", outbox.StatusFailed)
}

func testCancel(t *testing.T, s outbox.Store) {
	mustAppend(t, s, Row("p", "ns", "q"), Row("c", "ns", "q"), Row("d", "ns", "q"))
	scope := outbox.ClaimScope{Namespace: "ns", TaskQueue: "q"}
	claimed := mustClaim(t, s, outbox.ClaimParams{Scope: &scope, Limit: 2, Now: T0}) // c, d
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "d", Claim: claimed[1].Version, Now: T0}))
	fin := T0.Add(time.Second)
	for _, tc := range []struct {
		key  string
		want bool
		st   outbox.Status
	}{{"p", true, outbox.StatusCancelled}, {"c", false, outbox.StatusClaimed}, {"d", false, outbox.StatusDone}, {"missing", false, ""}} {
		ok, err := s.Cancel(ctx, outbox.CancelParams{DispatchKey: tc.key, Reason: "withdrawn by operator", Now: fin})
		if err != nil || ok != tc.want {
			t.Fatalf("cancel %q: %v %v, want %v", tc.key, ok, err, tc.want)
		}
		if tc.st != "" {
			wantStatus(t, s, tc.key, tc.st)
		}
	}
	r := mustGet(t, s, "p")
	if !r.FinishedAt.Equal(fin) || r.LastError != "withdrawn by operator" {
		t.Fatalf("cancelled row: %+v", r)
	}
	if ok, _ := s.Cancel(ctx, outbox.CancelParams{DispatchKey: "p", Now: fin}); ok {
		t.Fatal("cancelled twice")
	}
	if out := mustAppend(t, s, Row("p", "ns", "q")); out[0] != outbox.AppendDuplicate {
		t.Fatalf("append over a cancelled row: %v, want duplicate", out)
	}
	if _, err := s.Get(ctx, "missing"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("cancel of a missing key created it: %v", err)
	}
}

// testVersions: Append starts at FirstVersion; a claim keeps the version;
// every other change raises it (and Redrive's generation).
func testVersions(t *testing.T, s outbox.Store) {
	in := Row("v", "ns", "q")
	in.Version = outbox.Version{Gen: 9, Seq: 9} // ignored: the row starts here
	mustAppend(t, s, in, Row("w", "ns", "q"))
	if v := claimOf(t, s, "v"); v != outbox.FirstVersion {
		t.Fatalf("appended row at version %v, want %v", v, outbox.FirstVersion)
	}
	prev := outbox.FirstVersion
	step := func(what string, wantGen uint32) {
		t.Helper()
		v := claimOf(t, s, "v")
		if v.Seq <= prev.Seq || v.Gen != wantGen {
			t.Fatalf("after %s: version %v, previous %v (want a higher seq, generation %d)", what, v, prev, wantGen)
		}
		prev = v
	}
	scope := outbox.ClaimScope{Namespace: "ns", TaskQueue: "q"}
	claim := func() outbox.Version {
		t.Helper()
		rows := mustClaim(t, s, outbox.ClaimParams{Scope: &scope, Limit: 1, Now: T0.Add(time.Hour)})
		if len(rows) != 1 || rows[0].DispatchKey != "v" {
			t.Fatalf("claim: %v, want v", keysOf(rows))
		}
		if rows[0].Version != prev {
			t.Fatalf("claim changed the version: %v → %v", prev, rows[0].Version)
		}
		return rows[0].Version
	}
	c := claim()
	must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: "v", Claim: c, VisibleAfter: T0}))
	step("retry", 0)
	claim()
	if _, err := s.RearmStale(ctx, outbox.RearmParams{OlderThan: T0.Add(2 * time.Hour), VisibleAfter: T0, Limit: 10}); err != nil {
		t.Fatal(err)
	}
	step("re-arm", 0)
	c = claim()
	must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: "v", Claim: c, LastError: "400", Now: T0}))
	step("fail", 0)
	if r, ok := s.(interface {
		Redrive(ctx context.Context, namespace string, keys []string, now time.Time) (int, error)
	}); ok {
		if n, err := r.Redrive(ctx, "ns", []string{"v"}, T0); err != nil || n != 1 {
			t.Fatalf("redrive: %d %v", n, err)
		}
		step("redrive", 1)
		if r := mustGet(t, s, "v"); r.Status != outbox.StatusPending || r.Attempt != 1 || r.LastError != "" {
			t.Fatalf("redriven row: %+v", r)
		}
		c = claim()
		must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "v", Claim: c, Now: T0}))
		step("complete", 1)
	} else {
		t.Fatalf("store %T lacks Redrive: every store must offer it", s)
	}
	if ok, err := s.Cancel(ctx, outbox.CancelParams{DispatchKey: "w", Now: T0}); err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	if v := claimOf(t, s, "w"); v != outbox.FirstVersion.Next() {
		t.Fatalf("cancelled row at %v, want %v", v, outbox.FirstVersion.Next())
	}
}

func testSettleMissing(t *testing.T, s outbox.Store) {
	if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: "x", Now: T0}); err != nil {
		t.Fatalf("Complete missing: %v", err)
	}
	if err := s.Retry(ctx, outbox.RetryParams{DispatchKey: "x", NextAttempt: 2, VisibleAfter: T0}); err != nil {
		t.Fatalf("Retry missing: %v", err)
	}
	if err := s.Fail(ctx, outbox.FailParams{DispatchKey: "x", Now: T0}); err != nil {
		t.Fatalf("Fail missing: %v", err)
	}
	if _, err := s.Get(ctx, "x"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("settling a missing key created it: %v", err)
	}
}

func testCounts(t *testing.T, s outbox.Store) {
	var rows []outbox.Row
	for i := range 6 {
		rows = append(rows, Row(fmt.Sprintf("a%d", i), "alpha", fmt.Sprintf("q%d", i%2)))
	}
	rows = append(rows, Row("b0", "beta", "q"), Row("b1", "beta", "q"))
	mustAppend(t, s, rows...)
	alpha := outbox.ClaimScope{Namespace: "alpha", TaskQueue: "q0"}
	mustClaim(t, s, outbox.ClaimParams{Scope: &alpha, Limit: 3, Now: T0}) // a0 a2 a4
	beta := outbox.ClaimScope{Namespace: "beta", TaskQueue: "q"}
	mustClaim(t, s, outbox.ClaimParams{Scope: &beta, Limit: 2, Now: T0})
	if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: "b0", Claim: claimOf(t, s, "b0"), Now: T0}); err != nil {
		t.Fatal(err)
	}
	check := func(name string, got int, err error, want int) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got != want {
			t.Fatalf("%s = %d, want %d", name, got, want)
		}
	}
	n, err := s.CountClaimed(ctx, "alpha")
	check("CountClaimed(alpha)", n, err, 3)
	n, err = s.CountClaimed(ctx, "beta")
	check("CountClaimed(beta)", n, err, 1)
	n, err = s.CountInFlight(ctx, "alpha")
	check("CountInFlight(alpha)", n, err, 6)
	n, err = s.CountInFlight(ctx, "beta")
	check("CountInFlight(beta)", n, err, 1)
	n, err = s.CountClaimed(ctx, "nobody")
	check("CountClaimed(nobody)", n, err, 0)
	m, err := s.CountClaimedByNamespace(ctx, []string{"alpha", "beta", "gamma"})
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 3 || m["alpha"] != 3 || m["beta"] != 1 || m["gamma"] != 0 {
		t.Fatalf("CountClaimedByNamespace = %v, want alpha:3 beta:1 gamma:0", m)
	}
	if _, has := m["gamma"]; !has {
		t.Fatal("CountClaimedByNamespace must have an entry for every asked namespace")
	}
	m, err = s.CountClaimedByNamespace(ctx, []string{"beta"})
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || m["beta"] != 1 {
		t.Fatalf("CountClaimedByNamespace(beta) = %v, want only beta:1", m)
	}
}

func testPendingRoutes(t *testing.T, s outbox.Store) {
	mustAppend(t, s, Row("1", "b", "q2"), Row("2", "a", "q9"), Row("3", "b", "q1"), Row("4", "b", "q2"), Row("5", "c", "q"))
	c := outbox.ClaimScope{Namespace: "c", TaskQueue: "q"}
	mustClaim(t, s, outbox.ClaimParams{Scope: &c, Limit: 10, Now: T0}) // c has no pending row left
	routes, err := s.PendingRoutes(ctx, T0)
	if err != nil {
		t.Fatal(err)
	}
	want := []outbox.ClaimScope{{Namespace: "a", TaskQueue: "q9"}, {Namespace: "b", TaskQueue: "q1"}, {Namespace: "b", TaskQueue: "q2"}}
	if !slices.Equal(routes, want) {
		t.Fatalf("PendingRoutes = %v, want %v", routes, want)
	}
}

func testOwnedShards(t *testing.T, s outbox.Store) {
	sc := need[ShardScoped](t, s, "SetOwnedShards (ownership scoping)")
	// Find two keys on different shards.
	var rows []outbox.Row
	for i := range 40 {
		rows = append(rows, Row(fmt.Sprintf("key-%d", i), "ns", "q"))
	}
	mustAppend(t, s, rows...)
	mine := mustGet(t, s, "key-0").Shard
	var mineKeys, otherKeys []string
	for i := range 40 {
		k := fmt.Sprintf("key-%d", i)
		if mustGet(t, s, k).Shard == mine {
			mineKeys = append(mineKeys, k)
		} else {
			otherKeys = append(otherKeys, k)
		}
	}
	if len(otherKeys) == 0 {
		t.Fatal("all 40 keys on one shard: the store needs more shards for this case")
	}
	sc.SetOwnedShards([]uint32{mine})
	routes, err := s.PendingRoutes(ctx, T0)
	if err != nil {
		t.Fatal(err)
	}
	if len(routes) != 1 {
		t.Fatalf("routes with an owned row: %v", routes)
	}
	slices.Sort(mineKeys)
	got := mustClaim(t, s, outbox.ClaimParams{Limit: 100, Now: T0})
	gotKeys := keysOf(got)
	slices.Sort(gotKeys)
	if !slices.Equal(gotKeys, mineKeys) {
		t.Fatalf("claimed %v, want only owned-shard keys %v", gotKeys, mineKeys)
	}
	n, err := s.CountClaimed(ctx, "ns")
	if err != nil || n != len(mineKeys) {
		t.Fatalf("CountClaimed = %d, %v; want %d", n, err, len(mineKeys))
	}
	if n, err := s.CountInFlight(ctx, "ns"); err != nil || n != len(mineKeys) {
		t.Fatalf("CountInFlight = %d, %v; want %d (owned shards only)", n, err, len(mineKeys))
	}
	routes, err = s.PendingRoutes(ctx, T0)
	if err != nil || len(routes) != 0 {
		t.Fatalf("routes after claiming every owned row: %v, %v (non-owned rows must not be listed)", routes, err)
	}
	// Rows of other shards are still stored and readable, and still dedupe.
	wantStatus(t, s, otherKeys[0], outbox.StatusPending)
	if out := mustAppend(t, s, Row(otherKeys[0], "ns", "q")); out[0] != outbox.AppendDuplicate {
		t.Fatalf("append of a stored non-owned key: %v, want duplicate", out)
	}
	// Owning nothing claims nothing.
	sc.SetOwnedShards([]uint32{})
	wantKeys(t, "owning nothing", mustClaim(t, s, outbox.ClaimParams{Limit: 100, Now: T0}))
	// Taking ownership makes them claimable.
	sc.SetOwnedShards(nil)
	if got := mustClaim(t, s, outbox.ClaimParams{Limit: 100, Now: T0}); len(got) != len(otherKeys) {
		t.Fatalf("after owning all: claimed %d, want %d", len(got), len(otherKeys))
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// claimOf is the stored row's current Version: for a claimed row, the
// fence its settle carries.
func claimOf(t *testing.T, s outbox.Store, key string) outbox.Version {
	t.Helper()
	return mustGet(t, s, key).Version
}

func mustMerge(t *testing.T, m Merger, rows ...outbox.Row) outbox.MergeResult {
	t.Helper()
	res, err := m.Merge(ctx, rows)
	if err != nil {
		t.Fatalf("Merge(%d rows): %v", len(rows), err)
	}
	return res
}

// testMergeIncoming: incoming copies go through NormalizeIncoming and
// outbox.MergeIncoming; a resend changes nothing; a bad row rejects the batch.
func testMergeIncoming(t *testing.T, s outbox.Store) {
	m := need[Merger](t, s, "Merge (incoming copies)")
	// Absent: created, a claimed copy stored pending.
	in := Row("a", "ns", "q")
	in.Status, in.ClaimedAt, in.Version = outbox.StatusClaimed, T0, outbox.Version{Seq: 4}
	if res := mustMerge(t, m, in); res != (outbox.MergeResult{Created: 1}) {
		t.Fatalf("merge of an absent row: %+v", res)
	}
	if r := wantStatus(t, s, "a", outbox.StatusPending); r.Version != in.Version || !r.ClaimedAt.IsZero() {
		t.Fatalf("stored copy: %+v", r)
	}
	// Claimed here vs the pending copy it came from: the claim stays.
	scope := outbox.ClaimScope{Namespace: "ns", TaskQueue: "q"}
	claimed := mustClaim(t, s, outbox.ClaimParams{Scope: &scope, Limit: 1, Now: T0})
	if len(claimed) != 1 {
		t.Fatal("claim of the merged row")
	}
	stale := in
	stale.Status, stale.ClaimedAt = outbox.StatusPending, time.Time{}
	if res := mustMerge(t, m, stale, in); res.Skipped != 2 {
		t.Fatalf("merge of the claim's own copies: %+v, want both skipped", res)
	}
	wantStatus(t, s, "a", outbox.StatusClaimed)
	// A terminal copy of the same generation wins over the claim; the
	// claim's settle is then a no-op (the row is not claimed any more).
	done := in
	done.Status, done.ClaimedAt, done.FinishedAt, done.Version = outbox.StatusDone, time.Time{}, T0, outbox.Version{Seq: 5}
	done.CreatedAt = T0.Add(-time.Hour) // an earlier CreatedAt travels too
	if res := mustMerge(t, m, done); res.Updated != 1 {
		t.Fatalf("merge of a terminal copy: %+v", res)
	}
	must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: "a", Claim: claimed[0].Version, VisibleAfter: T0}))
	if r := wantStatus(t, s, "a", outbox.StatusDone); !r.CreatedAt.Equal(T0.Add(-time.Hour)) {
		t.Fatalf("merged row CreatedAt %v, want the earlier %v", r.CreatedAt, T0.Add(-time.Hour))
	}
	// Live copies never undo it; resending it changes nothing.
	if res := mustMerge(t, m, stale, done); res.Skipped != 2 {
		t.Fatalf("resend after the terminal copy: %+v", res)
	}
	wantStatus(t, s, "a", outbox.StatusDone)
	// A newer pending copy beats an older pending one.
	mustAppend(t, s, Row("b", "ns", "q"))
	newer := Row("b", "ns", "q")
	newer.Status = outbox.StatusPending
	newer.Attempt, newer.LastError, newer.Version = 3, "503", outbox.Version{Seq: 3}
	if res := mustMerge(t, m, newer); res.Updated != 1 {
		t.Fatalf("newer pending copy: %+v", res)
	}
	if r := wantStatus(t, s, "b", outbox.StatusPending); r.Attempt != 3 || r.LastError != "503" {
		t.Fatalf("stored %+v, want the newer copy", r)
	}
	// A row claimed here keeps its claim against a live copy of its
	// generation with any later Seq (another node re-armed its own stale
	// claim, or retried): the delivery runs here, and taking the copy
	// would let the next claim send the row again. The claim's settle
	// then meets that copy under outbox.Merge: done outranks it, a retry
	// is ordered by Seq.
	mustAppend(t, s, Row("r1", "ns", "rq"), Row("r2", "ns", "rq"))
	rq := outbox.ClaimScope{Namespace: "ns", TaskQueue: "rq"}
	claimedR := mustClaim(t, s, outbox.ClaimParams{Scope: &rq, Limit: 2, Now: T0})
	if len(claimedR) != 2 {
		t.Fatalf("claimed %d of r1, r2", len(claimedR))
	}
	for _, r := range claimedR {
		peer := r
		peer.Status, peer.ClaimedAt, peer.Version = outbox.StatusPending, time.Time{}, r.Version.Next().Next()
		peer.CreatedAt = T0.Add(-time.Minute)
		if res := mustMerge(t, m, peer); res.Skipped+res.Updated != 1 {
			t.Fatalf("merge of a peer's re-armed copy of %s: %+v", r.DispatchKey, res)
		}
		got := wantStatus(t, s, r.DispatchKey, outbox.StatusClaimed)
		if got.Version != r.Version || !got.CreatedAt.Equal(T0.Add(-time.Minute)) {
			t.Fatalf("%s after a peer's re-armed copy: version %v created %v, want the claim's %v and the earlier %v",
				r.DispatchKey, got.Version, got.CreatedAt, r.Version, T0.Add(-time.Minute))
		}
		if r.DispatchKey == "r1" {
			must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "r1", Claim: r.Version, Now: T0}))
			mustMerge(t, m, peer)
			wantStatus(t, s, "r1", outbox.StatusDone)
			continue
		}
		must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: "r2", Claim: r.Version, VisibleAfter: T0}))
		mustMerge(t, m, peer)
		if got := wantStatus(t, s, "r2", outbox.StatusPending); got.Version != peer.Version {
			t.Fatalf("r2 after its retry met the peer's copy again: version %v, want the peer's later %v", got.Version, peer.Version)
		}
	}
	// A bad row rejects the whole batch.
	bad := Row("c", "ns", "q")
	bad.Status = "weird"
	if _, err := m.Merge(ctx, []outbox.Row{Row("good", "ns", "q"), bad}); !errors.Is(err, outbox.ErrInvalidRow) {
		t.Fatalf("merge with an invalid status: %v", err)
	}
	if _, err := s.Get(ctx, "good"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("part of a rejected merge was stored: %v", err)
	}
}

// testSlimTombstones: done and cancelled rows are stored slim (no payload,
// no content type; outbox.Slim) and still dedupe appends and answer Get
// with their identity, status, times, attempts and last error; a dead
// letter keeps its payload and a redrive delivers it; a full copy of a
// tombstone merged in is stored slim; a slim tombstone merged over a full
// live copy wins; and slimming never changes a shard digest.
func testSlimTombstones(t *testing.T, s outbox.Store) {
	m := need[Merger](t, s, "Merge (incoming copies)")
	d := need[Digester](t, s, "ShardDigest")
	mustAppend(t, s, Row("done", "ns", "q"), Row("dead", "ns", "q"), Row("gone", "ns", "q"), Row("live", "ns", "q"))
	claims := map[string]outbox.Version{}
	for _, r := range mustClaim(t, s, outbox.ClaimParams{Limit: 2, Now: T0}) { // dead, done
		claims[r.DispatchKey] = r.Version
	}
	fin := T0.Add(time.Second)
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "done", Claim: claims["done"], Now: fin}))
	must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: "dead", Claim: claims["dead"], LastError: "400", Now: fin}))
	if ok, err := s.Cancel(ctx, outbox.CancelParams{DispatchKey: "gone", Reason: "operator", Now: fin}); err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	for _, k := range []string{"done", "gone"} {
		r := mustGet(t, s, k)
		want := Row(k, "ns", "q")
		if !outbox.IsSlim(&r) {
			t.Fatalf("%s row %q kept its payload: %q (%q)", r.Status, k, r.Payload, r.ContentType)
		}
		if r.WorkflowID != want.WorkflowID || r.Ordinal != want.Ordinal || r.Namespace != "ns" || r.TaskQueue != "q" ||
			r.ActivityType != want.ActivityType || r.Attempt != 1 || !r.FinishedAt.Equal(fin) || !r.CreatedAt.Equal(T0) {
			t.Fatalf("tombstone %q lost what the row lookup shows: %+v", k, r)
		}
	}
	if r := mustGet(t, s, "gone"); r.LastError != "operator" {
		t.Fatalf("cancel reason %q", r.LastError)
	}
	if out := mustAppend(t, s, Row("done", "ns", "q"), Row("gone", "ns", "q")); out[0] != outbox.AppendDuplicate || out[1] != outbox.AppendDuplicate {
		t.Fatalf("append over slim tombstones: %v", out)
	}
	dead := wantStatus(t, s, "dead", outbox.StatusFailed)
	if want := Row("dead", "ns", "q"); string(dead.Payload) != string(want.Payload) || dead.ContentType != want.ContentType {
		t.Fatalf("dead letter lost its payload: %q %q", dead.Payload, dead.ContentType)
	}

	// A full copy of the tombstone (a node that kept its payload) changes
	// nothing, and the digest is the one of the slim row.
	shard := shards.ShardOf("done", need[ShardReader](t, s, "ShardCount").ShardCount())
	before, err := d.ShardDigest(ctx, shard)
	must(t, err)
	full := mustGet(t, s, "done")
	full.Payload, full.ContentType = []byte(`{"k":"done"}`), "application/json"
	if res := mustMerge(t, m, full); res.Skipped != 1 {
		t.Fatalf("merge of a full copy of a stored tombstone: %+v, want skipped", res)
	}
	if r := mustGet(t, s, "done"); !outbox.IsSlim(&r) {
		t.Fatalf("merge stored the full copy: %+v", r)
	}
	if after, err := d.ShardDigest(ctx, shard); err != nil || after != before {
		t.Fatalf("digest %+v → %+v (%v)", before, after, err)
	}
	// A full tombstone arriving over a live row is stored slim; a slim
	// tombstone beats the full live copy of its generation.
	tomb := mustGet(t, s, "live")
	tomb.Status, tomb.FinishedAt, tomb.Version = outbox.StatusDone, fin, outbox.Version{Seq: 2}
	if res := mustMerge(t, m, tomb); res.Updated != 1 {
		t.Fatalf("merge of a full tombstone over a live row: %+v", res)
	}
	if r := wantStatus(t, s, "live", outbox.StatusDone); !outbox.IsSlim(&r) || r.Version != tomb.Version {
		t.Fatalf("stored tombstone: %+v", r)
	}
	// Redriving the dead letter delivers its payload.
	rd := need[interface {
		Redrive(ctx context.Context, namespace string, keys []string, now time.Time) (int, error)
	}](t, s, "Redrive")
	if n, err := rd.Redrive(ctx, "ns", []string{"dead"}, fin); err != nil || n != 1 {
		t.Fatalf("redrive: %d %v", n, err)
	}
	got := mustClaim(t, s, outbox.ClaimParams{Limit: 5, Now: fin})
	if len(got) != 1 || got[0].DispatchKey != "dead" || string(got[0].Payload) != `{"k":"dead"}` {
		t.Fatalf("claim after redrive: %+v", got)
	}
}

// testMergeRedrive: a redriven row is not reverted by a stale copy of its
// dead letter arriving late (a partition duplicate, a node that missed the
// redrive fan-out), and a stale copy redriven elsewhere replaces ours.
func testMergeRedrive(t *testing.T, s outbox.Store) {
	m := need[Merger](t, s, "Merge (incoming copies)")
	r := need[interface {
		Redrive(ctx context.Context, namespace string, keys []string, now time.Time) (int, error)
	}](t, s, "Redrive")
	mustAppend(t, s, Row("k", "ns", "q"), Row("j", "ns", "q"))
	for _, c := range mustClaim(t, s, outbox.ClaimParams{Limit: 2, Now: T0}) {
		must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: c.DispatchKey, Claim: c.Version, LastError: "400", Now: T0}))
	}
	deadK, deadJ := mustGet(t, s, "k"), mustGet(t, s, "j")
	if n, err := r.Redrive(ctx, "ns", []string{"k"}, T0.Add(time.Minute)); err != nil || n != 1 {
		t.Fatalf("redrive: %d %v", n, err)
	}
	// The stale dead letter, even with more changes counted on it.
	deadK.Version.Seq += 7
	if res := mustMerge(t, m, deadK); res.Skipped != 1 {
		t.Fatalf("stale dead letter merged over the redrive: %+v", res)
	}
	if got := wantStatus(t, s, "k", outbox.StatusPending); got.Version.Gen != 1 || got.Attempt != 1 {
		t.Fatalf("redriven row after the stale copy: %+v", got)
	}
	// The other way: j was redriven on another node; its copy wins here.
	redriven := deadJ
	if !outbox.ApplyRedrive(&redriven, T0.Add(time.Minute)) {
		t.Fatal("redrive of the copy")
	}
	if res := mustMerge(t, m, redriven); res.Updated != 1 {
		t.Fatalf("redriven copy over our dead letter: %+v", res)
	}
	wantStatus(t, s, "j", outbox.StatusPending)
}

// testShardRead: pages in (CreatedAt, dispatch_key) order bounded by rows
// and bytes, resume tokens, marks (not claimable, not read twice, cleared
// by any change), CompleteTransfer and AbortTransfer.
func testShardRead(t *testing.T, s outbox.Store) {
	sr := need[ShardReader](t, s, "ReadShard, CompleteTransfer, AbortTransfer, ForeignShards and ShardCount (transfer source)")
	shard, keys := appendShardReadRows(t, s, sr)
	checkCopyPages(t, sr, shard, keys)
	checkShardReadByteBound(t, s, sr, shard, keys[0])

	// A move. Marking an owned shard fails.
	if _, err := sr.ReadShard(ctx, outbox.ShardRead{Shard: shard, MaxRows: 10, Mark: true}); !errors.Is(err, outbox.ErrShardOwned) {
		t.Fatalf("marking read of an owned shard: %v, want ErrShardOwned", err)
	}
	scope := outbox.ClaimScope{Namespace: "ns", TaskQueue: "q"}
	first, second := markAllButClaimed(t, s, sr, shard, keys, scope)
	// Marked rows are not claimable, even when the shard is owned again.
	sr.SetOwnedShards(nil)
	if rows := claimedOfShard(t, s, shard, scope); len(rows) != 0 {
		t.Fatalf("claimed marked rows: %v", rows)
	}
	sr.SetOwnedShards([]uint32{})
	changed := checkCompleteKeepsChanged(t, s, sr, first)
	checkAbortUnmarks(t, s, sr, shard, scope, changed, second)
}

// appendShardReadRows appends ten rows on one shard with increasing
// CreatedAt (the first two share T0 and sort by key), plus rows on other
// shards that a read of it must not show. It returns the shard and its
// keys in read order.
func appendShardReadRows(t *testing.T, s outbox.Store, sr ShardReader) (uint32, []string) {
	t.Helper()
	shard := shards.ShardOf("r000", sr.ShardCount())
	var keys []string
	for i := 0; len(keys) < 10; i++ {
		k := fmt.Sprintf("r%03d", i)
		r := Row(k, "ns", "q")
		r.CreatedAt = T0.Add(time.Duration(max(len(keys)-1, 0)) * time.Second)
		if shards.ShardOf(k, sr.ShardCount()) == shard {
			keys = append(keys, k)
		} else if i%7 != 0 {
			continue
		}
		mustAppend(t, s, r)
	}
	return shard, keys
}

// checkCopyPages requires a copy read in pages of 3 to return every row of
// shard, in order, each page resuming from the previous page's token.
func checkCopyPages(t *testing.T, sr ShardReader, shard uint32, keys []string) {
	t.Helper()
	var got []string
	var after []byte
	for range 10 {
		p, err := sr.ReadShard(ctx, outbox.ShardRead{Shard: shard, After: after, MaxRows: 3})
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, keysOf(p.Rows)...)
		if len(p.Rows) > 3 {
			t.Fatalf("page of %d rows, max 3", len(p.Rows))
		}
		after = p.Next
		if p.Done {
			break
		}
	}
	if !slices.Equal(got, keys) {
		t.Fatalf("copy read %v, want %v", got, keys)
	}
}

// checkShardReadByteBound requires a page to hold at least one row, then
// stay within MaxBytes: a bound of 3½ rows (of firstKey's size) reads 3.
func checkShardReadByteBound(t *testing.T, s outbox.Store, sr ShardReader, shard uint32, firstKey string) {
	t.Helper()
	one := outbox.RowBytes(ptr(mustGet(t, s, firstKey)))
	p, err := sr.ReadShard(ctx, outbox.ShardRead{Shard: shard, MaxRows: 100, MaxBytes: 1})
	if err != nil || len(p.Rows) != 1 || p.Done {
		t.Fatalf("read with a tiny byte bound: %d rows done=%v %v, want 1 row and more", len(p.Rows), p.Done, err)
	}
	if p, _ := sr.ReadShard(ctx, outbox.ShardRead{Shard: shard, MaxRows: 100, MaxBytes: 3*one + one/2}); len(p.Rows) != 3 {
		t.Fatalf("read within %d bytes (rows of ~%d): %d rows, want 3", 3*one+one/2, one, len(p.Rows))
	}
}

// markAllButClaimed claims keys[5], gives shard away, and marks the rest
// in two pages (4, then the others): a claimed row is not offered for a
// move and a marked row is not offered twice. It returns the two pages
// and leaves the shard foreign.
func markAllButClaimed(t *testing.T, s outbox.Store, sr ShardReader, shard uint32, keys []string, scope outbox.ClaimScope) (first, second outbox.ShardPage) {
	t.Helper()
	held := map[string]struct{}{}
	for _, k := range keys {
		if k != keys[5] {
			held["wf-"+k] = struct{}{}
		}
	}
	claimed := mustClaim(t, s, outbox.ClaimParams{Scope: &scope, Limit: 100, Now: T0.Add(time.Hour), ExcludeWorkflows: held})
	claimedKey := keys[5]
	if !slices.Contains(keysOf(claimed), claimedKey) {
		t.Fatalf("setup: claim %v did not take %s", keysOf(claimed), claimedKey)
	}
	sr.SetOwnedShards([]uint32{})
	fs, err := sr.ForeignShards(ctx)
	if err != nil || !slices.Contains(fs, shard) {
		t.Fatalf("foreign shards %v (%v), want %d among them", fs, err, shard)
	}
	first, err = sr.ReadShard(ctx, outbox.ShardRead{Shard: shard, MaxRows: 4, Mark: true})
	must(t, err)
	second, err = sr.ReadShard(ctx, outbox.ShardRead{Shard: shard, After: first.Next, MaxRows: 100, Mark: true})
	must(t, err)
	moved := append(keysOf(first.Rows), keysOf(second.Rows)...)
	if len(moved) != 9 || slices.Contains(moved, claimedKey) || !second.Done {
		t.Fatalf("marking reads %v + %v (done=%v): want the 9 unclaimed rows", keysOf(first.Rows), keysOf(second.Rows), second.Done)
	}
	if again, _ := sr.ReadShard(ctx, outbox.ShardRead{Shard: shard, MaxRows: 100, Mark: true}); len(again.Rows) != 0 {
		t.Fatalf("marked rows offered twice: %v", keysOf(again.Rows))
	}
	return first, second
}

// claimedOfShard claims what scope offers (two hours after T0) and returns
// the keys of the claimed rows on shard.
func claimedOfShard(t *testing.T, s outbox.Store, shard uint32, scope outbox.ClaimScope) []string {
	t.Helper()
	var keys []string
	for _, r := range mustClaim(t, s, outbox.ClaimParams{Scope: &scope, Limit: 100, Now: T0.Add(2 * time.Hour)}) {
		if r.Shard == shard {
			keys = append(keys, r.DispatchKey)
		}
	}
	return keys
}

// checkCompleteKeepsChanged cancels the first row of the marked page
// first, then completes the page's transfer (plus a key never marked): a
// change clears a mark, so CompleteTransfer deletes every row but that
// one. It returns the changed row's key.
func checkCompleteKeepsChanged(t *testing.T, s outbox.Store, sr ShardReader, first outbox.ShardPage) string {
	t.Helper()
	changed := first.Rows[0].DispatchKey
	if ok, err := s.Cancel(ctx, outbox.CancelParams{DispatchKey: changed, Now: T0}); err != nil || !ok {
		t.Fatalf("cancel of a marked row: %v %v", ok, err)
	}
	n, err := sr.CompleteTransfer(ctx, append(keysOf(first.Rows), "never-marked"))
	if err != nil || n != len(first.Rows)-1 {
		t.Fatalf("CompleteTransfer: %d %v, want %d (the changed row kept)", n, err, len(first.Rows)-1)
	}
	wantStatus(t, s, changed, outbox.StatusCancelled)
	for _, k := range keysOf(first.Rows)[1:] {
		if _, err := s.Get(ctx, k); !errors.Is(err, outbox.ErrNotFound) {
			t.Fatalf("row %q still here after CompleteTransfer: %v", k, err)
		}
	}
	return changed
}

// checkAbortUnmarks aborts the marked page second: its rows are offered
// again (with the changed row, unmarked by its change), then, unmarked
// again, claimable once the shard is owned.
func checkAbortUnmarks(t *testing.T, s outbox.Store, sr ShardReader, shard uint32, scope outbox.ClaimScope, changed string, second outbox.ShardPage) {
	t.Helper()
	if n, err := sr.AbortTransfer(ctx, keysOf(second.Rows)); err != nil || n != len(second.Rows) {
		t.Fatalf("AbortTransfer: %d %v", n, err)
	}
	again, err := sr.ReadShard(ctx, outbox.ShardRead{Shard: shard, MaxRows: 100, Mark: true})
	must(t, err)
	if want := append([]string{changed}, keysOf(second.Rows)...); !sameSet(keysOf(again.Rows), want) {
		t.Fatalf("after abort: %v, want %v", keysOf(again.Rows), want)
	}
	if n, _ := sr.AbortTransfer(ctx, keysOf(again.Rows)); n != len(again.Rows) {
		t.Fatalf("second abort unmarked %d of %d", n, len(again.Rows))
	}
	sr.SetOwnedShards(nil)
	if claimable := claimedOfShard(t, s, shard, scope); !sameSet(claimable, keysOf(second.Rows)) {
		t.Fatalf("claimable after abort: %v, want %v", claimable, keysOf(second.Rows))
	}
}

func ptr[T any](v T) *T { return &v }

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

// testDigests: after every kind of change, each shard's digest equals the
// recomputation from the rows the store holds.
func testDigests(t *testing.T, s outbox.Store) {
	d := need[Digester](t, s, "ShardDigest and ShardDigests (per-shard digests)")
	m := need[Merger](t, s, "Merge (incoming copies)")
	sr := need[ShardReader](t, s, "ReadShard (transfer source)")
	var keys []string
	for i := range 30 {
		keys = append(keys, fmt.Sprintf("d%02d", i))
	}
	verify := func(when string) {
		t.Helper()
		want := map[uint32]*outbox.ShardDigest{}
		for _, k := range keys {
			r, err := s.Get(ctx, k)
			if errors.Is(err, outbox.ErrNotFound) {
				continue
			}
			must(t, err)
			if want[r.Shard] == nil {
				want[r.Shard] = &outbox.ShardDigest{Shard: r.Shard}
			}
			want[r.Shard].Add(&r)
		}
		all, err := d.ShardDigests(ctx)
		must(t, err)
		if len(all) != len(want) {
			t.Fatalf("%s: %d shard digests, want %d", when, len(all), len(want))
		}
		for i, got := range all {
			if i > 0 && all[i-1].Shard >= got.Shard {
				t.Fatalf("%s: digests not ascending by shard", when)
			}
			if w := want[got.Shard]; w == nil || *w != got {
				t.Fatalf("%s: shard %d digest %+v, want %+v", when, got.Shard, got, w)
			}
			one, err := d.ShardDigest(ctx, got.Shard)
			if err != nil || one != got {
				t.Fatalf("%s: ShardDigest(%d) = %+v %v, want %+v", when, got.Shard, one, err, got)
			}
		}
	}
	var rows []outbox.Row
	for _, k := range keys {
		rows = append(rows, Row(k, "ns", "q"))
	}
	mustAppend(t, s, rows...)
	verify("after append")
	claimed := mustClaim(t, s, outbox.ClaimParams{Limit: 12, Now: T0})
	verify("after claim")
	for i, c := range claimed {
		switch i % 3 {
		case 0:
			must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: c.DispatchKey, Claim: c.Version, Now: T0}))
		case 1:
			must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: c.DispatchKey, Claim: c.Version, VisibleAfter: T0}))
		default:
			must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: c.DispatchKey, Claim: c.Version, LastError: "x", Now: T0}))
		}
	}
	verify("after settles")
	if _, err := s.Cancel(ctx, outbox.CancelParams{DispatchKey: keys[29], Now: T0}); err != nil {
		t.Fatal(err)
	}
	incoming, fresh := Row(keys[28], "ns", "q"), Row("d99", "ns", "q")
	incoming.Status, incoming.Version, fresh.Status = outbox.StatusPending, outbox.Version{Seq: 9}, outbox.StatusPending
	mustMerge(t, m, incoming, fresh)
	keys = append(keys, "d99")
	verify("after cancel and merge")
	// A move: marking changes nothing; completing removes the rows.
	sr.SetOwnedShards([]uint32{})
	shard := mustGet(t, s, keys[0]).Shard
	p, err := sr.ReadShard(ctx, outbox.ShardRead{Shard: shard, MaxRows: 100, Mark: true})
	must(t, err)
	verify("after marking")
	if _, err := sr.CompleteTransfer(ctx, keysOf(p.Rows)); err != nil {
		t.Fatal(err)
	}
	verify("after CompleteTransfer")
	if got, err := d.ShardDigest(ctx, 100000); err != nil || got.Rows != 0 || got.Sum != 0 {
		t.Fatalf("digest of a shard holding nothing: %+v %v", got, err)
	}
}

// testShardReads: a multi-shard marking read shares one budget of rows,
// reads shards in order, skips owned ones (empty, Done pages) and marks
// what it returns.
func testShardReads(t *testing.T, s outbox.Store) {
	sr := need[ShardReader](t, s, "ReadShard and friends (transfer source)")
	mr := need[MultiShardReader](t, s, "ReadShards (multi-shard marking read)")
	// Three rows on each of three shards.
	byShard := map[uint32][]string{}
	var order []uint32
	full := func() bool {
		return len(order) == 3 && len(byShard[order[0]]) == 3 && len(byShard[order[1]]) == 3 && len(byShard[order[2]]) == 3
	}
	for i := 0; !full(); i++ {
		k := fmt.Sprintf("m%04d", i)
		sh := shards.ShardOf(k, sr.ShardCount())
		if _, seen := byShard[sh]; !seen {
			if len(order) == 3 {
				continue
			}
			order = append(order, sh)
		}
		if len(byShard[sh]) == 3 {
			continue
		}
		byShard[sh] = append(byShard[sh], k)
		mustAppend(t, s, Row(k, "ns", "q"))
	}
	reads := []outbox.ShardRead{{Shard: order[0]}, {Shard: order[1]}, {Shard: order[2]}}
	// Owning order[1] only: its page is empty and Done.
	sr.SetOwnedShards([]uint32{order[1]})
	pages, err := mr.ReadShards(ctx, reads, 4, 0)
	must(t, err)
	if len(pages) != 3 {
		t.Fatalf("%d pages, want 3 (the budget of 4 rows runs out in the third shard)", len(pages))
	}
	if !slices.Equal(keysOf(pages[0].Rows), byShard[order[0]]) || !pages[0].Done {
		t.Fatalf("first page %v done=%v, want %v and done", keysOf(pages[0].Rows), pages[0].Done, byShard[order[0]])
	}
	if len(pages[1].Rows) != 0 || !pages[1].Done {
		t.Fatalf("owned shard's page %v done=%v, want empty and done", keysOf(pages[1].Rows), pages[1].Done)
	}
	if !slices.Equal(keysOf(pages[2].Rows), byShard[order[2]][:1]) || pages[2].Done {
		t.Fatalf("third page %v done=%v, want the first row and more", keysOf(pages[2].Rows), pages[2].Done)
	}
	// Marked: a second read from the start offers only the rest.
	rest, err := mr.ReadShards(ctx, []outbox.ShardRead{{Shard: order[0]}, {Shard: order[2], After: pages[2].Next}}, 100, 0)
	must(t, err)
	if len(rest) != 2 || len(rest[0].Rows) != 0 || !slices.Equal(keysOf(rest[1].Rows), byShard[order[2]][1:]) {
		t.Fatalf("second read: %d pages, %v then %v", len(rest), keysOf(rest[0].Rows), keysOf(rest[1].Rows))
	}
	// A zero budget reads nothing.
	if none, err := mr.ReadShards(ctx, reads, 0, 0); err != nil || len(none) != 0 {
		t.Fatalf("read with no budget: %d pages, %v", len(none), err)
	}
}
