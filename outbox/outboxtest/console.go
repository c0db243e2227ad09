package outboxtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fairshard/fairshard/outbox"
)

// ConsoleReader is what an operator's read-back needs of a store beside
// the contract: the attempt history, the row listing and the dead-letter
// purge. A store without it fails the suite.
type ConsoleReader interface {
	Attempts(ctx context.Context, dispatchKey string) ([]outbox.Attempt, error)
	ListRows(ctx context.Context, q outbox.RowQuery) (outbox.RowPage, error)
	PurgeDeadLetters(ctx context.Context, namespace string, keys []string, now time.Time) (int, error)
}

const consoleWhat = "Attempts, ListRows, PurgeDeadLetters (an operator's read-back)"

// claimKey claims the row of key (visible at T0) and returns its claim.
func claimKey(t *testing.T, s outbox.Store, key string, at time.Time) outbox.Version {
	t.Helper()
	r := mustGet(t, s, key)
	rows := mustClaim(t, s, outbox.ClaimParams{Scope: &outbox.ClaimScope{Namespace: r.Namespace, TaskQueue: r.TaskQueue}, Limit: 1000, Now: at})
	for _, c := range rows {
		if c.DispatchKey == key {
			return c.Version
		}
	}
	t.Fatalf("claim of %q at %v: not claimed (got %v)", key, at, keysOf(rows))
	return outbox.Version{}
}

func testAttemptHistory(t *testing.T, s outbox.Store) {
	c := need[ConsoleReader](t, s, consoleWhat)
	mustAppend(t, s, Row("h", "ns", "q"), Row("quiet", "ns", "q"))
	if h, err := c.Attempts(ctx, "h"); err != nil || len(h) != 0 {
		t.Fatalf("history before any attempt: %v, %v; want none", h, err)
	}
	// Attempt 1: 503 after 250 ms, retried; attempt 2: connection error,
	// dead-lettered; redriven, attempt 1 of the new generation: done (200).
	v := claimKey(t, s, "h", T0)
	must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: "h", Claim: v, VisibleAfter: T0.Add(time.Second),
		LastError: "503 Service Unavailable", StatusCode: 503, Now: T0.Add(250 * time.Millisecond)}))
	v = claimKey(t, s, "h", T0.Add(2*time.Second))
	must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: "h", Claim: v, LastError: "dial tcp: connection refused", Now: T0.Add(2*time.Second + 10*time.Millisecond)}))
	redriver := need[interface {
		Redrive(ctx context.Context, namespace string, keys []string, now time.Time) (int, error)
	}](t, s, "Redrive (a node's dead-letter redrive)")
	if n, err := redriver.Redrive(ctx, "ns", []string{"h"}, T0.Add(3*time.Second)); err != nil || n != 1 {
		t.Fatalf("redrive: %d, %v", n, err)
	}
	v = claimKey(t, s, "h", T0.Add(3*time.Second))
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "h", Claim: v, StatusCode: 200, Now: T0.Add(3*time.Second + 5*time.Millisecond)}))
	// A claim handed back without an attempt records nothing.
	mustAppend(t, s, Row("unattempted", "ns", "u"))
	uv := claimKey(t, s, "unattempted", T0)
	must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: "unattempted", Claim: uv, NextAttempt: 1, VisibleAfter: T0, Unattempted: true}))
	if h, err := c.Attempts(ctx, "unattempted"); err != nil || len(h) != 0 || mustGet(t, s, "unattempted").Status != outbox.StatusPending {
		t.Fatalf("history after an unattempted hand-back: %v, %v; want none (and the row pending)", h, err)
	}
	// A stale settle (no longer claimed) records nothing.
	must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: "h", Claim: v, LastError: "late", StatusCode: 500}))
	h, err := c.Attempts(ctx, "h")
	if err != nil {
		t.Fatal(err)
	}
	want := []outbox.Attempt{
		{Attempt: 1, Outcome: outbox.AttemptRetry, StatusCode: 503, Error: "503 Service Unavailable", DurationMS: 250},
		{Attempt: 2, Outcome: outbox.AttemptFailed, Error: "dial tcp: connection refused", DurationMS: 10},
		{Attempt: 1, Outcome: outbox.AttemptDone, StatusCode: 200, DurationMS: 5},
	}
	if len(h) != len(want) {
		t.Fatalf("history: %+v, want %d attempts", h, len(want))
	}
	for i, w := range want {
		g := h[i]
		if g.Attempt != w.Attempt || g.Outcome != w.Outcome || g.StatusCode != w.StatusCode || g.Error != w.Error ||
			g.DurationMS != w.DurationMS || g.ClaimedAt.IsZero() || g.FinishedAt.Sub(g.ClaimedAt).Milliseconds() != w.DurationMS {
			t.Fatalf("attempt %d: %+v, want %+v", i, g, w)
		}
	}
	if q, err := c.Attempts(ctx, "quiet"); err != nil || len(q) != 0 {
		t.Fatalf("another row's history: %v, %v", q, err)
	}
	// Delivered at the first try: no history kept.
	qv := claimOf(t, s, "quiet") // claimed with h (same route)
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "quiet", Claim: qv, StatusCode: 200, Now: T0}))
	if q, err := c.Attempts(ctx, "quiet"); err != nil || len(q) != 0 || mustGet(t, s, "quiet").Status != outbox.StatusDone {
		t.Fatalf("history of a row delivered at its first try: %v, %v; want none (and the row done)", q, err)
	}

	// Bounded: only the last MaxAttemptHistory attempts are kept.
	mustAppend(t, s, Row("many", "ns", "r"))
	at := T0
	for i := range outbox.MaxAttemptHistory + 5 {
		v := claimKey(t, s, "many", at)
		must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: "many", Claim: v, VisibleAfter: at, StatusCode: 500,
			LastError: fmt.Sprintf("e%d", i), Now: at}))
		at = at.Add(time.Millisecond)
	}
	h, err = c.Attempts(ctx, "many")
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != outbox.MaxAttemptHistory || h[0].Error != "e5" || h[len(h)-1].Error != fmt.Sprintf("e%d", outbox.MaxAttemptHistory+4) {
		t.Fatalf("bounded history: %d attempts, first %q last %q; want %d, e5 … e%d", len(h), h[0].Error, h[len(h)-1].Error,
			outbox.MaxAttemptHistory, outbox.MaxAttemptHistory+4)
	}

	// A row moved away (transfer completed) takes its history with it.
	r := need[ShardReader](t, s, "ReadShard, CompleteTransfer (a shard move)")
	row := mustGet(t, s, "h")
	r.SetOwnedShards([]uint32{})
	page, err := r.ReadShard(ctx, outbox.ShardRead{Shard: row.Shard, MaxRows: 1000, Mark: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.CompleteTransfer(ctx, keysOf(page.Rows)); err != nil {
		t.Fatal(err)
	}
	if h, err := c.Attempts(ctx, "h"); err != nil || len(h) != 0 {
		t.Fatalf("history of a row moved away: %v, %v; want none", h, err)
	}
}

func testListRows(t *testing.T, s outbox.Store) {
	c := need[ConsoleReader](t, s, consoleWhat)
	mk := func(key, ns, tq, wf string) outbox.Row {
		r := Row(key, ns, tq)
		r.WorkflowID = wf
		return r
	}
	mustAppend(t, s, mk("a1", "ns", "q", "w1"), mk("a2", "ns", "r", "w1"), mk("a3", "ns", "q", "w2"),
		mk("b1", "other", "q", "w1"), mk("c1", "ns", "q", "w2"), mk("c2", "ns", "q", "w3"))
	claimKey(t, s, "a3", T0) // claims the route's a1, a3, c1, c2
	failRows(t, s, "a3")
	list := func(q outbox.RowQuery) outbox.RowPage {
		t.Helper()
		p, err := c.ListRows(ctx, q)
		if err != nil {
			t.Fatalf("ListRows(%+v): %v", q, err)
		}
		return p
	}
	// Every shard is listed, owned or not.
	need[ShardScoped](t, s, "SetOwnedShards").SetOwnedShards([]uint32{})
	p := list(outbox.RowQuery{Namespace: "ns", Limit: 2})
	wantKeys(t, "first page", p.Rows, "a1", "a2")
	if p.Next != "a2" {
		t.Fatalf("first page's next %q, want a2", p.Next)
	}
	p = list(outbox.RowQuery{Namespace: "ns", Limit: 2, After: p.Next})
	wantKeys(t, "second page", p.Rows, "a3", "c1")
	p = list(outbox.RowQuery{Namespace: "ns", Limit: 2, After: p.Next})
	wantKeys(t, "last page", p.Rows, "c2")
	if p.Next != "" {
		t.Fatalf("last page's next %q, want \"\"", p.Next)
	}
	// A page exactly full at the end says so too.
	if p := list(outbox.RowQuery{Namespace: "ns", Limit: 1, After: "c1"}); p.Next != "" || len(p.Rows) != 1 {
		t.Fatalf("exactly full last page: %+v", p)
	}
	wantKeys(t, "task_queue q", list(outbox.RowQuery{Namespace: "ns", TaskQueue: "q", Limit: 10}).Rows, "a1", "a3", "c1", "c2")
	wantKeys(t, "workflow w1", list(outbox.RowQuery{WorkflowID: "w1", Limit: 10}).Rows, "a1", "a2", "b1")
	wantKeys(t, "failed", list(outbox.RowQuery{Namespace: "ns", Status: outbox.StatusFailed, Limit: 10}).Rows, "a3")
	wantKeys(t, "none", list(outbox.RowQuery{Namespace: "none", Limit: 10}).Rows)
	wantKeys(t, "limit 0", list(outbox.RowQuery{Limit: 0}).Rows)
	// The scan budget: 2 rows examined, none matching; the cursor moves on.
	p = list(outbox.RowQuery{Namespace: "other", Limit: 10, MaxScan: 2})
	if len(p.Rows) != 0 || p.Next != "a2" {
		t.Fatalf("budget-bound page: %v next %q, want none and next a2", keysOf(p.Rows), p.Next)
	}
	wantKeys(t, "resumed", list(outbox.RowQuery{Namespace: "other", Limit: 10, After: p.Next, MaxScan: 2}).Rows, "b1")
}

func testPurgeDeadLetters(t *testing.T, s outbox.Store) {
	c := need[ConsoleReader](t, s, consoleWhat)
	mustAppend(t, s, Row("a", "ns", "q"), Row("b", "ns", "q"), Row("c", "ns", "q"), Row("p", "ns", "q"), Row("x", "other", "q"))
	claimAll(t, s)
	failRows(t, s, "a", "b", "c", "x")
	must(t, s.Retry(ctx, outbox.RetryParams{DispatchKey: "p", Claim: claimOf(t, s, "p"), VisibleAfter: T0}))
	// Listed keys: only dead letters of the namespace.
	n, err := c.PurgeDeadLetters(ctx, "ns", []string{"a", "p", "x", "missing"}, T0)
	if err != nil || n != 1 {
		t.Fatalf("purge of listed keys: %d, %v; want 1", n, err)
	}
	a := mustGet(t, s, "a")
	if a.Status != outbox.StatusCancelled || a.LastError != "purged: 400" || !a.FinishedAt.Equal(T0) || !outbox.IsSlim(&a) {
		t.Fatalf("purged row: %+v", a)
	}
	// Every dead letter of the namespace.
	if n, err := c.PurgeDeadLetters(ctx, "ns", nil, T0); err != nil || n != 2 {
		t.Fatalf("purge of the namespace: %d, %v; want 2", n, err)
	}
	if n, err := c.PurgeDeadLetters(ctx, "ns", nil, T0); err != nil || n != 0 {
		t.Fatalf("purge again: %d, %v; want 0", n, err)
	}
	for k, want := range map[string]outbox.Status{"b": outbox.StatusCancelled, "c": outbox.StatusCancelled, "p": outbox.StatusPending, "x": outbox.StatusFailed} {
		if got := mustGet(t, s, k).Status; got != want {
			t.Fatalf("row %q: %s, want %s", k, got, want)
		}
	}
	rows, err := need[AdminReader](t, s, "ListDeadLetters").ListDeadLetters(ctx, "ns", "", 10)
	if err != nil || len(rows) != 0 {
		t.Fatalf("dead letters after the purge: %v, %v", keysOf(rows), err)
	}
	// A purged key is still a duplicate for appends.
	if out := mustAppend(t, s, Row("a", "ns", "q")); out[0] != outbox.AppendDuplicate {
		t.Fatalf("append of a purged key: %v, want duplicate", out[0])
	}
}
