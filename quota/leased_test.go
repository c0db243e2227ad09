package quota_test

import (
	"context"
	"testing"
	"time"

	"github.com/fairshard/fairshard/lease"
	"github.com/fairshard/fairshard/quota"
	"github.com/fairshard/fairshard/shards"
)

var _ quota.Grants = (*lease.Client)(nil)

// leaseClient returns a real lease client on clock, and a function that
// makes its coordinator grant namespace ns rows for expiry.
func leaseClient(t *testing.T, clock *fakeClock) (*lease.Client, func(ns string, rows uint32, expiry time.Duration)) {
	t.Helper()
	c, err := lease.NewClient(lease.ClientConfig{Node: "me", Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	grant := func(ns string, rows uint32, expiry time.Duration) {
		t.Helper()
		calls, err := c.Calls(0, []lease.Demand{{Namespace: ns, Wants: rows + 1}}, func(string) (string, bool) { return "coord", true })
		if err != nil || len(calls) != 1 {
			t.Fatalf("calls %+v, %v", calls, err)
		}
		// Other namespaces the client holds grants of are asked about too;
		// "not coordinator" keeps their grants as they are.
		var resp lease.Response
		for _, a := range calls[0].Request.Asks {
			if a.Namespace == ns {
				resp.Leases = append(resp.Leases, lease.Lease{Namespace: ns, Grant: rows, ExpiryMS: uint32(expiry / time.Millisecond), RefreshMS: 100})
			} else {
				resp.NotCoordinator = append(resp.NotCoordinator, a.Namespace)
			}
		}
		if err := c.Apply(calls[0], resp); err != nil {
			t.Fatal(err)
		}
	}
	return c, grant
}

func TestLeasedCeilingIsTheUnexpiredGrant(t *testing.T) {
	clock := newClock()
	client, grant := leaseClient(t, clock)
	settings := map[string]quota.Settings{
		"ns":     {MaxInFlight: u32(10)},
		"small":  {MaxInFlight: u32(2)},
		"paused": {MaxInFlight: u32(10), Paused: true},
	}
	p := quota.NewPolicies(quota.SettingsSourceFunc(func(_ context.Context, ns string) (quota.Settings, bool, error) {
		s, ok := settings[ns]
		return s, ok, nil
	}), quota.Defaults{Quota: 10}, 0)
	src := quota.NewLeased(p, client, clock.Now)

	if c := src.Ceiling(ctx, "ns"); c.Rows != 0 || c.Mode != quota.ModeExact || c.Quota != 10 || !c.Expires.IsZero() {
		t.Fatalf("no lease yet: %+v, want 0 rows", c)
	}
	grant("ns", 3, 2*time.Second)
	want := clock.Now().Add(2 * time.Second)
	if c := src.Ceiling(ctx, "ns"); c.Rows != 3 || !c.Expires.Equal(want) {
		t.Fatalf("leased: %+v, want 3 rows until %v", c, want)
	}
	clock.Advance(2*time.Second - time.Millisecond)
	if c := src.Ceiling(ctx, "ns"); c.Rows != 3 {
		t.Fatalf("just before expiry: %d rows, want 3", c.Rows)
	}
	clock.Advance(time.Millisecond)
	if c := src.Ceiling(ctx, "ns"); c.Rows != 0 || !c.Expires.IsZero() {
		t.Fatalf("at expiry: %+v, want 0 rows", c)
	}

	// A grant above the configured quota (lowered since) is capped.
	grant("small", 5, time.Minute)
	if c := src.Ceiling(ctx, "small"); c.Rows != 2 {
		t.Fatalf("grant 5 over quota 2: %d rows, want 2", c.Rows)
	}
	// Paused: 0 whatever the lease.
	grant("paused", 5, time.Minute)
	if c := src.Ceiling(ctx, "paused"); c.Rows != 0 || !c.Paused {
		t.Fatalf("paused with a lease: %+v, want 0 rows", c)
	}
}

// Shrinking a grant stops new claims and takes nothing back: with 5 rows
// claimed under a grant now lowered to 2, the ceiling is 2 and the
// headroom 0, until claimed falls below 2.
func TestLeasedShrinkStopsNewClaimsOnly(t *testing.T) {
	clock := newClock()
	client, grant := leaseClient(t, clock)
	src := quota.NewLeased(quota.NewPolicies(nil, quota.Defaults{Quota: 10}, 0), client, clock.Now)
	grant("ns", 5, time.Minute)
	if h := src.Ceiling(ctx, "ns").Headroom(0); h != 5 {
		t.Fatalf("headroom %d, want 5", h)
	}
	grant("ns", 2, time.Minute)
	c := src.Ceiling(ctx, "ns")
	for claimed, want := range map[int]int{5: 0, 2: 0, 1: 1, 0: 2} {
		if h := c.Headroom(claimed); h != want {
			t.Fatalf("ceiling %d, %d claimed: headroom %d, want %d", c.Rows, claimed, h, want)
		}
	}
}

func TestByModeRoutesByTheNamespaceMode(t *testing.T) {
	clock := newClock()
	client, grant := leaseClient(t, clock)
	settings := map[string]quota.Settings{
		"prop":  {MaxInFlight: u32(8), Mode: quota.ModeProportional},
		"exact": {MaxInFlight: u32(8), Mode: quota.ModeExact},
		"unset": {MaxInFlight: u32(8)},
	}
	p := quota.NewPolicies(quota.SettingsSourceFunc(func(_ context.Context, ns string) (quota.Settings, bool, error) {
		s, ok := settings[ns]
		return s, ok, nil
	}), quota.Defaults{Quota: 8}, 0)
	quarter := func() shards.OwnedShardFraction { return shards.NewOwnedShardFraction(2, 8) }
	src := quota.NewByMode(p, quota.NewProportional(p, quarter), quota.NewLeased(p, client, clock.Now))
	for _, ns := range []string{"prop", "exact", "unset"} {
		grant(ns, 5, time.Minute)
	}
	for ns, want := range map[string]quota.Ceiling{
		"prop":  {Rows: 2, Quota: 8, Mode: quota.ModeProportional}, // ceil(8 × 2/8), the lease ignored
		"exact": {Rows: 5, Quota: 8, Mode: quota.ModeExact, Expires: clock.Now().Add(time.Minute)},
		"unset": {Rows: 5, Quota: 8, Mode: quota.ModeExact, Expires: clock.Now().Add(time.Minute)}, // exact is the default
	} {
		if got := src.Ceiling(ctx, ns); got != want {
			t.Errorf("%s: %+v, want %+v", ns, got, want)
		}
	}
	// With proportional as the cluster's default mode, unset follows it.
	p2 := quota.NewPolicies(quota.SettingsSourceFunc(func(_ context.Context, ns string) (quota.Settings, bool, error) {
		s, ok := settings[ns]
		return s, ok, nil
	}), quota.Defaults{Quota: 8, Mode: quota.ModeProportional}, 0)
	src2 := quota.NewByMode(p2, quota.NewProportional(p2, quarter), quota.NewLeased(p2, client, clock.Now))
	if c := src2.Ceiling(ctx, "unset"); c.Mode != quota.ModeProportional || c.Rows != 2 {
		t.Fatalf("unset under a proportional default: %+v", c)
	}
}
