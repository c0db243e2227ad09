package httpapi

import (
	"context"
	"fmt"
	"sync"
)

// intakeGate counts the requests storing rows on this node (public
// appends, forwarded appends, handoff receipts). Shutdown closes it once
// the node is marked leaving and waits for the requests in progress, so
// its final handoff pass sees every row it ever acknowledged; a request
// arriving later (from a peer with a stale view) is refused with 503 and
// the peer holds the rows itself. The zero value is open.
type intakeGate struct {
	mu     sync.Mutex
	closed bool
	active int
	idle   chan struct{} // closed when active reaches 0 after close
}

// enter admits one request; false once the gate is closed. Every true
// must be paired with exit.
func (g *intakeGate) enter() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.active++
	return true
}

func (g *intakeGate) exit() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.active--
	if g.active == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
}

// close refuses new requests and waits until those admitted have exited,
// or ctx ends (the error then says how many are still running).
func (g *intakeGate) close(ctx context.Context) error {
	g.mu.Lock()
	g.closed = true
	if g.active == 0 {
		g.mu.Unlock()
		return nil
	}
	if g.idle == nil {
		g.idle = make(chan struct{})
	}
	idle := g.idle
	g.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		g.mu.Lock()
		n := g.active
		g.mu.Unlock()
		return fmt.Errorf("%d requests storing rows still running: %w", n, ctx.Err())
	}
}

// gate adapts the intake to replication.Gate: the replication routes that
// store rows (forwarded appends, copies to backups, merges) count as
// requests storing rows.
type gate struct{ g *intakeGate }

func (g gate) Enter() bool { return g.g.enter() }
func (g gate) Exit()       { g.g.exit() }
