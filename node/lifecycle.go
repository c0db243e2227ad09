package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/kv"
)

// Start serves the API, joins the cluster and starts the background loops
// (dispatcher, ownership watcher, config watcher, handoff, tombstone GC,
// stats). With --join seeds it first waits, up to JoinWait, for a seed to
// answer (awaitFirstJoin): the node owns no shard meanwhile, so it cannot
// claim with a solo view. The cluster's join loop keeps re-joining missing
// seeds until Close. ctx bounds that wait: if it ends first, Start returns
// its error and the node never becomes ready; so does a cluster that refuses
// the node (another --shards). After an error the caller must Close. The
// node is ready (GET /readyz) once Start has returned nil.
func (n *Node) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("start %s: %w", n.name, err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	n.runCancel = cancel
	n.dispCtx, n.dispStop = context.WithCancel(runCtx)

	n.wg.Go(func() {
		if err := n.srv.Serve(n.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			n.log.Error("http server stopped", "err", err)
		}
	})
	// Ownership must be applied before the dispatcher claims anything. A
	// node with seeds owns nothing until it has joined them: until then its
	// view ("I own every shard") would let it claim rows a live owner holds
	// too (e.g. rows it had handed off just before a crash).
	n.awaitingJoin.Store(len(n.cfg.Join) > 0)
	snaps, unsubscribe := n.cl.Subscribe("node")
	n.applySnapshot(n.cl.Snapshot())
	n.wg.Go(func() {
		defer unsubscribe()
		for {
			select {
			case <-runCtx.Done():
				return
			case s := <-snaps:
				n.applySnapshot(s)
			}
		}
	})
	// The join loop lives as long as the node: a caller's short start-up
	// context must not end it (it would stop re-joining seeds forever).
	if err := n.cl.Start(runCtx); err != nil {
		cancel()
		return fmt.Errorf("join cluster: %w", err)
	}
	if n.awaitingJoin.Load() {
		if err := n.awaitFirstJoin(ctx); err != nil {
			return err // the caller's Close stops what Start launched
		}
	}
	n.applySnapshot(n.cl.Snapshot())

	watch := n.cl.KV().Watch("node", "")
	n.wg.Go(func() {
		defer watch.Close()
		for {
			select {
			case <-runCtx.Done():
				return
			case <-watch.C():
				n.applyConfigChanges(watch.Changes())
			}
		}
	})
	n.wg.Go(func() {
		if err := n.disp.Run(n.dispCtx); err != nil {
			n.log.Error("dispatcher stopped", "err", err)
		}
	})
	handoffCtx, handoffStop := context.WithCancel(runCtx)
	n.handoffStop = handoffStop
	n.wg.Go(func() { n.handoffLoop(handoffCtx) })
	n.wg.Go(func() { _ = n.store.RunTombstoneGC(runCtx, time.Minute) })
	n.wg.Go(func() { n.statsLoop(runCtx) })
	n.ready.Store(true)
	n.log.Info("node started", "members", len(n.ownership().Members))
	return nil
}

// awaitFirstJoin joins the seeds before the node claims anything, retrying
// for up to JoinWait. If every seed is one of this node's own IP addresses
// (the first node of a cluster), it returns at once; a DNS seed that lists
// only this node is retried like an unanswered one (during a full restart
// the name may not list the others yet). If no seed answers in time (a
// whole cluster starting at once), the node serves alone and the cluster's
// rejoin loop keeps trying; but if a seed answered and the state exchange
// with it kept failing (cluster.ErrStateExchange: another gossip key, a
// state memberlist refuses), Start fails: a cluster is there, and serving
// alone would own its shards without its config. If ctx ends first, Start fails with ctx's error
// and the node never owns a shard. A cluster that refuses this node
// (another shard count or protocol version) is an error: a misconfigured
// node must not serve a cluster of its own.
//
// memberlist's Join cannot be interrupted (it waits up to TCPTimeout per
// address), so each attempt runs on its own goroutine and the wait is
// bounded by JoinWait, not by the seeds; a join that lands later is picked
// up by the ownership watcher.
func (n *Node) awaitFirstJoin(ctx context.Context) (err error) {
	defer func() {
		n.awaitingJoin.Store(false)
		if err == nil {
			n.applySnapshot(n.cl.Recompute())
		}
	}()
	wctx, cancel := context.WithTimeout(ctx, n.cfg.JoinWait)
	defer cancel()
	literalSeeds := true
	for _, j := range n.cfg.Join {
		if h, _, _ := net.SplitHostPort(j); net.ParseIP(h) == nil {
			literalSeeds = false
		}
	}
	type result struct {
		contacted int
		err       error
	}
	exchangeFailures := 0
	for {
		done := make(chan result, 1)
		n.wg.Go(func() {
			c, err := n.cl.Join(context.Background(), n.cfg.Join...)
			done <- result{c, err}
		})
		var res result
		select {
		case res = <-done:
		case <-wctx.Done():
			res.err = wctx.Err()
		}
		switch {
		case res.err == nil && res.contacted > 0:
			n.log.Info("joined cluster", "seeds_contacted", res.contacted)
			return nil
		case errors.Is(res.err, cluster.ErrNoPeers) && literalSeeds:
			n.log.Info("no other seed: starting as the cluster's first node", "join", n.cfg.Join)
			return nil
		case errors.Is(res.err, cluster.ErrShardCountMismatch):
			return fmt.Errorf("the cluster at %v refused this node: its --shards %d differs from the cluster's (every node must use the same shard count): %w",
				n.cfg.Join, n.cfg.Shards, res.err)
		case errors.Is(res.err, cluster.ErrProtocolMismatch):
			return fmt.Errorf("the cluster at %v refused this node: it speaks another protocol version: %w", n.cfg.Join, res.err)
		}
		// Consecutive attempts whose seed answered but whose state exchange
		// failed; one alone may be a seed caught shutting down.
		if errors.Is(res.err, cluster.ErrStateExchange) {
			exchangeFailures++
		} else {
			exchangeFailures = 0
		}
		if ctx.Err() != nil {
			return fmt.Errorf("start %s: stopped while joining %v: %w", n.name, n.cfg.Join, ctx.Err())
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return fmt.Errorf("start %s: stopped while joining %v: %w", n.name, n.cfg.Join, ctx.Err())
			}
			if exchangeFailures >= 2 {
				// Someone is there, but the push/pull with it fails: serving
				// alone would own every shard beside a live cluster, without
				// its config (pauses, quotas) — issue #13 item 4.
				return fmt.Errorf("the cluster at %v answered but this node could not exchange state with it for %v (check --gossip-key; see the node log): %w",
					n.cfg.Join, n.cfg.JoinWait, res.err)
			}
			n.log.Warn("no seed answered; serving alone until one does", "join", n.cfg.Join, "waited", n.cfg.JoinWait, "err", res.err)
			return nil
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// applySnapshot makes s the node's applied ownership view: it scopes the
// store's claims to the shards this node owns in s, then publishes s as the
// view every other consumer reads (ownership: the planner's ceilings,
// append routing, handoff, the admin views), and wakes the handoff loop
// and the dispatcher. So claim scope and ceilings always come from the
// same snapshot. Views are applied in version order: an older snapshot
// that loses a race with a newer one is ignored. Before the first join the
// node owns nothing (s.OwningNothing).
func (n *Node) applySnapshot(s *cluster.OwnershipSnapshot) {
	if s == nil {
		return
	}
	n.snapMu.Lock()
	defer n.snapMu.Unlock()
	if cur := n.applied.Load(); cur != nil && s.Version < cur.Version {
		return
	}
	if n.awaitingJoin.Load() {
		s = s.OwningNothing()
	}
	n.store.SetOwnedShards(s.Owned)
	n.applied.Store(s)
	n.wakeHandoff()
	n.disp.Wake()
}

// ownership returns the node's applied ownership view (applySnapshot):
// the one snapshot claim scope, ceilings, append routing and handoff all
// read. Never nil after New.
func (n *Node) ownership() *cluster.OwnershipSnapshot { return n.applied.Load() }

func (n *Node) applyConfigChanges(changes []kv.Entry) {
	for _, e := range changes {
		switch {
		case strings.HasPrefix(e.Key, prefixHold):
			n.rc.invalidateHolds()
		case strings.HasPrefix(e.Key, prefixNamespace):
			if ns, ok := namespaceOfKey(e.Key); ok {
				n.quota.Invalidate(ns)
			}
		}
	}
	n.disp.Wake()
}

func (n *Node) wakeHandoff() {
	select {
	case n.handoffWake <- struct{}{}:
	default:
	}
}

// Ready reports whether the node serves: store open, cluster joined,
// ownership applied, not draining.
func (n *Node) Ready() bool { return n.ready.Load() && !n.draining.Load() }

// Shutdown stops the node gracefully, in this order: refuse new appends;
// stop claiming and let in-flight deliveries finish; mark this node leaving
// (peers stop counting it as an owner), refuse rows from peers and wait for
// the writes in progress, then hand off every row it holds while the
// cluster is reachable; leave the gossip; stop serving; close the store. ctx bounds the whole stop; whatever was not handed off when it
// ends stays on disk and moves when the node returns.
func (n *Node) Shutdown(ctx context.Context) error {
	n.draining.Store(true)
	var errs []error
	// Half the grace for in-flight deliveries, the rest for handoff.
	if dl, ok := ctx.Deadline(); ok {
		dctx, cancel := context.WithDeadline(ctx, time.Now().Add(time.Until(dl)/2))
		if err := n.disp.Drain(dctx); err != nil {
			errs = append(errs, err)
		}
		cancel()
	} else if err := n.disp.Drain(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := n.cl.SetLeaving(ctx); err != nil {
		errs = append(errs, fmt.Errorf("mark leaving: %w", err))
	}
	n.applySnapshot(n.cl.Snapshot())
	// From here on rows sent here could outlive the last handoff pass:
	// refuse them (peers hold them and hand them to the new owners) and
	// let the writes already admitted finish first.
	if err := n.intake.close(ctx); err != nil {
		errs = append(errs, fmt.Errorf("close intake: %w", err))
	}
	if n.handoffStop != nil {
		n.handoffStop() // a pass of the loop in flight stops; the drain takes over
	}
	left, err := n.drainHandoff(ctx)
	if err != nil {
		errs = append(errs, fmt.Errorf("handoff on shutdown: %d shards still hold rows on disk: %w", left, err))
	}
	if err := n.cl.Leave(ctx); err != nil {
		errs = append(errs, fmt.Errorf("leave cluster: %w", err))
	}
	if err := n.Close(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		n.log.Info("node stopped gracefully")
	}
	return errors.Join(errs...)
}

// Close stops the node at once: loops end, in-flight deliveries are
// abandoned (their claims are re-armed on the next start), memberlist shuts
// down without a leave, the store closes. Idempotent.
func (n *Node) Close() error {
	n.closeOnce.Do(func() {
		n.draining.Store(true)
		if n.runCancel != nil {
			n.runCancel()
		}
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = n.srv.Shutdown(sctx)
		cancel()
		if n.runCancel == nil { // never started: the listener is ours to close
			_ = n.ln.Close()
		}
		n.wg.Wait()
		n.peers.close()
		var errs []error
		if err := n.cl.Shutdown(); err != nil {
			errs = append(errs, fmt.Errorf("cluster shutdown: %w", err))
		}
		if err := n.store.Close(); err != nil {
			errs = append(errs, fmt.Errorf("close store: %w", err))
		}
		n.closeErr = errors.Join(errs...)
	})
	return n.closeErr
}
