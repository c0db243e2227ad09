package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// ErrStarted is returned by Manager.Add after Start or Stop began, and by
// a second Manager.Start: the order is fixed once a Manager has started.
var ErrStarted = errors.New("lifecycle: manager already started")

// Service is one part of a process with a declared place in its start and
// stop order (dskit's services.Manager, STYLE §7): a step to start it, an
// optional background loop, and a step to stop it. Every field but Name is
// optional.
type Service struct {
	// Name labels the service in logs and errors ("dispatcher", "handoff").
	Name string
	// Start starts the service and returns once it serves (a listener
	// accepts, a join has landed). An error stops Manager.Start there.
	Start func(ctx context.Context) error
	// Run is the service's background loop, launched on its own goroutine
	// once Start returned nil. Its context ends after Stop returned; Run
	// must then return promptly. A nil error, or the context's own error
	// after it ended, is a clean stop; any other error is logged when it
	// happens and returned by Manager.Stop.
	Run func(ctx context.Context) error
	// Stop stops the service gracefully within ctx: finish or hand over the
	// work in hand. When ctx has already ended (Manager.Stop called with a
	// done context: a hard stop) it must give up at once and only release
	// what the service holds. Stop is called exactly once, for every
	// service added, whether or not its Start ran or succeeded: what a
	// constructor took before Start (a bound listener, an open file) is
	// released there.
	Stop func(ctx context.Context) error
}

// Manager starts services in the order they were added and stops them in
// the reverse order, each stop waiting for the one before it (the service
// added last stops first). A graceful stop and a hard stop are the same
// walk: Stop(ctx) with a live ctx lets each service finish its work; with
// a done ctx each gives up at once. Safe for concurrent use; the zero value
// is not usable: build one with NewManager.
type Manager struct {
	log *slog.Logger

	startMu  sync.Mutex // held by Start while it runs; Stop waits for it
	mu       sync.Mutex
	services []*managed
	started  bool
	stopping bool
	stopErr  error
	stopCh   chan struct{} // closed when the first Stop has finished
}

type managed struct {
	Service
	cancel context.CancelFunc // ends Run's context; nil while Run is not running
	done   chan struct{}      // closed when Run returned; nil if Run never ran
	err    error              // Run's failure, set before done is closed
}

// NewManager returns a Manager without services. log receives a line per
// service started and stopped (with how long its stop took) and per loop
// that fails; nil discards.
func NewManager(log *slog.Logger) *Manager {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{log: log, stopCh: make(chan struct{})}
}

// Add appends s to the order: it starts after every service added before
// it and stops before them. Errors: ErrStarted once Start or Stop was
// called (s is not added; its Stop is not called).
func (m *Manager) Add(s Service) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.started || m.stopping {
		return fmt.Errorf("add service %q: %w", s.Name, ErrStarted)
	}
	m.services = append(m.services, &managed{Service: s})
	return nil
}

// Start starts every service in order: its Start, then its Run loop. It
// returns the first Start error, naming the service, without starting the
// ones after it; the caller then calls Stop, which stops every service
// added. ctx is passed to each Start (it bounds start-up, not the Run
// loops, which end only through Stop). Errors also: ErrStarted on a second
// call, ErrStopped after Stop.
func (m *Manager) Start(ctx context.Context) error {
	m.startMu.Lock()
	defer m.startMu.Unlock()
	m.mu.Lock()
	switch {
	case m.stopping:
		m.mu.Unlock()
		return ErrStopped
	case m.started:
		m.mu.Unlock()
		return ErrStarted
	}
	m.started = true
	services := m.services
	m.mu.Unlock()

	for _, s := range services {
		if s.Start != nil {
			if err := s.Start(ctx); err != nil {
				return fmt.Errorf("start %s: %w", s.Name, err)
			}
		}
		if s.Run == nil {
			continue
		}
		m.mu.Lock()
		runCtx, cancel := context.WithCancel(context.Background())
		s.cancel, s.done = cancel, make(chan struct{})
		m.mu.Unlock()
		go func() {
			defer close(s.done)
			err := s.Run(runCtx)
			if err != nil && !(runCtx.Err() != nil && errors.Is(err, runCtx.Err())) {
				s.err = fmt.Errorf("service %q: %w", s.Name, err)
				m.log.Error("service loop failed", "service", s.Name, "error", err)
			}
		}()
	}
	return nil
}

// Stop stops every service added, the last added first: it calls the
// service's Stop with ctx, then ends its Run loop and waits until the loop
// has returned, then goes on to the service added before it. With ctx
// already done this is a hard stop (each Stop gives up at once); a ctx
// that ends midway turns the rest of the walk into one. Stop returns the
// services' Stop errors and loop failures joined, each naming its service
// (nil when all stopped cleanly). A Start in progress is waited for first
// (cancel its context to end it sooner). Stop is idempotent: a later call
// waits for the first to finish and returns its result.
func (m *Manager) Stop(ctx context.Context) error {
	m.startMu.Lock()
	defer m.startMu.Unlock()
	m.mu.Lock()
	if m.stopping {
		m.mu.Unlock()
		<-m.stopCh
		return m.stopErr
	}
	m.stopping = true
	services := m.services
	m.mu.Unlock()

	var errs []error
	for i := len(services) - 1; i >= 0; i-- {
		s := services[i]
		start := time.Now()
		if s.Stop != nil {
			if err := s.Stop(ctx); err != nil {
				errs = append(errs, fmt.Errorf("stop %s: %w", s.Name, err))
			}
		}
		m.mu.Lock()
		cancel, done := s.cancel, s.done
		m.mu.Unlock()
		if cancel != nil {
			cancel()
			<-done // a loop returns promptly once its context ends
			if s.err != nil {
				errs = append(errs, s.err)
			}
		}
		m.log.Debug("service stopped", "service", s.Name, "took", time.Since(start).String())
	}
	m.stopErr = errors.Join(errs...)
	close(m.stopCh)
	return m.stopErr
}

// Names returns the services' names in start order (for tests and
// diagnostics).
func (m *Manager) Names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, len(m.services))
	for i, s := range m.services {
		out[i] = s.Name
	}
	return out
}
