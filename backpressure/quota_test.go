package backpressure_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshard/fairshard/backpressure"
)

type fakeClock struct{ now atomic.Pointer[time.Time] }

func (c *fakeClock) Now() time.Time          { return *c.now.Load() }
func (c *fakeClock) Advance(d time.Duration) { t := c.Now().Add(d); c.now.Store(&t) }

func TestQuotaCache(t *testing.T) {
	var reads atomic.Int64
	records := map[string]uint32{"set": 7, "zero": 0}
	var fail atomic.Bool
	src := backpressure.QuotaSourceFunc(func(_ context.Context, ns string) (uint32, bool, error) {
		reads.Add(1)
		if fail.Load() {
			return 0, false, errors.New("config source down")
		}
		q, ok := records[ns]
		return q, ok, nil
	})
	clock := &fakeClock{}
	t0 := time.Unix(1000, 0)
	clock.now.Store(&t0)

	t.Run("cached for the TTL then read through", func(t *testing.T) {
		reads.Store(0)
		c := backpressure.NewQuotaCache(src, 99, 2*time.Second).WithClock(clock.Now)
		for range 5 {
			if q := c.Quota(ctx, "set"); q != 7 {
				t.Fatalf("quota %d, want 7", q)
			}
		}
		if reads.Load() != 1 {
			t.Fatalf("%d reads within the TTL, want 1", reads.Load())
		}
		clock.Advance(2 * time.Second)
		c.Quota(ctx, "set")
		if reads.Load() != 2 {
			t.Fatalf("%d reads after the TTL, want 2", reads.Load())
		}
		c.Invalidate("set")
		c.Quota(ctx, "set")
		if reads.Load() != 3 {
			t.Fatalf("%d reads after Invalidate, want 3", reads.Load())
		}
	})
	t.Run("TTL 0 reads through every call", func(t *testing.T) {
		reads.Store(0)
		c := backpressure.NewQuotaCache(src, 99, 0)
		for range 3 {
			c.Quota(ctx, "set")
		}
		if reads.Load() != 3 {
			t.Fatalf("%d reads, want 3", reads.Load())
		}
	})
	t.Run("no record gets the default, explicit zero is kept", func(t *testing.T) {
		c := backpressure.NewQuotaCache(src, 99, time.Second)
		if q := c.Quota(ctx, "unknown"); q != 99 {
			t.Fatalf("no record: %d, want default 99", q)
		}
		if q := c.Quota(ctx, "zero"); q != 0 {
			t.Fatalf("explicit 0: %d, want 0 (never claimed)", q)
		}
	})
	t.Run("read error gets the default and is not cached", func(t *testing.T) {
		reads.Store(0)
		fail.Store(true)
		defer fail.Store(false)
		c := backpressure.NewQuotaCache(src, 99, time.Minute).WithClock(clock.Now)
		if q := c.Quota(ctx, "set"); q != 99 {
			t.Fatalf("on error: %d, want default 99", q)
		}
		fail.Store(false)
		if q := c.Quota(ctx, "set"); q != 7 {
			t.Fatalf("after recovery: %d, want 7 (errors must not be cached)", q)
		}
	})
	t.Run("nil source", func(t *testing.T) {
		if q := backpressure.NewQuotaCache(nil, backpressure.DefaultQuota, time.Second).Quota(ctx, "x"); q != 1024 {
			t.Fatalf("nil source: %d, want 1024", q)
		}
	})
}
