package boltstore

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

func shardOf(k string) uint32 { return shards.ShardOf(k, testShardCount) }

var ctx = context.Background()

func TestAppendGetRoundTrip(t *testing.T) {
	s, b := newTestStore(t)
	now := b.clock.Now()
	full := outbox.Row{
		DispatchKey: "wf-1:7", WorkflowID: "wf-1", Ordinal: 7, Namespace: "ns", TaskQueue: "tq",
		ActivityType: "send", Payload: []byte{0, 1, 2}, ContentType: "application/octet-stream",
		Attempt: 3, VisibleAfter: now.Add(time.Minute), CreatedAt: now.Add(-time.Hour),
		LastError: "earlier", Status: outbox.StatusDone, // status is forced to pending
	}
	bare := outbox.Row{DispatchKey: "bare", Namespace: "ns", TaskQueue: "tq"}
	empty := outbox.Row{DispatchKey: "empty", Namespace: "ns", TaskQueue: "tq", Payload: []byte{}}
	got := mustAppend(t, s, full, bare, empty)
	if want := []outbox.AppendOutcome{outbox.AppendCreated, outbox.AppendCreated, outbox.AppendCreated}; !reflect.DeepEqual(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	s = reopen(t, s, b) // durable, and decoded from disk
	want := full
	want.Status, want.Shard, want.Version = outbox.StatusPending, shardOf(full.DispatchKey), outbox.FirstVersion
	if r := mustGet(t, s, full.DispatchKey); !reflect.DeepEqual(r, want) {
		t.Fatalf("full row round trip:\n got %+v\nwant %+v", r, want)
	}
	r := mustGet(t, s, "bare")
	if r.Status != outbox.StatusPending || r.Attempt != 1 || !r.CreatedAt.Equal(now) || !r.VisibleAfter.Equal(now) || r.Payload != nil {
		t.Fatalf("bare row defaults: %+v", r)
	}
	if r := mustGet(t, s, "empty"); r.Payload == nil || len(r.Payload) != 0 {
		t.Fatalf("empty payload came back as %#v", r.Payload)
	}
	if _, err := s.Get(ctx, "absent"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("get absent: %v, want ErrNotFound", err)
	}
}

func TestAppendDuplicates(t *testing.T) {
	s, b := newTestStore(t)
	mustAppend(t, s, row("a", "ns", "q"))
	got := mustAppend(t, s, row("b", "ns", "q"), row("a", "ns", "other"), row("b", "ns", "q"))
	want := []outbox.AppendOutcome{outbox.AppendCreated, outbox.AppendDuplicate, outbox.AppendDuplicate}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	if r := mustGet(t, s, "a"); r.TaskQueue != "q" {
		t.Fatalf("duplicate overwrote the stored row: %+v", r)
	}
	// A tombstone dedupes until its retention ends.
	if err := s.Complete(ctx, outbox.CompleteParams{DispatchKey: "a", Claim: claimOf(t, s, "a"), Now: b.clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if got := mustAppend(t, s, row("a", "ns", "q")); got[0] != outbox.AppendDuplicate {
		t.Fatalf("append over tombstone: %v", got)
	}
}

func TestAppendInvalidWritesNothing(t *testing.T) {
	s, _ := newTestStore(t)
	for name, bad := range map[string]outbox.Row{
		"no key":        {Namespace: "ns", TaskQueue: "q"},
		"no namespace":  {DispatchKey: "k", TaskQueue: "q"},
		"no task_queue": {DispatchKey: "k", Namespace: "ns"},
		"long key":      {DispatchKey: strings.Repeat("k", MaxDispatchKeyBytes+1), Namespace: "ns", TaskQueue: "q"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := s.Append(ctx, []outbox.Row{row("good", "ns", "q"), bad})
			if !errors.Is(err, outbox.ErrInvalidRow) {
				t.Fatalf("err %v, want ErrInvalidRow", err)
			}
			if _, err := s.Get(ctx, "good"); !errors.Is(err, outbox.ErrNotFound) {
				t.Fatalf("valid row of a rejected batch was written: %v", err)
			}
		})
	}
}

func TestClaimOrderScopeAndHeldWorkflows(t *testing.T) {
	s, b := newTestStore(t)
	now := b.clock.Now()
	mk := func(key, tq string, vis time.Duration, wf string) outbox.Row {
		r := row(key, "ns", tq)
		r.VisibleAfter, r.WorkflowID = now.Add(vis), wf
		return r
	}
	mustAppend(t, s,
		mk("q1-late", "q1", -time.Second, "w1"),
		mk("q1-early-b", "q1", -time.Minute, "w1"),
		mk("q1-early-a", "q1", -time.Minute, "held"),
		mk("q1-future", "q1", time.Hour, "w1"),
		mk("q2-mid", "q2", -30*time.Second, "w2"),
	)
	rows, err := s.Claim(ctx, outbox.ClaimParams{Scope: &outbox.ClaimScope{Namespace: "ns", TaskQueue: "q1"}, Limit: 10, Now: now,
		ExcludeWorkflows: map[string]struct{}{"held": {}}})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := keysOfRows(rows), []string{"q1-early-b", "q1-late"}; !equalStrings(got, want) {
		t.Fatalf("scoped claim %v, want %v", got, want)
	}
	for _, r := range rows {
		if r.Status != outbox.StatusClaimed || !r.ClaimedAt.Equal(now) {
			t.Fatalf("claimed row %+v", r)
		}
	}
	// Unscoped: the held row is now eligible, ordered with q2 by VisibleAfter.
	rows, err = s.Claim(ctx, outbox.ClaimParams{Limit: 10, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := keysOfRows(rows), []string{"q1-early-a", "q2-mid"}; !equalStrings(got, want) {
		t.Fatalf("unscoped claim %v, want %v", got, want)
	}
	if rows, _ := s.Claim(ctx, outbox.ClaimParams{Limit: 10, Now: now}); len(rows) != 0 {
		t.Fatalf("claimed again: %v", keysOfRows(rows))
	}
	n, _ := s.CountClaimed(ctx, "ns")
	f, _ := s.CountInFlight(ctx, "ns")
	if n != 4 || f != 5 {
		t.Fatalf("claimed %d in flight %d, want 4 and 5", n, f)
	}
}

func TestClaimLimitAcrossRoutes(t *testing.T) {
	s, b := newTestStore(t)
	now := b.clock.Now()
	var rows []outbox.Row
	for i := range 30 {
		r := row(string(rune('a'+i%26))+string(rune('0'+i/26)), "ns", []string{"x", "y", "z"}[i%3])
		r.VisibleAfter = now.Add(-time.Duration(i) * time.Second)
		rows = append(rows, r)
	}
	mustAppend(t, s, rows...)
	got, err := s.Claim(ctx, outbox.ClaimParams{Limit: 7, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 7 {
		t.Fatalf("claimed %d, want 7", len(got))
	}
	for i := 1; i < len(got); i++ {
		if got[i].VisibleAfter.Before(got[i-1].VisibleAfter) {
			t.Fatalf("not ordered by VisibleAfter: %v", keysOfRows(got))
		}
	}
	if !got[0].VisibleAfter.Equal(now.Add(-29 * time.Second)) {
		t.Fatalf("first claimed is not the oldest: %+v", got[0])
	}
}

func TestSettleTransitions(t *testing.T) {
	s, b := newTestStore(t)
	now := b.clock.Now()
	mustAppend(t, s, row("k1", "ns", "q"), row("k2", "ns", "q"), row("k3", "ns", "q"), row("k4", "ns", "q"), row("k5", "ns", "q"))
	if _, err := s.Claim(ctx, outbox.ClaimParams{Limit: 3, Now: now, Scope: &outbox.ClaimScope{Namespace: "ns", TaskQueue: "q"}}); err != nil {
		t.Fatal(err)
	}
	// Retry on a pending row is a no-op.
	must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: "k4", Claim: mustGet(t, s, "k4").Version, NextAttempt: 9}))
	if r := mustGet(t, s, "k4"); r.Attempt != 1 || r.Status != outbox.StatusPending {
		t.Fatalf("retry of pending row changed it: %+v", r)
	}
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "k1", Claim: claimOf(t, s, "k1"), Now: now}))
	must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: "k2", Claim: claimOf(t, s, "k2"), NextAttempt: 2, VisibleAfter: now.Add(time.Minute), LastError: "503"}))
	must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: "k3", Claim: claimOf(t, s, "k3"), LastError: "400", Now: now}))
	// pending → done: a late success after a re-arm (same generation).
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "k4", Claim: mustGet(t, s, "k4").Version, Now: now}))
	// Fail applies only to a claim: k5 pending stays pending until claimed.
	must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: "k5", Claim: mustGet(t, s, "k5").Version, LastError: "early", Now: now}))
	if r := mustGet(t, s, "k5"); r.Status != outbox.StatusPending {
		t.Fatalf("fail of a pending row applied: %+v", r)
	}
	must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: "k5", Claim: claimOf(t, s, "k5"), LastError: "bad", Now: now}))
	// No-ops: missing rows, settling terminal rows.
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "missing", Now: now}))
	must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: "k1", Claim: mustGet(t, s, "k1").Version, LastError: "late", Now: now}))
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "k3", Claim: mustGet(t, s, "k3").Version, Now: now}))
	must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: "k1", Claim: mustGet(t, s, "k1").Version, NextAttempt: 5}))

	for key, want := range map[string]struct {
		st      outbox.Status
		attempt uint32
		lastErr string
	}{
		"k1": {outbox.StatusDone, 1, ""}, "k2": {outbox.StatusPending, 2, "503"}, "k3": {outbox.StatusFailed, 1, "400"},
		"k4": {outbox.StatusDone, 1, ""}, "k5": {outbox.StatusFailed, 1, "bad"},
	} {
		r := mustGet(t, s, key)
		if r.Status != want.st || r.Attempt != want.attempt || r.LastError != want.lastErr {
			t.Errorf("%s: %+v, want %+v", key, r, want)
		}
		if !r.ClaimedAt.IsZero() {
			t.Errorf("%s: ClaimedAt %v after settle", key, r.ClaimedAt)
		}
		if r.Status.Terminal() && !r.FinishedAt.Equal(now) {
			t.Errorf("%s: FinishedAt %v", key, r.FinishedAt)
		}
	}
	if n, _ := s.CountClaimed(ctx, "ns"); n != 0 {
		t.Fatalf("claimed %d after settling all", n)
	}
	if n, _ := s.CountInFlight(ctx, "ns"); n != 1 {
		t.Fatalf("in flight %d, want 1 (the retried row)", n)
	}
	// The retried row is not visible before its backoff.
	if rows, _ := s.Claim(ctx, outbox.ClaimParams{Limit: 5, Now: now}); len(rows) != 0 {
		t.Fatalf("claimed during backoff: %v", keysOfRows(rows))
	}
	if rows, _ := s.Claim(ctx, outbox.ClaimParams{Limit: 5, Now: now.Add(time.Minute)}); len(rows) != 1 || rows[0].Attempt != 2 {
		t.Fatalf("claim after backoff: %+v", rows)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestRearmStale(t *testing.T) {
	s, b := newTestStore(t)
	t0 := b.clock.Now()
	mustAppend(t, s, row("a", "ns", "q"), row("b", "ns", "q"), row("c", "ns", "q"), row("d", "ns", "q"))
	for i, k := range []string{"a", "b", "c", "d"} {
		at := t0.Add(time.Duration(i) * time.Second)
		rows, err := s.Claim(ctx, outbox.ClaimParams{Limit: 1, Now: at, Scope: &outbox.ClaimScope{Namespace: "ns", TaskQueue: "q"}})
		if err != nil || len(rows) != 1 || rows[0].DispatchKey != k {
			t.Fatalf("claim %d: %v %v", i, rows, err)
		}
	}
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "a", Claim: claimOf(t, s, "a"), Now: t0}))
	vis := t0.Add(time.Hour)
	rows, err := s.RearmStale(ctx, outbox.RearmParams{OlderThan: t0.Add(3 * time.Second), VisibleAfter: vis, Limit: 10,
		ExcludeKeys: map[string]struct{}{"b": {}}})
	if err != nil {
		t.Fatal(err)
	}
	// a is done, b excluded, d claimed at the cut-off (not strictly before).
	if got := keysOfRows(rows); !equalStrings(got, []string{"c"}) {
		t.Fatalf("rearmed %v, want [c]", got)
	}
	if r := mustGet(t, s, "c"); r.Status != outbox.StatusPending || !r.VisibleAfter.Equal(vis) || r.Attempt != 1 || !r.ClaimedAt.IsZero() {
		t.Fatalf("rearmed row %+v", r)
	}
	n, err := s.RearmAllClaimed(ctx, vis)
	if err != nil || n != 2 {
		t.Fatalf("rearm all: %d %v, want 2", n, err)
	}
	if c, _ := s.CountClaimed(ctx, "ns"); c != 0 {
		t.Fatalf("claimed %d after rearm all", c)
	}
}

func TestOwnedShardScoping(t *testing.T) {
	s, b := newTestStore(t)
	now := b.clock.Now()
	mine, theirs := keyOnShard("mine", 1), keyOnShard("theirs", 2)
	mine2, theirs2 := keyOnShard("mine2", 1), keyOnShard("theirs2", 2)
	mustAppend(t, s, row(mine, "ns", "q"), row(theirs, "ns", "q"), row(mine2, "ns", "q"), row(theirs2, "ns", "other"))
	// Claim one of each while we own everything.
	if _, err := s.Claim(ctx, outbox.ClaimParams{Limit: 10, Now: now, Scope: &outbox.ClaimScope{Namespace: "ns", TaskQueue: "other"}}); err != nil {
		t.Fatal(err)
	}
	rows, err := s.Claim(ctx, outbox.ClaimParams{Limit: 10, Now: now, Scope: &outbox.ClaimScope{Namespace: "ns", TaskQueue: "q"}})
	if err != nil || len(rows) != 3 {
		t.Fatalf("claim all: %v %v", keysOfRows(rows), err)
	}
	must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: mine, Claim: claimOf(t, s, mine), NextAttempt: 2, VisibleAfter: now}))
	must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: theirs, Claim: claimOf(t, s, theirs), NextAttempt: 2, VisibleAfter: now}))
	// Now: mine pending, theirs pending, mine2 claimed, theirs2 claimed.
	s.SetOwnedShards([]uint32{0, 1, 3, 99})
	if !s.Owns(1) || s.Owns(2) || s.Owns(99) {
		t.Fatal("Owns disagrees with SetOwnedShards")
	}
	if n, _ := s.CountClaimed(ctx, "ns"); n != 1 {
		t.Fatalf("owned claimed %d, want 1", n)
	}
	if m, _ := s.CountClaimedByNamespace(ctx, []string{"ns", "nobody"}); m["ns"] != 1 || m["nobody"] != 0 || len(m) != 2 {
		t.Fatalf("claimed by namespace %v", m)
	}
	if m, _ := s.CountClaimedHeld(ctx, []string{"ns"}); m["ns"] != 2 {
		t.Fatalf("claimed held %v, want 2", m)
	}
	if n, _ := s.CountInFlight(ctx, "ns"); n != 2 {
		t.Fatalf("owned in flight %d, want 2", n)
	}
	routes, _ := s.PendingRoutes(ctx, now)
	if len(routes) != 1 || routes[0] != (outbox.ClaimScope{Namespace: "ns", TaskQueue: "q"}) {
		t.Fatalf("pending routes %v", routes)
	}
	rows, err = s.Claim(ctx, outbox.ClaimParams{Limit: 10, Now: now})
	if err != nil || !equalStrings(keysOfRows(rows), []string{mine}) {
		t.Fatalf("owned claim %v %v, want only %s", keysOfRows(rows), err, mine)
	}
	// Get sees every row.
	if r := mustGet(t, s, theirs); r.Status != outbox.StatusPending {
		t.Fatalf("foreign row %+v", r)
	}
	if routes, _ := s.PendingRoutes(ctx, now); len(routes) != 0 {
		t.Fatalf("pending routes %v, want none", routes)
	}
	s.SetOwnedShards([]uint32{})
	if rows, _ := s.Claim(ctx, outbox.ClaimParams{Limit: 10, Now: now}); len(rows) != 0 {
		t.Fatalf("claimed owning nothing: %v", keysOfRows(rows))
	}
	all := make([]uint32, testShardCount)
	for i := range all {
		all[i] = uint32(i)
	}
	s.SetOwnedShards(all)
	if rows, _ := s.Claim(ctx, outbox.ClaimParams{Limit: 10, Now: now}); !equalStrings(keysOfRows(rows), []string{theirs}) {
		t.Fatalf("claim after owning all: %v", keysOfRows(rows))
	}
}

func TestCloseIdempotentAndClosedErrors(t *testing.T) {
	s, b := newTestStore(t)
	mustAppend(t, s, row("a", "ns", "q"))
	must(t, s.Close())
	must(t, s.Close())
	if _, err := s.Append(ctx, []outbox.Row{row("b", "ns", "q")}); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
	if _, err := s.Get(ctx, "a"); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("get after close: %v", err)
	}
	if _, err := s.Claim(ctx, outbox.ClaimParams{Limit: 1, Now: b.clock.Now()}); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("claim after close: %v", err)
	}
	if _, err := s.CountClaimedByNamespace(ctx, []string{"ns"}); !errors.Is(err, outbox.ErrClosed) {
		t.Fatalf("count after close: %v", err)
	}
	// The lock was released: the file reopens.
	s2, err := Open(b.path, Options{ShardCount: testShardCount})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	mustCheck(t, s2)
}

func TestCloseWhileWriting(t *testing.T) {
	s, _ := newTestStore(t)
	var wg sync.WaitGroup
	for p := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				_, err := s.Append(ctx, []outbox.Row{row(string(rune('a'+p))+"-"+strings.Repeat("x", i%5)+string(rune(i)), "ns", "q")})
				if err != nil {
					if !errors.Is(err, outbox.ErrClosed) {
						t.Errorf("append: %v", err)
					}
					return
				}
			}
		}()
	}
	poll.Eventually(t, 5*time.Second, "more than 50 rows of ns in flight", func() (bool, string) { n, _ := s.CountInFlight(ctx, "ns"); return n > 50, "" })
	must(t, s.Close())
	wg.Wait()
}

func TestContextCancelledWritesNothing(t *testing.T) {
	s, _ := newTestStore(t)
	c, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Append(c, []outbox.Row{row("a", "ns", "q")}); !errors.Is(err, context.Canceled) {
		t.Fatalf("append with cancelled ctx: %v", err)
	}
	if _, err := s.Get(ctx, "a"); !errors.Is(err, outbox.ErrNotFound) {
		t.Fatalf("row written despite cancelled ctx: %v", err)
	}
}

func TestMetrics(t *testing.T) {
	s, b := newTestStore(t, func(o *Options) { o.TombstoneRetention = time.Hour })
	now := b.clock.Now()
	mustAppend(t, s, row("a", "ns", "q"), row("b", "ns", "q"), row("c", "ns", "q"))
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "a", Claim: claimOf(t, s, "a"), Now: now}))
	must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: "b", Claim: claimOf(t, s, "b"), Now: now}))
	b.clock.Advance(2 * time.Hour)
	if n, err := s.ExpireTombstones(ctx); err != nil || n != 1 {
		t.Fatalf("expire: %d %v, want 1 (dead letters kept longer)", n, err)
	}
	want := `
# HELP fairshard_store_rows Rows held in this node's store, by status (all shards, owned or not).
# TYPE fairshard_store_rows gauge
fairshard_store_rows{status="cancelled"} 0
fairshard_store_rows{status="claimed"} 0
fairshard_store_rows{status="done"} 0
fairshard_store_rows{status="failed"} 1
fairshard_store_rows{status="pending"} 1
# HELP fairshard_store_tombstones_expired_total Tombstones (done, cancelled, failed rows) removed by the retention sweep.
# TYPE fairshard_store_tombstones_expired_total counter
fairshard_store_tombstones_expired_total 1
`
	if err := testutil.GatherAndCompare(b.reg, strings.NewReader(want), "fairshard_store_rows", "fairshard_store_tombstones_expired_total"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(b.reg, "fairshard_store_commit_duration_seconds", "fairshard_store_batch_ops"); n != 2 {
		t.Fatalf("histograms registered: %d", n)
	}
	if problems, err := testutil.GatherAndLint(b.reg); err != nil || len(problems) != 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	// The gauge survives a reopen (totals reloaded from the counters).
	s = reopen(t, s, b)
	if err := testutil.GatherAndCompare(b.reg, strings.NewReader(want), "fairshard_store_rows"); err != nil {
		t.Fatal(err)
	}
}

// TestCountsAgreeUnderPartialOwnership compares the bulk and per-namespace
// counts with a recount from Get, over many namespaces, while half the
// shards are owned (the merge-join paths over the counter buckets).
func TestCountsAgreeUnderPartialOwnership(t *testing.T) {
	s, b := newTestStore(t)
	now := b.clock.Now()
	var rows []outbox.Row
	var names []string
	for i := range 60 {
		names = append(names, fmt.Sprintf("ns-%02d", i))
	}
	for i := range 900 {
		rows = append(rows, row(fmt.Sprintf("k%04d", i), names[(i*7)%len(names)], fmt.Sprintf("q%d", i%3)))
	}
	mustAppend(t, s, rows...)
	if _, err := s.Claim(ctx, outbox.ClaimParams{Limit: 500, Now: now}); err != nil {
		t.Fatal(err)
	}
	s.SetOwnedShards([]uint32{0, 2, 4, 6, 8, 10, 12, 14})
	claimed, inFlight := map[string]int{}, map[string]int{}
	for _, r := range rows {
		got := mustGet(t, s, r.DispatchKey)
		if !s.Owns(got.Shard) {
			continue
		}
		if got.Status == outbox.StatusClaimed {
			claimed[got.Namespace]++
		}
		inFlight[got.Namespace]++
	}
	asked := append(append([]string{}, names...), "absent", names[3]) // unknown and repeated names too
	bulk, err := s.CountClaimedByNamespace(ctx, asked)
	must(t, err)
	if len(bulk) != len(names)+1 {
		t.Fatalf("bulk count has %d entries, want %d", len(bulk), len(names)+1)
	}
	for _, ns := range names {
		one, err := s.CountClaimed(ctx, ns)
		must(t, err)
		fl, err := s.CountInFlight(ctx, ns)
		must(t, err)
		if bulk[ns] != claimed[ns] || one != claimed[ns] || fl != inFlight[ns] {
			t.Fatalf("%s: bulk %d single %d in-flight %d, recount %d and %d", ns, bulk[ns], one, fl, claimed[ns], inFlight[ns])
		}
	}
	if bulk["absent"] != 0 {
		t.Fatalf("absent namespace counted %d", bulk["absent"])
	}
}
