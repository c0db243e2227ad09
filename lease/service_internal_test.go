package lease

import (
	"context"
	"testing"
	"time"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/outbox/memstore"
	"github.com/fairshard/fairshard/quota"
)

// TestLeaseDemandCountsRunningDeliveries: the lease demand's claimed rows
// (Has) are the store's claims or the dispatcher's running deliveries,
// whichever is more, and a namespace whose every delivering row a merge
// replaced (none claimed, none pending here) still asks: those requests
// still hold capacity at its targets.
func TestLeaseDemandCountsRunningDeliveries(t *testing.T) {
	ctx := context.Background()
	st := memstore.New(64)
	t.Cleanup(func() { _ = st.Close() })
	now := time.Now().UTC()
	if _, err := st.Append(ctx, []outbox.Row{{DispatchKey: "k1", Namespace: "held", TaskQueue: "q", CreatedAt: now, VisibleAfter: now}}); err != nil {
		t.Fatal(err)
	}
	if rows, err := st.Claim(ctx, outbox.ClaimParams{Limit: 1, Now: now.Add(time.Second)}); err != nil || len(rows) != 1 {
		t.Fatalf("claim: %v %v", rows, err)
	}
	policies := quota.NewPolicies(quota.SettingsSourceFunc(func(context.Context, string) (quota.Settings, bool, error) {
		return quota.Settings{}, false, nil
	}), quota.Defaults{Quota: 64, Mode: quota.ModeExact}, 0)
	l := &Service{cfg: ServiceConfig{Store: st, Policies: policies,
		Claims: quota.Claims{Held: st.CountClaimedHeld, Deliveries: func() quota.Deliveries {
			return quota.Deliveries{Running: map[string]int{"held": 3, "merged": 2}}
		}}}}
	demand, err := l.demand(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint32{}
	for _, d := range demand {
		got[d.Namespace] = d.Claimed
	}
	if got["held"] != 3 || got["merged"] != 2 || len(got) != 2 {
		t.Fatalf("demand claims %v, want held 3 (1 claimed, 3 delivering) and merged 2 (nothing stored, 2 delivering)", got)
	}
}
