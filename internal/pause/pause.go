// Package pause notices when this process stopped running for a while: a
// long GC pause, a VM freeze, SIGSTOP, a laptop lid. A process that
// resumes believes it still owns what it owned, while the rest of the
// cluster may have declared it dead and given its shards and coordinator
// terms to others (DESIGN.md "Fencing paused processes"). A Watch ticks on
// the monotonic clock; a gap between ticks longer than its threshold is a
// pause. Callers fence their actions with it: record Gen when an action
// starts (a sweep's claims), and check Allow before the action reaches the
// world (a delivery's request): Allow is false from the moment the watch
// is overdue, before its own goroutine has even run again, and stays false
// for every generation older than the pause's. The Watch's callback then
// re-establishes what the process may act on (the node puts its primary
// shards through a handover and starts new coordinator terms).
package pause

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fairshard/fairshard/internal/tick"
)

// Watch ticks every Threshold/4 and calls OnPause, from its Run goroutine,
// for every gap between ticks longer than Threshold. Safe for concurrent
// use.
type Watch struct {
	threshold time.Duration
	onPause   func(gap time.Duration)

	start time.Time     // the origin of the monotonic readings
	last  atomic.Int64  // the last tick, ns since start
	gen   atomic.Uint64 // bumped by every pause, before OnPause runs
	mu    sync.Mutex    // serialises ticks (Run and Check)
}

// New returns a Watch with the given threshold (> 0) and callback (nil:
// none). It counts as having ticked now.
func New(threshold time.Duration, onPause func(gap time.Duration)) *Watch {
	w := &Watch{threshold: threshold, onPause: onPause, start: time.Now()}
	return w
}

// Threshold returns the gap that counts as a pause.
func (w *Watch) Threshold() time.Duration { return w.threshold }

// Run ticks until ctx ends; it returns nil then.
func (w *Watch) Run(ctx context.Context) error {
	return tick.Every(ctx, max(w.threshold/4, time.Millisecond), func(context.Context) { w.Check() })
}

// Check ticks now: if the last tick is more than Threshold ago, the
// generation is bumped and OnPause called with the gap. Run calls it;
// tests call it to tick by hand.
func (w *Watch) Check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Since(w.start)
	gap := now - time.Duration(w.last.Load())
	if gap > w.threshold {
		w.gen.Add(1)
		if w.onPause != nil {
			w.onPause(gap)
		}
	}
	w.last.Store(int64(time.Since(w.start)))
}

// Gen returns the current generation: record it when an action starts.
func (w *Watch) Gen() uint64 { return w.gen.Load() }

// Allow reports whether an action that started at generation gen may
// reach the world now: no pause was noticed since gen, and the watch is
// not overdue (a pause may be under way to be noticed).
func (w *Watch) Allow(gen uint64) bool {
	if gen != w.gen.Load() {
		return false
	}
	return time.Since(w.start)-time.Duration(w.last.Load()) <= w.threshold
}
