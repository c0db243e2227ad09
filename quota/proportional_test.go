package quota_test

import (
	"context"
	"math"
	"testing"

	"pgregory.net/rapid"

	"github.com/fairshard/fairshard/quota"
	"github.com/fairshard/fairshard/shards"
)

// fixed is a settings source answering one namespace's settings.
func fixed(s quota.Settings) quota.SettingsSource {
	return quota.SettingsSourceFunc(func(context.Context, string) (quota.Settings, bool, error) { return s, true, nil })
}

// The seed's OwnedShardFraction and ceiling cases (seed/backpressure.rs
// tests), one for one, through the proportional source.
func TestProportionalSeedCases(t *testing.T) {
	cases := []struct {
		name     string
		fraction shards.OwnedShardFraction
		quota    uint32
		want     uint32
	}{
		{"own all: quota 256", shards.OwnAll(), 256, 256},
		{"own all: quota 0 stays 0", shards.OwnAll(), 0, 0},
		{"own all: quota 1", shards.OwnAll(), 1, 1},
		{"2 of 8: 256 → 64", shards.NewOwnedShardFraction(2, 8), 256, 64},
		{"2 of 8: 100 → 25", shards.NewOwnedShardFraction(2, 8), 100, 25},
		{"2 of 8: 10 → ceil(2.5) = 3 (rounded up: over-admit, not starve)", shards.NewOwnedShardFraction(2, 8), 10, 3},
		{"new(0,0) clamps to 1/1", shards.NewOwnedShardFraction(0, 0), 64, 64},
		{"new(9,4): owned clamps to total", shards.NewOwnedShardFraction(9, 4), 64, 64},
		{"owned 0 clamps to 1 of 8", shards.NewOwnedShardFraction(0, 8), 8, 1},
		{"quota 8, owned 2 of 8 → 2 (DESIGN)", shards.NewOwnedShardFraction(2, 8), 8, 2},
		{"max quota does not overflow", shards.NewOwnedShardFraction(4095, 4096), math.MaxUint32, 4293918720},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := quota.NewPolicies(fixed(quota.Settings{MaxInFlight: u32(tc.quota)}), quota.Defaults{Quota: 1}, 0)
			src := quota.NewProportional(p, func() shards.OwnedShardFraction { return tc.fraction })
			c := src.Ceiling(ctx, "ns")
			if c.Rows != tc.want || c.Quota != tc.quota || c.Mode != quota.ModeProportional || c.Paused || !c.Expires.IsZero() {
				t.Fatalf("ceiling %+v, want %d rows of quota %d", c, tc.want, tc.quota)
			}
		})
	}
}

// Four nodes owning a quarter each enforce ceil(quota/4): their ceilings
// sum to at least the quota (seed: never under).
func TestProportionalQuartersSumToAtLeastQuota(t *testing.T) {
	p := quota.NewPolicies(fixed(quota.Settings{MaxInFlight: u32(100)}), quota.Defaults{}, 0)
	c := quota.NewProportional(p, func() shards.OwnedShardFraction { return shards.NewOwnedShardFraction(2, 8) }).Ceiling(ctx, "ns")
	if c.Rows != 25 || 4*c.Rows < 100 {
		t.Fatalf("ceiling %d; 4 × it must be ≥ 100", c.Rows)
	}
}

func TestProportionalDefaultsAndPause(t *testing.T) {
	own := func() shards.OwnedShardFraction { return shards.NewOwnedShardFraction(1, 2) }
	// No fraction function: a single node owning everything.
	unset := quota.NewPolicies(nil, quota.Defaults{Quota: quota.DefaultQuota}, 0)
	if c := quota.NewProportional(unset, nil).Ceiling(ctx, "ns"); c.Rows != 1024 || !c.QuotaDefault {
		t.Fatalf("default quota, own all: %+v, want 1024 rows", c)
	}
	if c := quota.NewProportional(unset, own).Ceiling(ctx, "ns"); c.Rows != 512 {
		t.Fatalf("default quota, half the shards: %d rows, want 512", c.Rows)
	}
	paused := quota.NewPolicies(fixed(quota.Settings{MaxInFlight: u32(10), Paused: true}), quota.Defaults{}, 0)
	if c := quota.NewProportional(paused, own).Ceiling(ctx, "ns"); c.Rows != 0 || !c.Paused || c.Quota != 10 {
		t.Fatalf("paused: %+v, want 0 rows, the quota still shown", c)
	}
}

// For any partition of the shards among N nodes, proportional ceilings sum
// to between quota and quota + N − 1 (the over-admission exact mode
// removes), and none exceeds the quota.
func TestProportionalPartitionProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		total := rapid.Uint32Range(1, 4096).Draw(t, "total")
		n := rapid.IntRange(1, int(min(total, 64))).Draw(t, "nodes")
		q := rapid.Uint32Range(0, 1<<20).Draw(t, "quota")
		cuts := map[uint32]bool{}
		for len(cuts) < n-1 {
			cuts[rapid.Uint32Range(1, total-1).Draw(t, "cut")] = true
		}
		p := quota.NewPolicies(fixed(quota.Settings{MaxInFlight: &q}), quota.Defaults{}, 0)
		var sum uint64
		prev := uint32(0)
		for c := uint32(1); c <= total; c++ {
			if c < total && !cuts[c] {
				continue
			}
			f := shards.NewOwnedShardFraction(c-prev, total)
			prev = c
			rows := quota.NewProportional(p, func() shards.OwnedShardFraction { return f }).Ceiling(ctx, "ns").Rows
			if rows > q {
				t.Fatalf("ceiling %d > quota %d", rows, q)
			}
			sum += uint64(rows)
		}
		if sum < uint64(q) || sum > uint64(q)+uint64(n)-1 {
			t.Fatalf("ceilings sum to %d, want within [%d, %d]", sum, q, uint64(q)+uint64(n)-1)
		}
	})
}

func TestHeadroomNeverNegative(t *testing.T) {
	for _, tc := range []struct {
		rows    uint32
		claimed int
		want    int
	}{{5, 0, 5}, {5, 3, 2}, {5, 5, 0}, {2, 5, 0}, {0, 0, 0}} {
		if got := (quota.Ceiling{Rows: tc.rows}).Headroom(tc.claimed); got != tc.want {
			t.Errorf("ceiling %d, claimed %d: headroom %d, want %d", tc.rows, tc.claimed, got, tc.want)
		}
	}
}
