// Package tick runs a function on a fixed period until a context ends: the
// loop every periodic background task of a node shares (tombstone
// collection, peer checks, lease renewal, the pause watch, gauges), so each
// task states its period and its work, and each stops the same way.
package tick

import (
	"context"
	"time"
)

// Every calls fn(ctx) every period until ctx ends, then returns nil (the
// shape of a lifecycle service's run function). The first call comes one
// period after Every starts. fn runs on the caller's goroutine: a call that
// outlasts the period delays the next one, and missed ticks are dropped,
// not queued (time.Ticker). period must be > 0 (time.NewTicker panics
// otherwise).
func Every(ctx context.Context, period time.Duration, fn func(context.Context)) error {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			fn(ctx)
		}
	}
}
