package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/lifecycle"
)

// services declares the node's parts in start order; they stop in the
// reverse order (lifecycle.Manager). Reading the list bottom up gives the
// graceful stop. The node announces it is leaving before it drains, so
// its shards are claimed elsewhere after a gossip round, not after the
// drain (docs/adr/0040-service-lifecycle-and-stop-order.md):
//
//	intake      refuse new appends, announce leaving (peers take the
//	            shards at once; this node owns none, so it stops claiming)
//	dispatcher  finish in-flight deliveries (at most half the time left)
//	leases      give the capacity leases back (exact quota mode: the other
//	            nodes get them on their next refresh) and stop refreshing;
//	            the coordinator role moves with the view
//	handoff     refuse rows from peers, wait for writes in progress, hand
//	            off every row held here (the loop already moves rows while
//	            the dispatcher drains)
//	peer-check, stats, tombstone-gc, config, join (peer-check: health
//	            checks of the other members' APIs, reach.go)
//	ownership   stop applying snapshots
//	slot-lease  stop renewing the {slot} lease (when slots are used)
//	security-warning  stop the hourly INSECURE warning (security.go)
//	refusal     stop watching for the cluster's refusal of this node
//	cluster     bounded flush of config gossip, leave (then the slot's
//	            lease is released), shut memberlist down
//	http        stop serving (peers could read rows until here)
//	peer-client close idle connections (the API peer client and the
//	            replicator's)
//	store       close the store
//
// A hard stop (Close) walks the same list with a done context: no
// announcement, no drain, no handoff, no leave.
func (n *Node) services() []lifecycle.Service {
	svcs := []lifecycle.Service{
		{Name: "store", Stop: func(context.Context) error {
			if err := n.store.Close(); err != nil {
				return n.released(fmt.Errorf("close store: %w", err))
			}
			return nil
		}},
		{Name: "peer-client", Stop: func(context.Context) error {
			n.peers.CloseIdle()
			n.replPeers.Close()
			return nil
		}},
		{Name: "http", Start: func(context.Context) error { n.serving.served.Store(true); return nil },
			Run: n.serveHTTP, Stop: n.stopHTTP},
		{Name: "cluster", Start: n.startCluster, Stop: n.stopCluster},
		{Name: "refusal", Run: n.watchRefusal},
		{Name: "security-warning", Run: n.warnInsecure},
	}
	if n.slotDir != "" {
		svcs = append(svcs, lifecycle.Service{Name: "slot-lease",
			Run: func(ctx context.Context) error { n.slotLeaseLoop(ctx); return nil }})
	}
	svcs = append(svcs, []lifecycle.Service{
		{Name: "ownership", Start: n.startOwnership, Run: n.ownershipLoop},
		{Name: "join", Start: n.join},
		{Name: "config", Run: n.configLoop},
	}...)
	if gc, ok := n.store.(tombstoneCollector); ok {
		svcs = append(svcs, lifecycle.Service{Name: "tombstone-gc",
			Run: func(ctx context.Context) error { return gc.RunTombstoneGC(ctx, time.Minute) }})
	}
	if n.cfg.PprofAddr != "" {
		svcs = append(svcs, lifecycle.Service{Name: "pprof", Start: n.startPprof, Run: n.runPprof, Stop: n.stopPprof})
	}
	return append(svcs,
		lifecycle.Service{Name: "stats", Run: n.statsLoop},
		lifecycle.Service{Name: "peer-check", Run: n.peerCheckLoop},
		lifecycle.Service{Name: "replication", Run: n.repl.Run, Stop: n.stopReplication},
		lifecycle.Service{Name: "pause-watch", Run: n.pause.Run},
		lifecycle.Service{Name: "leases", Run: n.leases.Run, Stop: n.leases.Release},
		lifecycle.Service{Name: "dispatcher", Run: n.disp.Run, Stop: n.drainDeliveries},
		lifecycle.Service{Name: "intake", Start: func(context.Context) error { n.ready.Store(true); return nil },
			Stop: n.announceLeaving},
	)
}

// serveHTTP serves the API until the server is shut down.
func (n *Node) serveHTTP(context.Context) error {
	if err := n.serving.srv.Serve(n.serving.ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("http server: %w", err)
	}
	return nil
}

// stopHTTP stops serving, giving requests in progress up to 2 s (also in
// a hard stop), then closes whatever connection is left; a listener never
// served is closed. Shutdown alone leaves a connection open whose first
// request has not arrived yet (net/http treats it as busy for 5 s): a
// peer that dialled just before the stop kept one, with its goroutines,
// after the node was gone (goleak in the node tests, twice in CI).
func (n *Node) stopHTTP(context.Context) error {
	if !n.serving.served.Load() {
		_ = n.serving.ln.Close()
		return nil
	}
	sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := n.serving.srv.Shutdown(sctx); err != nil {
		_ = n.serving.srv.Close()
	}
	return nil
}

// startCluster launches the cluster's join loop. It lives as long as the
// node: a caller's short start-up context must not end it (it would stop
// re-joining seeds forever); Leave and Shutdown end it.
func (n *Node) startCluster(context.Context) error {
	if err := n.cl.Start(context.Background()); err != nil {
		return fmt.Errorf("join cluster: %w", err)
	}
	return nil
}

// stopCluster leaves the cluster (graceful stop only: a bounded flush of
// config gossip, memberlist's leave, a short wait so peers hear it) and
// shuts membership down, after the join attempts still running.
func (n *Node) stopCluster(ctx context.Context) error {
	var errs []error
	if ctx.Err() == nil {
		if err := n.cl.Leave(ctx); err != nil {
			errs = append(errs, fmt.Errorf("leave cluster: %w", err))
		} else {
			n.releaseSlot() // left: no longer a live member (slot.go)
		}
	}
	n.seeds.attempts.Wait()
	if err := n.cl.Shutdown(); err != nil {
		errs = append(errs, n.released(fmt.Errorf("cluster shutdown: %w", err)))
	}
	return errors.Join(errs...)
}

// watchRefusal reports a refusal by the cluster after Start (another live
// node uses this name) through Failed: the process should stop.
func (n *Node) watchRefusal(ctx context.Context) error {
	select {
	case <-ctx.Done():
	case <-n.cl.Refused():
		select {
		case n.failed <- fmt.Errorf("the cluster refused this node: %w", n.cl.RefusedErr()):
		default:
		}
	}
	return nil
}

// startOwnership subscribes to the cluster's snapshots and applies the
// current one. Ownership must be applied before the dispatcher claims
// anything. A node with seeds owns nothing until it has joined them: until
// then its view ("I own every shard") would let it claim rows a live owner
// holds too (e.g. rows it had handed off just before a crash).
func (n *Node) startOwnership(context.Context) error {
	n.seeds.awaiting.Store(len(n.cfg.Join) > 0)
	n.view.snaps, n.view.unsubscribe = n.cl.Subscribe("node")
	n.applySnapshot(n.cl.Snapshot())
	return nil
}

// ownershipLoop applies every snapshot the cluster publishes.
func (n *Node) ownershipLoop(ctx context.Context) error {
	defer n.view.unsubscribe()
	for {
		select {
		case <-ctx.Done():
			return nil
		case s, ok := <-n.view.snaps:
			if !ok {
				return nil
			}
			n.applySnapshot(s)
		}
	}
}

// join waits for the first join of the seeds (awaitFirstJoin), then
// applies the view it brought.
func (n *Node) join(ctx context.Context) error {
	if n.seeds.awaiting.Load() {
		if err := n.awaitFirstJoin(ctx); err != nil {
			return err
		}
	}
	n.applySnapshot(n.cl.Snapshot())
	if err := n.seedReplicationFactor(ctx); err != nil {
		n.log.Error("replication factor", "err", err)
	}
	return nil
}

// configLoop applies changes of the gossiped config: the settings drop
// what they cached, and the dispatcher sweeps (a pause lifted, a target
// set).
func (n *Node) configLoop(ctx context.Context) error {
	watch := n.cl.KV().Watch("node", "")
	defer watch.Close()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-watch.C():
			changes := watch.Changes()
			n.settings.Apply(changes)
			if replicationFactorChanged(changes) {
				n.applyReplicationFactor()
			}
			n.disp.Wake()
		}
	}
}

// announceLeaving is the first step of a stop: public appends are refused
// (503: append through another node) and /readyz turns 503; then, in a
// graceful stop, the node announces that it is leaving and applies the
// view in which it owns nothing: peers take its shards as soon as the
// announcement reaches them (a gossip round), and this node claims no more
// rows. The announcement comes before the in-flight deliveries drain, so
// the shards are never owned but unclaimed during a rolling restart. The
// handoff loop, woken by the new view, starts moving the rows held here
// while the dispatcher drains.
func (n *Node) announceLeaving(ctx context.Context) error {
	n.api.RefuseAppends()
	if ctx.Err() != nil {
		return nil
	}
	err := n.cl.SetLeaving(ctx)
	n.applySnapshot(n.cl.Snapshot())
	if err != nil {
		return fmt.Errorf("mark leaving: %w", err)
	}
	return nil
}

// drainDeliveries lets in-flight deliveries finish: at most half the time
// left of the grace (Shutdown), the rest being the hand-off's before a
// leave says it is late; then the dispatcher's loop is cancelled, which
// abandons what is still in flight (re-armed on the next start, or
// delivered by the new owner after its visibility timeout).
func (n *Node) drainDeliveries(ctx context.Context) error {
	if ctx.Err() != nil {
		return nil // hard stop: the loop's cancellation abandons them
	}
	if p := n.graceEnd.Load(); p != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, time.Now().Add(time.Until(*p)/2))
		defer cancel()
	}
	return n.disp.Drain(ctx)
}

// stopReplication is the final drain of a graceful stop: rows sent here
// from now on could outlive it, so the intake closes first (peers keep
// such rows on the other replicas) once the writes already admitted have
// finished; then every row held here is handed to its shard's replica set
// (this node is in none: it is leaving) and deleted once the set's
// members confirmed holding it (Drain: at once when no other member can
// take them; they stay on disk). The replicator's loops, state shipping
// included, run until this returns. A hard stop hands nothing over.
func (n *Node) stopReplication(ctx context.Context) error {
	if ctx.Err() != nil {
		return nil
	}
	var errs []error
	if err := n.api.CloseIntake(ctx); err != nil {
		errs = append(errs, fmt.Errorf("close intake: %w", err))
	}
	late := make(chan struct{})
	defer close(late)
	go n.reportLateLeave(late)
	if err := n.repl.Drain(ctx); err != nil {
		errs = append(errs, fmt.Errorf("drain on shutdown: %w", err))
	}
	return errors.Join(errs...)
}

// lateLeaveEvery is how often a leave past its grace logs its progress.
const lateLeaveEvery = 10 * time.Second

// reportLateLeave logs, once the grace has passed and then every
// lateLeaveEvery until done closes, that the leave goes on and what it
// still has to hand off.
func (n *Node) reportLateLeave(done <-chan struct{}) {
	wait := lateLeaveEvery
	if p := n.graceEnd.Load(); p != nil {
		wait = max(time.Until(*p), 0)
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		st := n.repl.Status().Leave
		if st == nil {
			st = &api.LeaveStatus{}
		}
		n.log.Warn("leave incomplete after --shutdown-grace: still handing off the rows held here; the node keeps serving until every one is held elsewhere (a second signal exits now and keeps them on disk)",
			"shards_left", st.ShardsLeft, "rows_handed_off", st.RowsHandedOff, "last_error", st.LastError, "stranded_rows", st.StrandedRows)
		t.Reset(lateLeaveEvery)
	}
}
