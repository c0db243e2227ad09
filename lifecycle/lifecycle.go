// Package lifecycle runs a component's background loops under one
// lifecycle: every loop takes a context, loops start in the order they are
// added, and Stop stops them in the reverse order, waiting for each to
// return before it tells the one started before it to stop (STYLE §7: a
// component owns its goroutines and can wait for them; dskit's services
// manager stops in a declared order the same way).
//
// A Group is the one place a component starts and waits for its loops:
//
//	g := lifecycle.NewGroup(log)
//	g.Go(nil, lifecycle.Loop{Name: "persist", Run: s.runPersist}) // stops last: it flushes
//	g.Go(nil, lifecycle.Loop{Name: "recompute", Run: c.recomputeLoop})
//	g.Go(startCtx, lifecycle.Loop{Name: "join", Run: c.joinLoop}) // stops first
//	...
//	err := g.Stop(ctx)
//
// It is built on golang.org/x/sync/errgroup: the group accounts for the
// goroutines; each loop also gets its own context and done channel so Stop
// can order them.
//
// A Manager does the same for a process's services, where stopping is more
// than cancelling a loop: each Service has a start step, an optional loop
// and a stop step (drain deliveries, hand off rows, leave the gossip), run
// in the reverse of the declared start order. The node runs its parts
// under one Manager. The package imports nothing of fairshard's.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"

	"golang.org/x/sync/errgroup"
)

// ErrStopped is returned by Go after Stop: a stopped Group starts nothing.
var ErrStopped = errors.New("lifecycle: group stopped")

// Loop is one background loop of a component.
type Loop struct {
	// Name labels the loop in logs and errors ("persist", "join").
	Name string
	// Run runs the loop until ctx ends and then returns promptly. A nil
	// error, or ctx's own error after ctx ended, is a clean stop; any other
	// error is logged when it happens and returned by Stop. Run must not
	// call the Group's Stop.
	Run func(ctx context.Context) error
}

// Group starts loops in order and stops them in reverse order. The zero
// value is not usable: build one with NewGroup. Safe for concurrent use.
type Group struct {
	log *slog.Logger
	eg  errgroup.Group

	mu      sync.Mutex
	loops   []*running
	stopped bool
	stopErr error
	stopCh  chan struct{} // closed when the first Stop has finished
}

type running struct {
	name   string
	cancel context.CancelFunc
	done   chan struct{}
	err    error // set before done is closed
}

// NewGroup returns an empty Group. log receives a line for every loop that
// fails (nil discards).
func NewGroup(log *slog.Logger) *Group {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Group{log: log, stopCh: make(chan struct{})}
}

// Go starts l on its own goroutine, after every loop added before it (so
// Stop stops it before them). ctx, when not nil, also ends the loop when
// it ends (a caller's context that should bound one loop); the Group's
// Stop ends it in any case. Errors: ErrStopped after Stop (l is not run).
func (g *Group) Go(ctx context.Context, l Loop) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.stopped {
		return fmt.Errorf("start loop %q: %w", l.Name, ErrStopped)
	}
	loopCtx, cancel := context.WithCancel(context.Background())
	if ctx != nil {
		stop := context.AfterFunc(ctx, cancel)
		prev := cancel
		cancel = func() { stop(); prev() }
	}
	r := &running{name: l.Name, cancel: cancel, done: make(chan struct{})}
	g.loops = append(g.loops, r)
	g.eg.Go(func() error {
		defer close(r.done)
		err := l.Run(loopCtx)
		if err != nil && !(loopCtx.Err() != nil && errors.Is(err, loopCtx.Err())) {
			r.err = fmt.Errorf("loop %q: %w", l.Name, err)
			g.log.Error("background loop failed", "loop", l.Name, "error", err)
			return r.err
		}
		return nil
	})
	return nil
}

// Stop stops every loop in the reverse of the order they were started:
// it cancels the newest loop's context, waits until it has returned, then
// does the same for the one before it, and so on. If ctx ends first the
// remaining loops are all cancelled at once and Stop still waits for them
// (a loop must return once its context ends), then returns ctx's error
// joined with the loops' errors. It returns the loops' failures joined
// (nil when every loop stopped cleanly). Stop is idempotent: a later call
// waits for the first to finish and returns its result.
func (g *Group) Stop(ctx context.Context) error {
	g.mu.Lock()
	if g.stopped {
		g.mu.Unlock()
		<-g.stopCh
		return g.stopErr
	}
	g.stopped = true
	loops := g.loops
	g.mu.Unlock()

	var errs []error
	for i := len(loops) - 1; i >= 0; i-- {
		r := loops[i]
		r.cancel()
		select {
		case <-r.done:
		case <-ctx.Done():
			for _, rest := range loops[:i] {
				rest.cancel()
			}
			errs = append(errs, fmt.Errorf("stopping loop %q: %w", r.name, ctx.Err()))
		}
		if ctx.Err() != nil {
			break
		}
	}
	_ = g.eg.Wait() // every goroutine has returned; errors are collected below
	for i := len(loops) - 1; i >= 0; i-- {
		if loops[i].err != nil {
			errs = append(errs, loops[i].err)
		}
	}
	g.stopErr = errors.Join(errs...)
	close(g.stopCh)
	return g.stopErr
}

// Running returns the names of the loops started and not yet returned,
// in start order (for tests and diagnostics).
func (g *Group) Running() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	var out []string
	for _, r := range g.loops {
		select {
		case <-r.done:
		default:
			out = append(out, r.name)
		}
	}
	return out
}
