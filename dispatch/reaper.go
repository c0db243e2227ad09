package dispatch

import (
	"context"
	"fmt"
	"time"

	"github.com/fairshard/fairshard/internal/tick"
	"github.com/fairshard/fairshard/outbox"
)

// rearmBatch is the most rows one RearmStale call re-arms; a pass loops
// until a call returns fewer.
const rearmBatch = 1024

// RearmOnce is one reaper pass: every claim older than VisibilityTimeout
// (ClaimedAt < now − VisibilityTimeout) goes back to pending, visible now,
// attempt unchanged — except rows this process is still delivering. It
// returns how many rows were re-armed; on a store error, those re-armed
// before it and the error. Run calls it every RearmInterval; tests may call
// it directly.
func (d *Dispatcher) RearmOnce(ctx context.Context) (int, error) {
	now := d.cfg.Now()
	return d.rearm(ctx, now.Add(-d.cfg.VisibilityTimeout), now, "stale")
}

// RearmAllOnStart re-arms every claim made before this Dispatcher was
// built (ClaimedAt < the clock at New): claims the node held when it last
// stopped, whose deliveries died with it. They go back to pending, visible
// now, attempt unchanged, so they are delivered again (at-least-once; the
// dispatch_key lets the target deduplicate). Run calls it before its first
// sweep and, if it failed, again on every reaper tick until it succeeds.
// It returns how many rows were re-armed. Safe to call more than once.
func (d *Dispatcher) RearmAllOnStart(ctx context.Context) (int, error) {
	n, err := d.rearm(ctx, d.startedAt, d.cfg.Now(), "left from before start")
	if err == nil {
		d.startRearmDone.Store(true)
	}
	return n, err
}

func (d *Dispatcher) rearm(ctx context.Context, olderThan, visibleAfter time.Time, why string) (int, error) {
	total := 0
	for {
		rows, err := d.cfg.Store.RearmStale(ctx, outbox.RearmParams{
			OlderThan:    olderThan,
			VisibleAfter: visibleAfter,
			Limit:        rearmBatch,
			ExcludeKeys:  d.inflightKeys(),
		})
		total += len(rows)
		d.m.rearmed.Add(float64(len(rows)))
		if err != nil {
			return total, fmt.Errorf("dispatch: re-arm claims %s (claimed before %s): %w", why, olderThan.Format(time.RFC3339Nano), err)
		}
		if len(rows) < rearmBatch {
			break
		}
	}
	if total > 0 {
		d.cfg.Logger.Info("dispatch: re-armed claims to pending", "reason", why, "num_rows", total)
		d.Wake()
	}
	return total, nil
}

// reapLoop runs the reaper every RearmInterval until ctx ends. Errors are
// logged and counted; the next tick retries.
func (d *Dispatcher) reapLoop(ctx context.Context) {
	_ = tick.Every(ctx, d.cfg.RearmInterval, d.reapOnce)
}

// reapOnce is one tick of reapLoop: the start's re-arm until it succeeded,
// host expiry, and the re-arm of stale claims.
func (d *Dispatcher) reapOnce(ctx context.Context) {
	if !d.startRearmDone.Load() {
		if _, err := d.RearmAllOnStart(ctx); err != nil && ctx.Err() == nil {
			d.m.sweepErrors.Inc()
			d.cfg.Logger.Warn("dispatch: re-arm of claims left from before start failed; retrying next tick", "error", err)
		}
	}
	d.hosts.expire(time.Now())
	if _, err := d.RearmOnce(ctx); err != nil && ctx.Err() == nil {
		d.m.sweepErrors.Inc()
		d.cfg.Logger.Warn("dispatch: re-arm of stale claims failed; retrying next tick", "error", err)
	}
}
