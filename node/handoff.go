package node

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// handoffLoop moves rows this node holds for shards it does not own to
// their owners: on every ownership change and every HandoffInterval.
func (n *Node) handoffLoop(ctx context.Context) {
	t := time.NewTicker(n.cfg.HandoffInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-n.handoffWake:
		}
		if n.draining.Load() {
			continue // Shutdown drives the handoff itself
		}
		if _, err := n.handoffOnce(ctx); err != nil && ctx.Err() == nil {
			n.log.Warn("handoff pass incomplete; retrying", "err", err)
		}
	}
}

// handoffOnce runs one pass: for each non-owned shard holding rows here,
// send bounded batches to the shard's owner (mark in-transfer, send, delete
// after the owner's durable ack; unmark on failure). It returns the rows
// moved and the first error; other shards still get their turn.
func (n *Node) handoffOnce(ctx context.Context) (int, error) {
	foreign, err := n.store.ForeignShards(ctx)
	if err != nil {
		return 0, fmt.Errorf("list foreign shards: %w", err)
	}
	n.m.handoffShardsPending.Set(float64(len(foreign)))
	moved := 0
	var firstErr error
	for _, shard := range foreign {
		snap := n.cl.Snapshot()
		owner, ok := snap.Owner(shard)
		if !ok || owner.Name == n.name || owner.APIAddr == "" {
			continue // no live owner (or it is us again): keep the rows
		}
		for ctx.Err() == nil {
			rows, err := n.store.BeginTransfer(ctx, shard, n.cfg.HandoffBatch)
			if err != nil {
				firstErr = cmpErr(firstErr, fmt.Errorf("shard %d: begin transfer: %w", shard, err))
				break
			}
			if len(rows) == 0 {
				break
			}
			keys := make([]string, len(rows))
			for i := range rows {
				keys[i] = rows[i].DispatchKey
			}
			var resp handoffResp
			callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
			err = n.peers.call(callCtx, "POST", owner.APIAddr, "/internal/v1/handoff", internalAppendReq{Rows: viewsOf(rows, "")}, &resp)
			cancel()
			if err != nil {
				if _, aerr := n.store.AbortTransfer(context.Background(), keys); aerr != nil {
					n.log.Error("abort transfer failed; marks clear on restart", "shard", shard, "err", aerr)
				}
				n.m.handoffErrors.Inc()
				firstErr = cmpErr(firstErr, fmt.Errorf("shard %d to %s: %w", shard, owner.Name, err))
				break
			}
			if _, err := n.store.CompleteTransfer(context.Background(), keys); err != nil {
				firstErr = cmpErr(firstErr, fmt.Errorf("shard %d: delete handed-off rows: %w", shard, err))
				break
			}
			moved += len(rows)
			n.m.handoffSent.Add(float64(len(rows)))
			n.log.Debug("handed off rows", "shard", shard, "to", owner.Name, "rows", len(rows))
		}
	}
	return moved, firstErr
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// drainHandoff repeats handoff passes until no transferable row of a
// non-owned shard is left here or ctx ends; it returns how many shards
// still hold rows. When no other member owns any of those shards (this is
// the last active node) nobody can take them: it returns at once with a
// nil error and the rows stay on disk for the next start.
func (n *Node) drainHandoff(ctx context.Context) (int, error) {
	for {
		if _, err := n.handoffOnce(ctx); err != nil {
			n.log.Warn("handoff pass during shutdown failed; retrying", "err", err)
		}
		foreign, err := n.store.ForeignShards(ctx)
		if err != nil {
			return -1, err
		}
		if len(foreign) == 0 {
			return 0, nil
		}
		if !n.anyOwner(foreign) {
			n.log.Warn("no other member owns the shards this node holds rows of; they stay on disk and move once a node owns them",
				"shards", len(foreign))
			return len(foreign), nil
		}
		select {
		case <-ctx.Done():
			return len(foreign), errors.Join(ctx.Err(), fmt.Errorf("%d shards still hold rows", len(foreign)))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// anyOwner reports whether some shard of shards has a live owner other
// than this node that handoff could send to.
func (n *Node) anyOwner(shards []uint32) bool {
	snap := n.cl.Snapshot()
	for _, shard := range shards {
		if owner, ok := snap.Owner(shard); ok && owner.Name != n.name && owner.APIAddr != "" {
			return true
		}
	}
	return false
}
