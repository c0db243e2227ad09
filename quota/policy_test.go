package quota_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/testclock"
	"github.com/fairshard/fairshard/quota"
)

var ctx = context.Background()

// fakeClock is the manual clock of quota tests.
type fakeClock = testclock.Clock

func newClock() *fakeClock { return testclock.New(time.Unix(1000, 0)) }

func u32(v uint32) *uint32 { return &v }

// Ported from backpressure's QuotaCache test, with the pause and the mode
// that now live in the policy.
func TestPolicies(t *testing.T) {
	var reads atomic.Int64
	records := map[string]quota.Settings{
		"set":          {MaxInFlight: u32(7)},
		"zero":         {MaxInFlight: u32(0)},
		"paused":       {MaxInFlight: u32(5), Paused: true},
		"paused-unset": {Paused: true},
		"prop":         {MaxInFlight: u32(9), Mode: quota.ModeProportional},
		"exact":        {Mode: quota.ModeExact},
	}
	var fail atomic.Bool
	src := quota.SettingsSourceFunc(func(_ context.Context, ns string) (quota.Settings, bool, error) {
		reads.Add(1)
		if fail.Load() {
			return quota.Settings{}, false, errors.New("config source down")
		}
		s, ok := records[ns]
		return s, ok, nil
	})
	clock := newClock()
	defaults := quota.Defaults{Quota: 99}

	t.Run("cached for the TTL then read through", func(t *testing.T) {
		reads.Store(0)
		p := quota.NewPolicies(src, defaults, 2*time.Second).WithClock(clock.Now)
		for range 5 {
			if q := p.Policy(ctx, "set").Quota; q != 7 {
				t.Fatalf("quota %d, want 7", q)
			}
		}
		if reads.Load() != 1 {
			t.Fatalf("%d reads within the TTL, want 1", reads.Load())
		}
		clock.Advance(2 * time.Second)
		p.Policy(ctx, "set")
		if reads.Load() != 2 {
			t.Fatalf("%d reads after the TTL, want 2", reads.Load())
		}
		p.Invalidate("set")
		p.Policy(ctx, "set")
		if reads.Load() != 3 {
			t.Fatalf("%d reads after Invalidate, want 3", reads.Load())
		}
	})
	t.Run("TTL 0 reads through every call", func(t *testing.T) {
		reads.Store(0)
		p := quota.NewPolicies(src, defaults, 0)
		for range 3 {
			p.Policy(ctx, "set")
		}
		if reads.Load() != 3 {
			t.Fatalf("%d reads, want 3", reads.Load())
		}
	})
	t.Run("resolution", func(t *testing.T) {
		p := quota.NewPolicies(src, defaults, time.Second)
		for ns, want := range map[string]quota.Policy{
			"unknown":      {Quota: 99, QuotaDefault: true, Mode: quota.ModeExact},
			"set":          {Quota: 7, Mode: quota.ModeExact},
			"zero":         {Quota: 0, Mode: quota.ModeExact}, // explicit 0 is kept: never claimed
			"paused":       {Quota: 5, Paused: true, Mode: quota.ModeExact},
			"paused-unset": {Quota: 99, QuotaDefault: true, Paused: true, Mode: quota.ModeExact},
			"prop":         {Quota: 9, Mode: quota.ModeProportional},
			"exact":        {Quota: 99, QuotaDefault: true, Mode: quota.ModeExact},
		} {
			if got := p.Policy(ctx, ns); got != want {
				t.Errorf("%s: %+v, want %+v", ns, got, want)
			}
		}
	})
	t.Run("default mode", func(t *testing.T) {
		p := quota.NewPolicies(src, quota.Defaults{Quota: 1, Mode: quota.ModeProportional}, 0)
		if m := p.Policy(ctx, "set").Mode; m != quota.ModeProportional {
			t.Fatalf("unset mode resolves to %v, want the default proportional", m)
		}
		if m := p.Policy(ctx, "exact").Mode; m != quota.ModeExact {
			t.Fatalf("an explicit mode is kept: got %v", m)
		}
	})
	t.Run("read error gets the defaults and is not cached", func(t *testing.T) {
		fail.Store(true)
		defer fail.Store(false)
		p := quota.NewPolicies(src, defaults, time.Minute).WithClock(clock.Now)
		if got := p.Policy(ctx, "set"); got != (quota.Policy{Quota: 99, QuotaDefault: true, Mode: quota.ModeExact}) {
			t.Fatalf("on error: %+v, want the defaults", got)
		}
		fail.Store(false)
		if q := p.Policy(ctx, "set").Quota; q != 7 {
			t.Fatalf("after recovery: %d, want 7 (errors must not be cached)", q)
		}
	})
	t.Run("nil source", func(t *testing.T) {
		got := quota.NewPolicies(nil, quota.Defaults{Quota: quota.DefaultQuota}, time.Second).Policy(ctx, "x")
		if got.Quota != 1024 || !got.QuotaDefault || got.Mode != quota.ModeExact {
			t.Fatalf("nil source: %+v, want the platform default 1024, exact", got)
		}
	})
}

func TestModeText(t *testing.T) {
	for _, m := range []quota.Mode{quota.ModeDefault, quota.ModeExact, quota.ModeProportional} {
		b, err := json.Marshal(struct{ M quota.Mode }{m})
		if err != nil {
			t.Fatal(err)
		}
		var back struct{ M quota.Mode }
		if err := json.Unmarshal(b, &back); err != nil || back.M != m {
			t.Fatalf("%v: round trip %s → %v, %v", m, b, back.M, err)
		}
	}
	for _, bad := range []string{"Exact", "exact ", "strict", "0"} {
		if _, err := quota.ParseMode(bad); err == nil {
			t.Errorf("ParseMode(%q) accepted", bad)
		}
	}
	if _, err := quota.ParseMode(""); err == nil {
		t.Error(`ParseMode("") accepted; only the config's unset value may be empty`)
	}
	if _, err := json.Marshal(quota.Mode(7)); err == nil {
		t.Error("an out-of-range mode marshalled")
	}
}
