package backpressure_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/outbox/memstore"
	"github.com/fairshard/fairshard/outbox/outboxtest"
	"github.com/fairshard/fairshard/quota"
	"github.com/fairshard/fairshard/shards"
)

var ctx = context.Background()

// countingStore wraps a real store and counts the planner's reads, so the
// "exactly one bucketed claimed-count read per sweep" rule is observable.
type countingStore struct {
	outbox.Store
	bucketed atomic.Int64
	scalar   atomic.Int64
	claims   atomic.Int64
	failOn   string // "routes", "count" or "claim": inject that error
}

var errInjected = errors.New("injected store fault")

func (c *countingStore) PendingRoutes(ctx context.Context, now time.Time) ([]outbox.ClaimScope, error) {
	if c.failOn == "routes" {
		return nil, errInjected
	}
	return c.Store.PendingRoutes(ctx, now)
}

func (c *countingStore) CountClaimedByNamespace(ctx context.Context, ns []string) (map[string]int, error) {
	c.bucketed.Add(1)
	if c.failOn == "count" {
		return nil, errInjected
	}
	return c.Store.CountClaimedByNamespace(ctx, ns)
}

func (c *countingStore) CountClaimed(ctx context.Context, ns string) (int, error) {
	c.scalar.Add(1)
	return c.Store.CountClaimed(ctx, ns)
}

func (c *countingStore) Claim(ctx context.Context, p outbox.ClaimParams) ([]outbox.Row, error) {
	c.claims.Add(1)
	if c.failOn == "claim" {
		return nil, errInjected
	}
	return c.Store.Claim(ctx, p)
}

type bundle struct {
	store  *countingStore
	mem    *memstore.Store
	quotas map[string]uint32
	owned  atomic.Pointer[shards.OwnedShardFraction]
}

// setup returns a planner over a fresh memstore whose quotas come from the
// bundle's map (missing → DefaultQuota) and whose fraction is the bundle's.
func setup(t *testing.T) (*backpressure.Planner, *bundle) {
	t.Helper()
	b := &bundle{mem: memstore.New(64), quotas: map[string]uint32{}}
	b.store = &countingStore{Store: b.mem}
	all := shards.OwnAll()
	b.owned.Store(&all)
	src := quota.SettingsSourceFunc(func(_ context.Context, ns string) (quota.Settings, bool, error) {
		q, ok := b.quotas[ns]
		return quota.Settings{MaxInFlight: &q}, ok, nil
	})
	// The seed's scenarios run in proportional mode.
	pol := quota.NewPolicies(src, quota.Defaults{Quota: quota.DefaultQuota, Mode: quota.ModeProportional}, 0)
	p := backpressure.NewPlanner(backpressure.PlannerConfig{
		Ceilings: quota.NewProportional(pol, func() shards.OwnedShardFraction { return *b.owned.Load() }),
		Claimed:  quota.CountFunc(b.store.CountClaimedByNamespace),
		Now:      func() time.Time { return outboxtest.T0 },
	})
	return p, b
}

func (b *bundle) add(t *testing.T, ns, tq string, n int) []string {
	t.Helper()
	rows := make([]outbox.Row, n)
	keys := make([]string, n)
	for i := range rows {
		keys[i] = fmt.Sprintf("%s-%s-%05d", ns, tq, i)
		rows[i] = outboxtest.Row(keys[i], ns, tq)
	}
	if _, err := b.mem.Append(ctx, rows); err != nil {
		t.Fatal(err)
	}
	return keys
}

func (b *bundle) complete(t *testing.T, rows []outbox.Row) {
	t.Helper()
	for _, r := range rows {
		if err := b.mem.Complete(ctx, outbox.CompleteParams{DispatchKey: r.DispatchKey, Claim: r.Version, Now: outboxtest.T0}); err != nil {
			t.Fatal(err)
		}
	}
}

func perNamespace(rows []outbox.Row) map[string]int {
	m := map[string]int{}
	for _, r := range rows {
		m[r.Namespace]++
	}
	return m
}

func sweep(t *testing.T, p *backpressure.Planner, b *bundle, batch int, held map[string]struct{}) backpressure.Sweep {
	t.Helper()
	s, err := p.Sweep(ctx, b.store, backpressure.SweepRequest{Batch: batch, Held: held})
	if err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	return s
}

func TestQuietTenantNotStarvedByBurstyTenantOnManyRoutes(t *testing.T) {
	// The worked example: batch 8, bursty on 8 routes with plenty of work,
	// quiet with 1 row → bursty 7, quiet 1.
	p, b := setup(t)
	for q := range 8 {
		b.add(t, "bursty", fmt.Sprintf("q%d", q), 50)
	}
	b.add(t, "quiet", "q", 1)
	got := perNamespace(sweep(t, p, b, 8, nil).Rows)
	if got["bursty"] != 7 || got["quiet"] != 1 {
		t.Fatalf("claimed %v, want bursty:7 quiet:1", got)
	}
}

func TestQuietTenantGetsASlotEverySweep(t *testing.T) {
	p, b := setup(t)
	for q := range 8 {
		b.add(t, "bursty", fmt.Sprintf("q%d", q), 200)
	}
	b.add(t, "quiet", "q", 30)
	for i := range 10 {
		s := sweep(t, p, b, 4, nil)
		got := perNamespace(s.Rows)
		if got["quiet"] < 1 {
			t.Fatalf("sweep %d: quiet got no slot (claimed %v)", i, got)
		}
		b.complete(t, s.Rows)
	}
}

func TestTenantAtCeilingHoldsPendingThenResumes(t *testing.T) {
	p, b := setup(t)
	b.quotas["capped"] = 3
	b.add(t, "capped", "q", 10)
	first := sweep(t, p, b, 100, nil)
	if len(first.Rows) != 3 {
		t.Fatalf("first sweep claimed %d, want the ceiling 3", len(first.Rows))
	}
	second := sweep(t, p, b, 100, nil)
	if len(second.Rows) != 0 || !second.Namespaces[0].AtCeiling() {
		t.Fatalf("at ceiling: claimed %d (at ceiling %v), want 0 and held", len(second.Rows), second.Namespaces[0].AtCeiling())
	}
	if n, _ := b.mem.CountInFlight(ctx, "capped"); n != 10 {
		t.Fatalf("held rows must stay pending: in flight %d, want 10", n)
	}
	b.complete(t, first.Rows[:2])
	third := sweep(t, p, b, 100, nil)
	if len(third.Rows) != 2 {
		t.Fatalf("after 2 completions claimed %d, want 2", len(third.Rows))
	}
}

func TestBigPendingBacklogWithZeroClaimedIsNotWedged(t *testing.T) {
	// Headroom counts CLAIMED rows only: 5,000 pending rows against a quota
	// of 4 must still claim 4.
	p, b := setup(t)
	b.quotas["big"] = 4
	b.add(t, "big", "q", 5000)
	s := sweep(t, p, b, 256, nil)
	if len(s.Rows) != 4 {
		t.Fatalf("claimed %d, want 4 (pending must not count against the ceiling)", len(s.Rows))
	}
	if s.Namespaces[0].ClaimedBefore != 0 {
		t.Fatalf("ClaimedBefore = %d, want 0", s.Namespaces[0].ClaimedBefore)
	}
}

func TestPauseHoldHonouredUnderBackpressure(t *testing.T) {
	p, b := setup(t)
	b.quotas["ns"] = 4
	var rows []outbox.Row
	for i := range 6 {
		r := outboxtest.Row(fmt.Sprintf("held-%d", i), "ns", "q")
		r.WorkflowID = "wf-held"
		r.VisibleAfter = outboxtest.T0.Add(-time.Hour) // first in claim order
		rows = append(rows, r)
	}
	if _, err := b.mem.Append(ctx, rows); err != nil {
		t.Fatal(err)
	}
	b.add(t, "ns", "q", 6)
	held := map[string]struct{}{"wf-held": {}}
	s := sweep(t, p, b, 100, held)
	if len(s.Rows) != 4 {
		t.Fatalf("claimed %d, want the ceiling 4 filled from unheld rows", len(s.Rows))
	}
	for _, r := range s.Rows {
		if r.WorkflowID == "wf-held" {
			t.Fatalf("held row %s was claimed", r.DispatchKey)
		}
	}
	for i := range 6 {
		got, _ := b.mem.Get(ctx, fmt.Sprintf("held-%d", i))
		if got.Status != outbox.StatusPending {
			t.Fatalf("held row %s: %s, want pending", got.DispatchKey, got.Status)
		}
	}
}

func TestThrottledClaimDispatchesEachRowExactlyOnce(t *testing.T) {
	p, b := setup(t)
	b.quotas["a"] = 3
	b.quotas["b"] = 5
	want := map[string]bool{}
	for _, ns := range []string{"a", "b", "c"} {
		for q := range 3 {
			for _, k := range b.add(t, ns, fmt.Sprintf("q%d", q), 40) {
				want[k] = true
			}
		}
	}
	seen := map[string]int{}
	for i := 0; len(seen) < len(want); i++ {
		if i > 10_000 {
			t.Fatalf("not drained after %d sweeps: %d of %d", i, len(seen), len(want))
		}
		s := sweep(t, p, b, 7, nil)
		for _, r := range s.Rows {
			seen[r.DispatchKey]++
		}
		b.complete(t, s.Rows)
	}
	for k := range want {
		if seen[k] != 1 {
			t.Fatalf("row %s claimed %d times", k, seen[k])
		}
	}
}

func TestDefaultCeilingBehavesLikeUnscopedClaim(t *testing.T) {
	p, b := setup(t)
	b.add(t, "one", "q", 30)
	s := sweep(t, p, b, 20, nil)
	// Compare against an unscoped claim on an identical store.
	ref := memstore.New(64)
	for i := range 30 {
		if _, err := ref.Append(ctx, []outbox.Row{outboxtest.Row(fmt.Sprintf("one-q-%05d", i), "one", "q")}); err != nil {
			t.Fatal(err)
		}
	}
	want, err := ref.Claim(ctx, outbox.ClaimParams{Limit: 20, Now: outboxtest.T0})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Rows) != len(want) {
		t.Fatalf("planner claimed %d, unscoped claim %d", len(s.Rows), len(want))
	}
	for i := range want {
		if s.Rows[i].DispatchKey != want[i].DispatchKey {
			t.Fatalf("row %d: planner %s, unscoped %s", i, s.Rows[i].DispatchKey, want[i].DispatchKey)
		}
	}
}

func TestProportionalCeilingCapsPartialShardNode(t *testing.T) {
	p, b := setup(t)
	quarter := shards.NewOwnedShardFraction(2, 8)
	b.owned.Store(&quarter)
	b.quotas["ns"] = 8
	b.add(t, "ns", "q", 100)
	s := sweep(t, p, b, 256, nil)
	if len(s.Rows) != 2 || s.Namespaces[0].Ceiling != 2 {
		t.Fatalf("claimed %d with ceiling %d, want 2 and 2 (quota 8, owned 2 of 8)", len(s.Rows), s.Namespaces[0].Ceiling)
	}
	// The fraction is read live: owning everything lifts the ceiling to 8.
	all := shards.OwnAll()
	b.owned.Store(&all)
	if s := sweep(t, p, b, 256, nil); len(s.Rows) != 6 {
		t.Fatalf("after owning all: claimed %d more, want 6", len(s.Rows))
	}
}

func TestExactlyOneBucketedCountReadPerSweep(t *testing.T) {
	p, b := setup(t)
	for _, ns := range []string{"alpha", "beta", "gamma"} {
		b.add(t, ns, "q1", 3)
		b.add(t, ns, "q2", 3)
	}
	for i := range 3 {
		sweep(t, p, b, 4, nil)
		if got := b.store.bucketed.Load(); got != int64(i+1) {
			t.Fatalf("after %d sweeps: %d bucketed reads, want %d", i+1, got, i+1)
		}
	}
	if b.store.scalar.Load() != 0 {
		t.Fatalf("planner used %d per-namespace count reads, want 0", b.store.scalar.Load())
	}
}

func TestCollapsedCountYieldsSameHeadroomAsPerNamespaceCounts(t *testing.T) {
	p, b := setup(t)
	for _, ns := range []string{"alpha", "beta", "gamma"} {
		b.quotas[ns] = 100
		b.add(t, ns, "q1", 5)
		b.add(t, ns, "q2", 5)
	}
	// Claim 3 alpha, 1 beta, 2 gamma directly.
	for ns, n := range map[string]int{"alpha": 3, "beta": 1, "gamma": 2} {
		sc := outbox.ClaimScope{Namespace: ns, TaskQueue: "q1"}
		if _, err := b.mem.Claim(ctx, outbox.ClaimParams{Scope: &sc, Limit: n, Now: outboxtest.T0}); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]int{}
	for _, ns := range []string{"alpha", "beta", "gamma"} {
		want[ns], _ = b.mem.CountClaimed(ctx, ns)
	}
	s := sweep(t, p, b, 1, nil)
	for _, nsw := range s.Namespaces {
		if nsw.ClaimedBefore != want[nsw.Namespace] {
			t.Fatalf("%s: bucketed claimed %d, per-namespace count %d", nsw.Namespace, nsw.ClaimedBefore, want[nsw.Namespace])
		}
	}
	if len(s.Namespaces) != 3 {
		t.Fatalf("%d namespace buckets, want 3", len(s.Namespaces))
	}
}

func TestLeftoverBudgetGoesToNamespacesWithHeadroom(t *testing.T) {
	p, b := setup(t)
	b.quotas["small"] = 1
	b.add(t, "small", "q", 10)
	b.add(t, "large", "q", 10)
	got := perNamespace(sweep(t, p, b, 8, nil).Rows)
	if got["small"] != 1 || got["large"] != 7 {
		t.Fatalf("claimed %v, want small:1 large:7", got)
	}
}

func TestQuotaZeroNamespaceIsNeverClaimed(t *testing.T) {
	p, b := setup(t)
	b.quotas["frozen"] = 0
	b.add(t, "frozen", "q", 5)
	b.add(t, "live", "q", 5)
	got := perNamespace(sweep(t, p, b, 100, nil).Rows)
	if got["frozen"] != 0 || got["live"] != 5 {
		t.Fatalf("claimed %v, want frozen:0 live:5", got)
	}
}

func TestEligibleFilterLeavesRoutesOut(t *testing.T) {
	_, b := setup(t)
	p := backpressure.NewPlanner(backpressure.PlannerConfig{
		Ceilings: quota.NewProportional(quota.NewPolicies(nil, quota.Defaults{Quota: quota.DefaultQuota}, 0), nil),
		Claimed:  quota.CountFunc(b.store.CountClaimedByNamespace),
		Now:      func() time.Time { return outboxtest.T0 },
	})
	b.add(t, "ns", "no-target", 5)
	b.add(t, "ns", "ok", 5)
	s, err := p.Sweep(ctx, b.store, backpressure.SweepRequest{Batch: 100,
		Eligible: func(r outbox.ClaimScope) bool { return r.TaskQueue != "no-target" }})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Rows) != 5 {
		t.Fatalf("claimed %d, want 5", len(s.Rows))
	}
	for _, r := range s.Rows {
		if r.TaskQueue != "ok" {
			t.Fatalf("claimed a row of a filtered route: %s", r.DispatchKey)
		}
	}
	if want := []outbox.ClaimScope{{Namespace: "ns", TaskQueue: "no-target"}}; !slices.Equal(s.Ineligible, want) {
		t.Fatalf("Ineligible = %v, want %v (the route left out, for the caller's report)", s.Ineligible, want)
	}
}

func TestStoreErrorsAreWrappedAndKeepClaimedRows(t *testing.T) {
	for _, step := range []string{"routes", "count", "claim"} {
		t.Run(step, func(t *testing.T) {
			p, b := setup(t)
			b.add(t, "ns", "q", 3)
			b.store.failOn = step
			_, err := p.Sweep(ctx, b.store, backpressure.SweepRequest{Batch: 10})
			if !errors.Is(err, errInjected) {
				t.Fatalf("err %v, want the injected fault wrapped", err)
			}
		})
	}
}

func TestEmptyStoreAndZeroBatch(t *testing.T) {
	p, b := setup(t)
	if s := sweep(t, p, b, 10, nil); len(s.Rows) != 0 || b.store.bucketed.Load() != 0 {
		t.Fatalf("empty store: %d rows, %d count reads", len(s.Rows), b.store.bucketed.Load())
	}
	b.add(t, "ns", "q", 3)
	if s := sweep(t, p, b, 0, nil); len(s.Rows) != 0 {
		t.Fatalf("batch 0 claimed %d", len(s.Rows))
	}
}

// Property: for random tenants, quotas, routes and backlogs, one sweep
// never exceeds the batch or any ceiling, and (when the batch has a slot per
// namespace) every namespace gets at least min(slice, headroom, claimable
// rows) — the fairness guarantee.
func TestSweepProperties(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		p, b := setup(t)
		nsCount := rapid.IntRange(1, 6).Draw(rt, "namespaces")
		avail := map[string]int{}
		for i := range nsCount {
			ns := fmt.Sprintf("ns%d", i)
			if rapid.Bool().Draw(rt, "hasQuota") {
				b.quotas[ns] = rapid.Uint32Range(0, 20).Draw(rt, "quota")
			}
			routes := rapid.IntRange(1, 4).Draw(rt, "routes")
			for q := range routes {
				n := rapid.IntRange(1, 15).Draw(rt, "rows")
				b.add(t, ns, fmt.Sprintf("q%d", q), n)
				avail[ns] += n
			}
		}
		batch := rapid.IntRange(1, 64).Draw(rt, "batch")
		s, err := p.Sweep(ctx, b.store, backpressure.SweepRequest{Batch: batch})
		if err != nil {
			rt.Fatal(err)
		}
		if len(s.Rows) > batch {
			rt.Fatalf("claimed %d > batch %d", len(s.Rows), batch)
		}
		got := perNamespace(s.Rows)
		slice := (batch + nsCount - 1) / nsCount
		// Utilisation: the sweep claims everything it may, up to the batch.
		claimable := 0
		for _, nsw := range s.Namespaces {
			claimable += min(int(nsw.Ceiling), avail[nsw.Namespace])
		}
		if len(s.Rows) != min(batch, claimable) {
			rt.Fatalf("claimed %d, want min(batch %d, claimable %d)", len(s.Rows), batch, claimable)
		}
		for _, nsw := range s.Namespaces {
			if got[nsw.Namespace] != nsw.Claimed {
				rt.Fatalf("%s: report says %d, rows say %d", nsw.Namespace, nsw.Claimed, got[nsw.Namespace])
			}
			if nsw.Claimed > int(nsw.Ceiling) {
				rt.Fatalf("%s: claimed %d > ceiling %d", nsw.Namespace, nsw.Claimed, nsw.Ceiling)
			}
			floor := min(slice, int(nsw.Ceiling), avail[nsw.Namespace])
			// With batch a multiple of the active namespaces, slices never
			// overrun the budget, so every namespace's floor is reachable.
			if batch%nsCount == 0 && nsw.Claimed < floor {
				rt.Fatalf("%s: claimed %d < fair floor %d (slice %d)", nsw.Namespace, nsw.Claimed, floor, slice)
			}
			// Utilisation: with budget left, a namespace stops only at its
			// ceiling or when it has nothing left.
			if len(s.Rows) < batch && nsw.Claimed < min(int(nsw.Ceiling), avail[nsw.Namespace]) {
				rt.Fatalf("%s: budget left but claimed only %d of min(ceiling %d, avail %d)", nsw.Namespace, nsw.Claimed, nsw.Ceiling, avail[nsw.Namespace])
			}
		}
	})
}

// More active namespaces than batch slots: the rotating start gives every
// namespace a slot within ceil(namespaces/batch) sweeps instead of starving
// the alphabetical tail.
func TestManyNamespacesSmallBatchNoneStarves(t *testing.T) {
	p, b := setup(t)
	const namespaces, batch = 10, 3
	for i := range namespaces {
		b.add(t, fmt.Sprintf("ns%02d", i), "q", 50)
	}
	got := map[string]int{}
	for range (namespaces + batch - 1) / batch {
		s := sweep(t, p, b, batch, nil)
		if len(s.Rows) != batch {
			t.Fatalf("sweep claimed %d, want %d", len(s.Rows), batch)
		}
		for _, r := range s.Rows {
			got[r.Namespace]++
		}
		b.complete(t, s.Rows)
	}
	if len(got) != namespaces {
		t.Fatalf("only %d of %d namespaces got a slot within 4 sweeps: %v", len(got), namespaces, got)
	}
}
