package quota_test

import (
	"context"
	"maps"
	"testing"

	"github.com/fairshard/fairshard/quota"
)

// heldFrom is a Held that reads counts from a map.
func heldFrom(held map[string]int) quota.CountFunc {
	return func(_ context.Context, ns []string) (map[string]int, error) {
		out := map[string]int{}
		for _, n := range ns {
			out[n] = held[n]
		}
		return out, nil
	}
}

// Claims is the larger of what the store holds claimed and what runs, per
// namespace, one entry per asked namespace; pending rows never enter it.
func TestClaimsIsTheLargerOfHeldAndRunning(t *testing.T) {
	held := map[string]int{"a": 3, "b": 1}
	c := quota.Claims{
		Held: heldFrom(held),
		Deliveries: func() quota.Deliveries {
			return quota.Deliveries{Running: map[string]int{"a": 2, "b": 4, "gone": 5}}
		},
	}
	got, err := c.Claimed(context.Background(), []string{"a", "b", "c"})
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{"a": 3, "b": 4, "c": 0}; !maps.Equal(got, want) {
		t.Fatalf("Claimed = %v, want %v", got, want)
	}
	// Of folds running deliveries into counts read elsewhere and adds the
	// namespaces only deliveries hold (every row merged away meanwhile).
	if got, want := c.Of(map[string]int{"a": 3, "b": 1}), map[string]int{"a": 3, "b": 4, "gone": 5}; !maps.Equal(got, want) {
		t.Fatalf("Of = %v, want %v", got, want)
	}
	if got, err := (quota.Claims{Held: c.Held}).Claimed(context.Background(), []string{"b"}); err != nil || got["b"] != 1 {
		t.Fatalf("without Deliveries: %v %v, want the store's count", got, err)
	}
}

// A delivery whose target answered frees its slot while its settle is
// written: it leaves the count, whichever of held and running is larger,
// and the count never drops below the deliveries still at their targets.
func TestClaimsLeaveOutSettlingDeliveries(t *testing.T) {
	held := map[string]int{"a": 3, "b": 1, "c": 2}
	c := quota.Claims{
		Held: heldFrom(held),
		Deliveries: func() quota.Deliveries {
			return quota.Deliveries{
				Running:  map[string]int{"a": 3, "b": 4, "c": 1, "gone": 2},
				Settling: map[string]int{"a": 1, "b": 2, "c": 1, "gone": 2, "odd": 7},
			}
		},
	}
	got, err := c.Claimed(context.Background(), []string{"a", "b", "c", "odd"})
	if err != nil {
		t.Fatal(err)
	}
	// a: max(3,3)−1; b: max(1,4)−2; c: max(2,1)−1 (a stale stored claim
	// still counts); odd: settling without running is ignored.
	if want := map[string]int{"a": 2, "b": 2, "c": 1, "odd": 0}; !maps.Equal(got, want) {
		t.Fatalf("Claimed = %v, want %v", got, want)
	}
	if got, want := c.Of(map[string]int{"a": 3, "b": 1, "c": 2}), map[string]int{"a": 2, "b": 2, "c": 1, "gone": 0}; !maps.Equal(got, want) {
		t.Fatalf("Of = %v, want %v", got, want)
	}
}
