package quota_test

import (
	"context"
	"maps"
	"testing"

	"github.com/fairshard/fairshard/quota"
)

// Claims is the larger of what the store holds claimed and what runs, per
// namespace, one entry per asked namespace; pending rows never enter it.
func TestClaimsIsTheLargerOfHeldAndRunning(t *testing.T) {
	held := map[string]int{"a": 3, "b": 1}
	c := quota.Claims{
		Held: func(_ context.Context, ns []string) (map[string]int, error) {
			out := map[string]int{}
			for _, n := range ns {
				out[n] = held[n]
			}
			return out, nil
		},
		Running: func() map[string]int { return map[string]int{"a": 2, "b": 4, "gone": 5} },
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
		t.Fatalf("without Running: %v %v, want the store's count", got, err)
	}
}
