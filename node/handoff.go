package node

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/transfer"
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
	// One pass at a time: Shutdown's drain waits for a pass of the loop to
	// finish its batch instead of interleaving with it.
	select {
	case n.handoffSem <- struct{}{}:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	defer func() { <-n.handoffSem }()
	// Marks whose release failed earlier are released first, whether or not
	// any row moves in this pass: their shard may be owned here again (its
	// rows must become claimable) or have no live owner.
	if err := n.mover.RetryStranded(ctx); err != nil {
		return 0, fmt.Errorf("release rows left in transfer: %w", err)
	}
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

// MaxHandoffBatchBytes is the largest --handoff-batch-bytes: a handoff call
// then holds at most this many row bytes plus one row, which fits
// MaxHandoffBodyBytes as JSON (base64 payloads grow by a third).
const MaxHandoffBatchBytes = 32 << 20

// MaxHandoffBodyBytes is the body limit of the internal handoff route.
const MaxHandoffBodyBytes = 64 << 20

// handoffTo moves the transferable rows of shards (all owned by owner) to
// it through the node's transfer.Mover: batches gathered across shards
// (so a node holding a few rows in each of hundreds of shards makes a few
// calls, not hundreds), bounded by --handoff-batch rows and
// --handoff-batch-bytes, each marked in transfer, sent in one call, and
// deleted after the owner's durable ack, or unmarked when the call failed
// (which ends this owner's turn). Releases that fail are retried by the
// Mover before its next batch. It returns the rows moved and the first
// error.
func (n *Node) handoffTo(ctx context.Context, owner, addr string, shards []uint32) (int, error) {
	st, err := n.mover.Move(ctx, peerSink{peers: n.peers, addr: addr}, shards)
	n.m.handoffSent.Add(float64(st.Rows))
	if st.Rows > 0 {
		n.log.Debug("handed off rows", "to", owner, "rows", st.Rows, "batches", st.Batches, "bytes", st.Bytes)
	}
	if err != nil {
		n.m.handoffErrors.Inc()
		return st.Rows, fmt.Errorf("to %s: %w", owner, err)
	}
	return st.Rows, nil
}

// peerSink is a transfer.Sink on another node: one POST of a batch to its
// internal handoff route, answered once the rows are durable there.
type peerSink struct {
	peers *peerClient
	addr  string
}

// Merge sends rows to the peer's /internal/v1/handoff in the binary batch
// encoding (transfer.EncodeBatch) and returns its merge counts. The call is
// bounded by 30 s (a batch is at most --handoff-batch-bytes plus one row).
func (p peerSink) Merge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
	var resp handoffResp
	callCtx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	body := transfer.EncodeBatch(make([]byte, 0, transfer.EncodedSize(rows)), rows)
	err := p.peers.callBody(callCtx, http.MethodPost, p.addr, "/internal/v1/handoff", transfer.ContentType, body, &resp)
	return resp, err
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
