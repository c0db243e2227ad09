// Package outboxtest is the contract suite every outbox.Store runs
// (STYLE §6: one shared suite, called once per implementation). It pins the
// behaviour of outbox.Store's doc comments: insert-or-ignore appends, atomic
// exactly-once claims in (visible_after, dispatch_key) order, held-workflow
// exclusion, stale-claim re-arm, settle transitions, CLAIMED-only counts,
// the pending-routes listing and, for stores that have SetOwnedShards,
// owned-shard scoping.
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
)

// ShardScoped is the optional method through which a store is told which
// shards this node owns. The suite's ownership cases run only for stores
// that implement it.
type ShardScoped interface {
	SetOwnedShards(owned []uint32)
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
		{"InvisibleRowsNeitherClaimedNorListed", testInvisible},
		{"ScopedClaimStaysInRoute", testScopedClaim},
		{"HeldRowsSkippedWithoutStarvingRoute", testHeldSkipped},
		{"ConcurrentClaimsAreExactlyOnce", testConcurrentClaims},
		{"RearmStale", testRearm},
		{"RearmIgnoresRecentAndTerminal", testRearmIgnores},
		{"SettleTransitions", testSettle},
		{"SettleMissingKeyIsNoop", testSettleMissing},
		{"CountsAreClaimedOnlyAndBucketed", testCounts},
		{"PendingRoutesDistinctSorted", testPendingRoutes},
		{"OwnedShardScoping", testOwnedShards},
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
	if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: "a", Now: T0}); err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(ctx, outbox.FailParams{DispatchKey: "b", LastError: "x", Now: T0}); err != nil {
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
	if err := s.Retry(ctx, outbox.RetryParams{DispatchKey: "live", NextAttempt: 3, VisibleAfter: T0, LastError: "boom"}); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, outbox.ClaimParams{Limit: 10, Now: T0})
	if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: "done", Now: T0}); err != nil {
		t.Fatal(err)
	}
	if err := s.Fail(ctx, outbox.FailParams{DispatchKey: "failed", LastError: "x", Now: T0}); err != nil {
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
	mustClaim(t, s, outbox.ClaimParams{Limit: 3, Now: T0}) // dead, ok, retry (x-pend stays pending)
	fin := T0.Add(time.Second)
	if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: "ok", Now: fin}); err != nil {
		t.Fatal(err)
	}
	r := wantStatus(t, s, "ok", outbox.StatusDone)
	if !r.FinishedAt.Equal(fin) {
		t.Fatalf("done finished_at %v, want %v", r.FinishedAt, fin)
	}
	next := T0.Add(time.Minute)
	if err := s.Retry(ctx, outbox.RetryParams{DispatchKey: "retry", NextAttempt: 2, VisibleAfter: next, LastError: "503"}); err != nil {
		t.Fatal(err)
	}
	r = wantStatus(t, s, "retry", outbox.StatusPending)
	if r.Attempt != 2 || !r.VisibleAfter.Equal(next) || r.LastError != "503" || !r.ClaimedAt.IsZero() {
		t.Fatalf("retried row: %+v", r)
	}
	if err := s.Fail(ctx, outbox.FailParams{DispatchKey: "dead", LastError: "400 bad", Now: fin}); err != nil {
		t.Fatal(err)
	}
	r = wantStatus(t, s, "dead", outbox.StatusFailed)
	if r.LastError != "400 bad" || !r.FinishedAt.Equal(fin) {
		t.Fatalf("failed row: %+v", r)
	}
	// Retry applies only to claimed rows.
	if err := s.Retry(ctx, outbox.RetryParams{DispatchKey: "x-pend", NextAttempt: 5, VisibleAfter: next}); err != nil {
		t.Fatal(err)
	}
	if r := wantStatus(t, s, "x-pend", outbox.StatusPending); r.Attempt != 1 {
		t.Fatalf("retry of a pending row changed attempt to %d", r.Attempt)
	}
	// Terminal rows stay terminal.
	if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: "dead", Now: fin}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, s, "dead", outbox.StatusFailed)
	if err := s.Fail(ctx, outbox.FailParams{DispatchKey: "ok", LastError: "late", Now: fin}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, s, "ok", outbox.StatusDone)
	if err := s.Retry(ctx, outbox.RetryParams{DispatchKey: "ok", NextAttempt: 2, VisibleAfter: next}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, s, "ok", outbox.StatusDone)
	// Complete and Fail also apply to pending rows (a late success after a re-arm).
	if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: "retry", Now: fin}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, s, "retry", outbox.StatusDone)
	if err := s.Fail(ctx, outbox.FailParams{DispatchKey: "x-pend", LastError: "cancelled by operator", Now: fin}); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, s, "x-pend", outbox.StatusFailed)
	wantKeys(t, "nothing left to claim", mustClaim(t, s, outbox.ClaimParams{Limit: 10, Now: next}))
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
	if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: "b0", Now: T0}); err != nil {
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
	sc, ok := s.(ShardScoped)
	if !ok {
		t.Skip("store has no SetOwnedShards")
	}
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
