package node

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/fairshard/fairshard/outbox"
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

// handoffOnce runs one pass: it groups the non-owned shards holding rows
// here by their owner and hands each owner its rows (handoffTo). It
// returns the rows moved and the first error; other owners still get their
// turn.
func (n *Node) handoffOnce(ctx context.Context) (int, error) {
	// One pass at a time: Shutdown's drain must not race a pass of the loop
	// whose rows are marked in-transfer (and so invisible to ForeignShards).
	select {
	case n.handoffSem <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-n.handoffSem }()
	foreign, err := n.store.ForeignShards(ctx)
	if err != nil {
		return 0, fmt.Errorf("list foreign shards: %w", err)
	}
	n.m.handoffShardsPending.Set(float64(len(foreign)))
	snap := n.ownership()
	type dest struct {
		addr   string
		shards []uint32
	}
	byOwner := map[string]*dest{}
	var owners []string
	for _, shard := range foreign {
		owner, ok := snap.Owner(shard)
		if !ok || owner.Name == n.name || owner.APIAddr == "" {
			continue // no live owner (or it is us again): keep the rows
		}
		d := byOwner[owner.Name]
		if d == nil {
			d = &dest{addr: owner.APIAddr}
			byOwner[owner.Name] = d
			owners = append(owners, owner.Name)
		}
		d.shards = append(d.shards, shard)
	}
	moved := 0
	var firstErr error
	for _, name := range owners {
		m, err := n.handoffTo(ctx, name, byOwner[name].addr, byOwner[name].shards)
		moved += m
		firstErr = cmpErr(firstErr, err)
	}
	return moved, firstErr
}

// handoffTo sends the transferable rows of shards (all owned by owner) in
// batches of up to HandoffBatch rows gathered across shards, so a node
// holding a few rows in each of hundreds of shards makes a few calls, not
// hundreds: each batch is marked in transfer shard by shard, sent in one
// call, and deleted after the owner's durable ack, or unmarked when the
// call failed (which ends this owner's turn). It returns the rows moved and
// the first error.
func (n *Node) handoffTo(ctx context.Context, owner, addr string, shards []uint32) (int, error) {
	moved := 0
	var firstErr error
	for len(shards) > 0 && ctx.Err() == nil {
		var batch []outbox.Row
		nShards := 0
		for len(shards) > 0 && len(batch) < n.cfg.HandoffBatch {
			want := n.cfg.HandoffBatch - len(batch)
			rows, err := n.store.BeginTransfer(ctx, shards[0], want)
			if err != nil {
				firstErr = cmpErr(firstErr, fmt.Errorf("shard %d: begin transfer: %w", shards[0], err))
				shards = shards[1:]
				continue
			}
			if len(rows) > 0 {
				nShards++
			}
			if len(rows) < want {
				shards = shards[1:] // nothing more to send of this shard
			}
			batch = append(batch, rows...)
		}
		if len(batch) == 0 {
			break
		}
		keys := make([]string, len(batch))
		for i := range batch {
			keys[i] = batch[i].DispatchKey
		}
		var resp handoffResp
		callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
		// Marked rows are invisible to ForeignShards: count their shards as
		// pending until the batch is settled either way.
		n.inTransferShards.Store(int64(nShards))
		err := n.peers.call(callCtx, "POST", addr, "/internal/v1/handoff", internalAppendReq{Rows: viewsOf(batch, "")}, &resp)
		cancel()
		if err != nil {
			defer n.inTransferShards.Store(0)
			if _, aerr := n.store.AbortTransfer(context.Background(), keys); aerr != nil {
				n.log.Error("abort transfer failed; marks clear on restart", "to", owner, "rows", len(batch), "err", aerr)
			}
			n.m.handoffErrors.Inc()
			return moved, cmpErr(firstErr, fmt.Errorf("%d rows of %d shards to %s: %w", len(batch), nShards, owner, err))
		}
		_, err = n.store.CompleteTransfer(context.Background(), keys)
		n.inTransferShards.Store(0)
		if err != nil {
			return moved, cmpErr(firstErr, fmt.Errorf("delete %d rows handed off to %s: %w", len(batch), owner, err))
		}
		moved += len(batch)
		n.m.handoffSent.Add(float64(len(batch)))
		n.log.Debug("handed off rows", "to", owner, "rows", len(batch), "shards", nShards)
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
	snap := n.ownership()
	for _, shard := range shards {
		if owner, ok := snap.Owner(shard); ok && owner.Name != n.name && owner.APIAddr != "" {
			return true
		}
	}
	return false
}
