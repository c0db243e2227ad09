package shards

import (
	"math"
	"testing"

	"pgregory.net/rapid"
)

// Seed cases, ported one for one from seed/backpressure.rs tests.
func TestPerNodeCeilingSeedCases(t *testing.T) {
	cases := []struct {
		name     string
		fraction OwnedShardFraction
		quota    uint32
		want     uint32
	}{
		{"own all: quota 256", OwnAll(), 256, 256},
		{"own all: quota 0 stays 0", OwnAll(), 0, 0},
		{"own all: quota 1", OwnAll(), 1, 1},
		{"2 of 8: 256 → 64", NewOwnedShardFraction(2, 8), 256, 64},
		{"2 of 8: 100 → 25", NewOwnedShardFraction(2, 8), 100, 25},
		{"2 of 8: 10 → ceil(2.5) = 3", NewOwnedShardFraction(2, 8), 10, 3},
		{"new(0,0) clamps to 1/1", NewOwnedShardFraction(0, 0), 64, 64},
		{"new(9,4): owned clamps to total", NewOwnedShardFraction(9, 4), 64, 64},
		{"owned 0 clamps to 1 of 8", NewOwnedShardFraction(0, 8), 8, 1},
		{"quota 8, owned 2 of 8 → 2 (DESIGN)", NewOwnedShardFraction(2, 8), 8, 2},
		{"max quota does not overflow", NewOwnedShardFraction(4095, 4096), math.MaxUint32, 4293918720},
		{"max quota own all", OwnAll(), math.MaxUint32, math.MaxUint32},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.fraction.PerNodeCeiling(tc.quota); got != tc.want {
				t.Fatalf("PerNodeCeiling(%d) with %d/%d = %d, want %d",
					tc.quota, tc.fraction.Owned(), tc.fraction.Total(), got, tc.want)
			}
		})
	}
}

func TestFourQuarterNodesSumToAtLeastQuota(t *testing.T) {
	const quota = 100
	per := NewOwnedShardFraction(2, 8).PerNodeCeiling(quota)
	if 4*per < quota {
		t.Fatalf("4 × %d = %d < quota %d", per, 4*per, quota)
	}
}

func TestFractionAccessors(t *testing.T) {
	f := NewOwnedShardFraction(256, 1024)
	if f.Owned() != 256 || f.Total() != 1024 || f.Float() != 0.25 {
		t.Fatalf("got %d/%d = %v", f.Owned(), f.Total(), f.Float())
	}
	var zero OwnedShardFraction
	if zero.Float() != 1 || zero.PerNodeCeiling(7) != 7 {
		t.Fatalf("zero value must behave as own-all, got %v and %d", zero.Float(), zero.PerNodeCeiling(7))
	}
}

// For any partition of total shards among N nodes (every node owning at
// least one), the per-node ceilings sum to ≥ quota and ≤ quota + N − 1, and
// no single ceiling exceeds quota (seed §3.6).
func TestPerNodeCeilingPartitionProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		total := rapid.Uint32Range(1, 8192).Draw(t, "total")
		n := rapid.IntRange(1, int(min(total, 128))).Draw(t, "nodes")
		quota := rapid.Uint32Range(0, 1<<20).Draw(t, "quota")
		// Random partition: n-1 distinct cut points in (0, total).
		cuts := map[uint32]bool{}
		for len(cuts) < n-1 {
			cuts[rapid.Uint32Range(1, total-1).Draw(t, "cut")] = true
		}
		sum := uint64(0)
		prev := uint32(0)
		owned := make([]uint32, 0, n)
		for c := uint32(1); c < total; c++ {
			if cuts[c] {
				owned = append(owned, c-prev)
				prev = c
			}
		}
		owned = append(owned, total-prev)
		for _, o := range owned {
			c := NewOwnedShardFraction(o, total).PerNodeCeiling(quota)
			if c > quota {
				t.Fatalf("ceiling %d > quota %d (owned %d of %d)", c, quota, o, total)
			}
			sum += uint64(c)
		}
		if sum < uint64(quota) {
			t.Fatalf("ceilings of partition %v sum to %d < quota %d", owned, sum, quota)
		}
		if sum > uint64(quota)+uint64(len(owned))-1 {
			t.Fatalf("ceilings of partition %v sum to %d > quota %d + N−1", owned, sum, quota)
		}
	})
}
