package outboxtest

import (
	"context"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/fairshard/fairshard/outbox"
)

// AdminReader is what a node's admin API, ceilings and metrics read of its
// store beside the contract (package node's Store). A store without it
// fails the suite.
type AdminReader interface {
	ListDeadLetters(ctx context.Context, namespace, afterKey string, limit int) ([]outbox.Row, error)
	ListDeadLetterPage(ctx context.Context, namespace string, q outbox.DeadLetterQuery) (outbox.DeadLetterPage, error)
	NamespaceStats(ctx context.Context) (map[string]outbox.NamespaceStats, error)
	CountClaimedHeld(ctx context.Context, namespaces []string) (map[string]int, error)
}

// ConfigStore keeps a node's gossiped config entries (opaque values by
// key) beside its rows. A store without it fails the suite.
type ConfigStore interface {
	SaveConfigEntry(ctx context.Context, key string, value []byte) error
	DeleteConfigEntry(ctx context.Context, key string) error
	LoadConfigEntries(ctx context.Context) (map[string][]byte, error)
}

// claimAll claims every row visible at T0.
func claimAll(t *testing.T, s outbox.Store) {
	t.Helper()
	mustClaim(t, s, outbox.ClaimParams{Limit: 1000, Now: T0})
}

// failRows fails the claimed rows of keys.
func failRows(t *testing.T, s outbox.Store, keys ...string) {
	t.Helper()
	for _, k := range keys {
		must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: k, Claim: claimOf(t, s, k), LastError: "400", Now: T0}))
	}
}

func testDeadLetterPages(t *testing.T, s outbox.Store) {
	a := need[AdminReader](t, s, "ListDeadLetters, ListDeadLetterPage, NamespaceStats, CountClaimedHeld (a node's admin reads)")
	mustAppend(t, s, Row("a", "ns", "q"), Row("b", "ns", "q"), Row("c", "ns", "r"), Row("d", "ns", "q"), Row("x", "other", "q"))
	claimAll(t, s)
	failRows(t, s, "d", "b", "c", "x")
	// Dead letters of every shard are listed, owned or not.
	need[ShardScoped](t, s, "SetOwnedShards").SetOwnedShards([]uint32{})
	page := func(after string, limit int) []outbox.Row {
		t.Helper()
		rows, err := a.ListDeadLetters(ctx, "ns", after, limit)
		if err != nil {
			t.Fatalf("ListDeadLetters(after %q, limit %d): %v", after, limit, err)
		}
		return rows
	}
	wantKeys(t, "first page", page("", 2), "b", "c")
	wantKeys(t, "after c", page("c", 10), "d")
	wantKeys(t, "after the last", page("d", 10))
	wantKeys(t, "limit 0", page("", 0))
	if r := page("", 1); len(r) != 1 || r[0].Status != outbox.StatusFailed || r[0].LastError != "400" {
		t.Fatalf("dead letter: %+v", r)
	}
}

// testDeadLetterBudget: ListDeadLetterPage bounds a page by rows and by
// bytes (outbox.RowBytes, at least one row), ends it at Through, leaves
// payloads out on request while still giving their sizes, and says
// whether rows were left out (More); Keep skips rows without spending the
// page's limit or budget on them.
func testDeadLetterBudget(t *testing.T, s outbox.Store) {
	a := need[AdminReader](t, s, "ListDeadLetters, ListDeadLetterPage, NamespaceStats, CountClaimedHeld (a node's admin reads)")
	mustAppend(t, s, Row("a", "ns", "q"), Row("b", "ns", "q"), Row("c", "ns", "r"), Row("d", "ns", "q"), Row("x", "other", "q"))
	claimAll(t, s)
	failRows(t, s, "d", "b", "c", "x")
	page := func(what string, q outbox.DeadLetterQuery, more bool, want ...string) outbox.DeadLetterPage {
		t.Helper()
		p, err := a.ListDeadLetterPage(ctx, "ns", q)
		if err != nil {
			t.Fatalf("%s: ListDeadLetterPage(%+v): %v", what, q, err)
		}
		wantKeys(t, what, p.Rows, want...)
		if p.More != more || len(p.PayloadBytes) != len(p.Rows) {
			t.Fatalf("%s: More %v (want %v), %d payload sizes for %d rows", what, p.More, more, len(p.PayloadBytes), len(p.Rows))
		}
		for i, r := range p.Rows {
			if want := len(Row(r.DispatchKey, "", "").Payload); p.PayloadBytes[i] != want {
				t.Fatalf("%s: payload size of %q: %d, want %d", what, r.DispatchKey, p.PayloadBytes[i], want)
			}
			if q.WithoutPayload != (r.Payload == nil) {
				t.Fatalf("%s: row %q payload %q (WithoutPayload %v)", what, r.DispatchKey, r.Payload, q.WithoutPayload)
			}
		}
		return p
	}
	all := page("every row", outbox.DeadLetterQuery{Limit: 10}, false, "b", "c", "d")
	one := outbox.RowBytes(&all.Rows[0])
	page("limit", outbox.DeadLetterQuery{Limit: 2}, true, "b", "c")
	page("limit 0", outbox.DeadLetterQuery{Limit: 0}, false)
	page("a budget below one row", outbox.DeadLetterQuery{Limit: 10, MaxBytes: 1}, true, "b")
	page("a budget of two rows", outbox.DeadLetterQuery{Limit: 10, MaxBytes: 2*one + 1}, true, "b", "c")
	slim := one - all.PayloadBytes[0]
	page("without payloads, the budget counts rows without them", outbox.DeadLetterQuery{Limit: 10, MaxBytes: 3 * slim, WithoutPayload: true}, false, "b", "c", "d")
	page("the same budget with payloads", outbox.DeadLetterQuery{Limit: 10, MaxBytes: 3 * slim}, true, "b", "c")
	page("through", outbox.DeadLetterQuery{Through: "c", Limit: 10}, false, "b", "c")
	page("through, cut by limit", outbox.DeadLetterQuery{Through: "c", Limit: 1}, true, "b")
	page("after and through", outbox.DeadLetterQuery{After: "b", Through: "c", Limit: 10}, false, "c")
	page("after the last", outbox.DeadLetterQuery{After: "d", Limit: 10}, false)
	// Keep: refused rows are skipped, count toward neither limit nor
	// budget, and do not end the page.
	notC := func(k string) bool { return k != "c" }
	page("keep", outbox.DeadLetterQuery{Limit: 10, Keep: notC}, false, "b", "d")
	page("keep, limit", outbox.DeadLetterQuery{Limit: 2, Keep: notC}, false, "b", "d")
	page("keep, a budget of two rows", outbox.DeadLetterQuery{Limit: 10, MaxBytes: 2*one + 1, Keep: notC}, false, "b", "d")
	page("keep none", outbox.DeadLetterQuery{Limit: 10, Keep: func(string) bool { return false }}, false)
}

func testNamespaceStats(t *testing.T, s outbox.Store) {
	a := need[AdminReader](t, s, "ListDeadLetters, ListDeadLetterPage, NamespaceStats, CountClaimedHeld (a node's admin reads)")
	mustAppend(t, s, Row("claimed", "ns", "q"), Row("done", "ns", "q"), Row("dead", "ns", "q"))
	claimAll(t, s)
	late := Row("late", "ns", "q")
	late.VisibleAfter = T0.Add(time.Hour)
	early := Row("early", "ns", "q")
	early.VisibleAfter = T0.Add(-time.Minute)
	mustAppend(t, s, late, early, Row("cancelled", "ns", "q"), Row("elsewhere", "other", "q"))
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "done", Claim: claimOf(t, s, "done"), Now: T0}))
	failRows(t, s, "dead")
	if ok, err := s.Cancel(ctx, outbox.CancelParams{DispatchKey: "cancelled", Now: T0}); err != nil || !ok {
		t.Fatalf("cancel: %v %v", ok, err)
	}
	// Counts cover every shard, owned or not.
	need[ShardScoped](t, s, "SetOwnedShards").SetOwnedShards([]uint32{})
	stats, err := a.NamespaceStats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]outbox.NamespaceStats{
		"ns":    {Pending: 2, Claimed: 1, Done: 1, Failed: 1, Cancelled: 1, OldestPending: early.VisibleAfter},
		"other": {Pending: 1, OldestPending: T0},
	}
	if !maps.EqualFunc(stats, want, func(a, b outbox.NamespaceStats) bool {
		return a.Pending == b.Pending && a.Claimed == b.Claimed && a.Done == b.Done && a.Failed == b.Failed &&
			a.Cancelled == b.Cancelled && a.OldestPending.Equal(b.OldestPending)
	}) {
		t.Fatalf("NamespaceStats = %+v, want %+v", stats, want)
	}
}

func testCountClaimedHeld(t *testing.T, s outbox.Store) {
	a := need[AdminReader](t, s, "ListDeadLetters, ListDeadLetterPage, NamespaceStats, CountClaimedHeld (a node's admin reads)")
	mustAppend(t, s, Row("a", "ns", "q"), Row("b", "ns", "q"))
	claimAll(t, s)
	mustAppend(t, s, Row("c", "ns", "q"))
	// The shards are lost: the claims still count against this node.
	need[ShardScoped](t, s, "SetOwnedShards").SetOwnedShards([]uint32{})
	scoped, err := s.CountClaimedByNamespace(ctx, []string{"ns"})
	if err != nil || scoped["ns"] != 0 {
		t.Fatalf("CountClaimedByNamespace owning nothing = %v, %v; want 0", scoped, err)
	}
	held, err := a.CountClaimedHeld(ctx, []string{"ns", "none"})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"ns": 2, "none": 0}; !maps.Equal(held, want) {
		t.Fatalf("CountClaimedHeld = %v, want %v", held, want)
	}
}

func testConfigEntries(t *testing.T, s outbox.Store) {
	c := need[ConfigStore](t, s, "SaveConfigEntry, DeleteConfigEntry, LoadConfigEntries (a node's persisted config)")
	v := []byte(`{"v":1}`)
	must(t, c.SaveConfigEntry(ctx, "ns/a/paused", v))
	must(t, c.SaveConfigEntry(ctx, "hold/wf", []byte(`{}`)))
	v[0] = 'X' // the store keeps its own copy
	must(t, c.SaveConfigEntry(ctx, "hold/wf", []byte(`{"again":true}`)))
	must(t, c.DeleteConfigEntry(ctx, "missing"))
	got, err := c.LoadConfigEntries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"ns/a/paused": `{"v":1}`, "hold/wf": `{"again":true}`}
	if len(got) != len(want) {
		t.Fatalf("LoadConfigEntries = %q, want %q", got, want)
	}
	for k, w := range want {
		if string(got[k]) != w {
			t.Fatalf("entry %q = %q, want %q", k, got[k], w)
		}
	}
	must(t, c.DeleteConfigEntry(ctx, "ns/a/paused"))
	got, err = c.LoadConfigEntries(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if keys := slices.Sorted(maps.Keys(got)); !slices.Equal(keys, []string{"hold/wf"}) {
		t.Fatalf("after delete: keys %v", keys)
	}
	if err := c.SaveConfigEntry(ctx, "", []byte("x")); err == nil {
		t.Fatal("SaveConfigEntry with an empty key: nil error")
	}
}
