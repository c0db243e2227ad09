package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/fairshard/fairshard/cluster"
)

// Start starts the node's services in their declared order (services.go):
// it serves the API, starts the cluster's join loop, applies ownership and
// joins the seeds, then starts the config watcher, the stats, slot-lease
// and tombstone loops, handoff and the dispatcher, and marks the node
// ready. With --join seeds it first waits, up to JoinWait, for a seed to
// answer (awaitFirstJoin): the node owns no shard meanwhile, so it cannot
// claim with a solo view. The cluster's join loop keeps re-joining missing
// seeds until the node stops. ctx bounds that wait: if it ends first, Start
// returns its error and the node never becomes ready; so does a cluster
// that refuses the node (another --shards, or its name used by a live
// member). After an error the caller must Close. The node is ready (GET
// /readyz) once Start has returned nil and the cluster has accepted it
// (awaitAccepted).
func (n *Node) Start(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("start %s: %w", n.name, err)
	}
	if err := n.svc.Start(ctx); err != nil {
		return err
	}
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
		n.seeds.awaiting.Store(false)
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
	var tally joinTally
	for {
		done := make(chan result, 1)
		n.seeds.attempts.Go(func() {
			c, err := n.cl.Join(context.Background(), n.cfg.Join...)
			done <- result{c, err}
		})
		var res result
		select {
		case res = <-done:
			tally.record(res.err)
		case <-wctx.Done():
			// The attempt in flight has no outcome yet: it neither adds
			// to nor clears the run of failed state exchanges.
			res.err = wctx.Err()
		}
		switch {
		case res.err == nil && res.contacted > 0:
			n.log.Info("joined cluster", "seeds_contacted", res.contacted)
			return n.awaitAccepted(ctx, wctx)
		case errors.Is(res.err, cluster.ErrNameConflict):
			return fmt.Errorf("the cluster at %v refused this node: %w", n.cfg.Join, res.err)
		case errors.Is(res.err, cluster.ErrNoPeers) && literalSeeds:
			n.log.Info("no other seed: starting as the cluster's first node", "join", n.cfg.Join)
			n.cl.AcceptAlone()
			return nil
		case errors.Is(res.err, cluster.ErrShardCountMismatch):
			return fmt.Errorf("the cluster at %v refused this node: its --shards %d differs from the cluster's (every node must use the same shard count): %w",
				n.cfg.Join, n.cfg.Shards, res.err)
		case errors.Is(res.err, cluster.ErrProtocolMismatch):
			return fmt.Errorf("the cluster at %v refused this node: it speaks another protocol version: %w", n.cfg.Join, res.err)
		}
		if ctx.Err() != nil {
			return fmt.Errorf("start %s: stopped while joining %v: %w", n.name, n.cfg.Join, ctx.Err())
		}
		select {
		case <-wctx.Done():
			if ctx.Err() != nil {
				return fmt.Errorf("start %s: stopped while joining %v: %w", n.name, n.cfg.Join, ctx.Err())
			}
			if tally.refusedByExchange() {
				// Someone is there, but the push/pull with it fails: serving
				// alone would own every shard beside a live cluster, without
				// its config (pauses, quotas).
				return fmt.Errorf("the cluster at %v answered but this node could not exchange state with it for %v (check --gossip-key; see the node log): %w",
					n.cfg.Join, n.cfg.JoinWait, tally.last)
			}
			n.log.Warn("no seed answered; serving alone until one does", "join", n.cfg.Join, "waited", n.cfg.JoinWait, "err", res.err)
			n.cl.AcceptAlone()
			return nil
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// joinTally counts the completed join attempts of awaitFirstJoin that
// reached a seed but failed its state exchange (cluster.ErrStateExchange),
// in an unbroken run: any other completed outcome (no seed answered, a
// join) ends the run. An attempt still in flight when the join wait ends
// is not recorded: under load the last attempt is often cut off by the
// wait, and counting it as "no seed answered" would let a node that failed
// every exchange serve alone beside a live cluster.
type joinTally struct {
	exchangeFailures int   // the current run's length
	last             error // the run's last error; nil when the run is empty
}

// record adds one completed attempt's outcome (err nil: it joined).
func (t *joinTally) record(err error) {
	if errors.Is(err, cluster.ErrStateExchange) {
		t.exchangeFailures++
		t.last = err
		return
	}
	t.exchangeFailures, t.last = 0, nil
}

// refusedByExchange reports whether the run is long enough to say a
// cluster is there but will not exchange state with this node: two
// attempts, since one alone may be a seed caught shutting down.
func (t *joinTally) refusedByExchange() bool { return t.exchangeFailures >= 2 }

// awaitAccepted waits, within the join wait (wctx), until the cluster
// accepts this node (cluster.Accepted: every peer holds it at its own
// address) or refuses it: another live node uses its name, an error that
// stops the start (the process exits non-zero). If the wait ends first (the
// peers still hold this name at a dead earlier address until they reclaim
// it, 30 s after its death with the LAN profile), Start goes on: the node
// serves appends by forwarding them, owns no shard and is not ready until
// it is accepted; a refusal after that reaches Failed.
func (n *Node) awaitAccepted(ctx, wctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for !n.cl.Accepted() {
		select {
		case <-n.cl.Refused():
			return fmt.Errorf("the cluster at %v refused this node: %w", n.cfg.Join, n.cl.RefusedErr())
		case <-wctx.Done():
			if ctx.Err() != nil {
				return fmt.Errorf("start %s: stopped while waiting for the cluster to accept it: %w", n.name, ctx.Err())
			}
			n.log.Warn("joined, but the cluster has not accepted this node yet (does it still hold this node's name at an earlier address?): it owns no shards and is not ready until it does",
				"waited", n.cfg.JoinWait)
			return nil
		case <-t.C:
		}
	}
	return nil
}

// Failed returns a channel that receives an error when the node can no
// longer serve and its process should stop with a non-zero status: the
// cluster refused it after Start returned (another live node uses its
// name). It never receives before Start and at most once.
func (n *Node) Failed() <-chan error { return n.failed }

// applySnapshot makes s the node's applied ownership view: it hands s's
// replica sets to the replicator, which scopes the store's claims to the
// shards this node is primary of in s and holds a synced copy of
// (setClaimScope), then publishes s as the view every other consumer
// reads (ownership: the planner's ceilings, the admin views), and wakes
// the dispatcher. So claim scope and ceilings always come from the same
// snapshot. Views are applied in version order: an older snapshot that
// loses a race with a newer one is ignored. Before the first join the node
// owns nothing (s.OwningNothing) and the replicator gets no view (appends
// answer 503 meanwhile).
func (n *Node) applySnapshot(s *cluster.OwnershipSnapshot) {
	if s == nil {
		return
	}
	n.view.mu.Lock()
	defer n.view.mu.Unlock()
	if cur := n.view.applied.Load(); cur != nil && s.Version < cur.Version {
		return
	}
	if n.seeds.awaiting.Load() {
		s = s.OwningNothing()
		n.store.SetOwnedShards(s.Owned)
	} else {
		n.repl.Apply(viewOf(s))
	}
	n.updateTerms(s)
	n.view.applied.Store(s)
	n.disp.Wake()
}

// ownership returns the node's applied ownership view (applySnapshot):
// the one snapshot claim scope, ceilings, append routing and handoff all
// read. Never nil after New.
func (n *Node) ownership() *cluster.OwnershipSnapshot { return n.view.applied.Load() }

// Ready reports whether the node serves: store open and able to commit
// (storeWritable: false after a failed commit or fsync, a full disk, until
// the store has reopened its file), cluster joined and accepted (it may
// own shards: a node whose name its peers still hold at another address
// is not ready), ownership applied, not draining.
func (n *Node) Ready() bool {
	return n.ready.Load() && !n.api.Draining() && n.ownership().Accepted && n.storeWritable() == nil
}

// Shutdown stops the node gracefully: its services stop in the reverse of
// their start order (services.go): refuse new appends and announce that
// this node is leaving (peers take its shards after a gossip round; it
// stops claiming, and starts handing off the rows it holds), let in-flight
// deliveries finish (at most half of Config.ShutdownGrace, or of the time
// ctx leaves if that is shorter), refuse rows from peers and wait for the
// writes in progress, wait until every row held here is held by its
// shard's replica set, leave the gossip, stop serving, close the store.
//
// A leave completes or does not happen: the hand-off has no deadline of
// its own. Past ShutdownGrace the node logs that the leave is incomplete
// and why (and /v1/cluster shows replication.leave), and goes on serving
// and handing off until it is done. Only ctx ending (a second signal, a
// caller's deadline) cuts it short: what was not handed off then stays on
// disk and moves when the node returns. It returns every step's failure,
// each naming its service.
func (n *Node) Shutdown(ctx context.Context) error {
	grace := time.Now().Add(n.cfg.ShutdownGrace)
	if dl, ok := ctx.Deadline(); ok && dl.Before(grace) {
		grace = dl
	}
	n.graceEnd.Store(&grace)
	err := n.svc.Stop(ctx)
	if err == nil {
		n.log.Info("node stopped gracefully")
	}
	return err
}

// Close stops the node at once: the same walk as Shutdown with no grace,
// so loops end, in-flight deliveries are abandoned (their claims are
// re-armed on the next start), nothing is handed off, memberlist shuts
// down without a leave, and the store closes. It returns what failed
// releasing resources (cluster shutdown, store close). Idempotent; after
// Shutdown it returns Shutdown's release errors.
func (n *Node) Close() error {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_ = n.svc.Stop(ctx)
	return n.releaseErrs.get()
}

// released records what failed releasing a resource, for Close.
func (n *Node) released(err error) error {
	n.releaseErrs.add(err)
	return err
}

// errorSet collects errors from concurrent callers.
type errorSet struct {
	mu  sync.Mutex
	err error
}

// add joins err (nil is ignored) to what s holds.
func (s *errorSet) add(err error) {
	if err != nil {
		s.mu.Lock()
		s.err = errors.Join(s.err, err)
		s.mu.Unlock()
	}
}

// get returns what s holds: nil, or the errors joined.
func (s *errorSet) get() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}
