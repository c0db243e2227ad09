package tick_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/internal/tick"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Every calls its function repeatedly, with the loop's context, and
// returns nil once that context ends (goleak: its ticker goroutine-free
// loop leaves nothing behind).
func TestEveryCallsUntilTheContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int32
	var sawCtx atomic.Bool
	done := make(chan error, 1)
	go func() {
		done <- tick.Every(ctx, time.Millisecond, func(c context.Context) {
			if c == ctx {
				sawCtx.Store(true)
			}
			calls.Add(1)
		})
	}()
	poll.Eventually(t, 10*time.Second, "three calls", func() (bool, string) {
		n := calls.Load()
		return n >= 3, fmt.Sprintf("%d calls so far", n)
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Every returned %v after its context ended, want nil", err)
	}
	if !sawCtx.Load() {
		t.Error("fn was not given the loop's context")
	}
}
