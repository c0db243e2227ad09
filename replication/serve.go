package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/outbox"
)

// The receiving side of the Peers calls, as local methods; Handler maps
// them to HTTP. Each is what this node answers another member.

// AcceptForward is the coordinator side of Peers.Forward: rows arrive with
// delays (VisibleAfter − CreatedAt) and are stamped by this node's clock,
// then written (Write).
func (r *Replicator) AcceptForward(ctx context.Context, rows []outbox.Row) ([]Outcome, error) {
	now := r.cfg.Now().UTC()
	for i := range rows {
		delay := max(rows[i].VisibleAfter.Sub(rows[i].CreatedAt), 0)
		rows[i].CreatedAt = now
		rows[i].VisibleAfter = now.Add(delay)
	}
	return r.Write(ctx, rows)
}

// AcceptAppend is the backup side of Peers.Append: the coordinator's new
// rows, stored with insert-or-ignore.
func (r *Replicator) AcceptAppend(ctx context.Context, rows []outbox.Row) ([]outbox.AppendOutcome, error) {
	out, err := r.cfg.Local.Append(ctx, rows)
	if err == nil && r.cfg.Wake != nil {
		r.cfg.Wake()
	}
	return out, err
}

// AcceptMerge is the receiving side of Peers.Merge.
func (r *Replicator) AcceptMerge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
	res, err := localSink{r}.Merge(ctx, rows)
	if err == nil {
		r.m.received.Add(float64(len(rows)))
	}
	return res, err
}

// States answers Peers.States: this node's digest and sync state of
// shards; with none asked, of every shard it holds rows of or replicates.
func (r *Replicator) States(ctx context.Context, shards []uint32) (StatesReply, error) {
	// The order is the handover fence (handover.go): the view under r.mu
	// (so its claim scope is applied), then the claims (the store waits
	// for a claim transaction that read an older scope), then the changes
	// being committed or shipped (a settle marks its shard before its
	// commit and unmarks it after queueing the change). A row settled
	// after the claims were read is thus seen as unshipped.
	r.mu.Lock()
	v := r.view.Load()
	r.mu.Unlock()
	rep := StatesReply{Node: r.cfg.Self, Joined: v != nil}
	digests, err := r.localDigests(ctx)
	if err != nil {
		return rep, err
	}
	if shards == nil {
		seen := map[uint32]bool{}
		for s := range digests {
			seen[s] = true
		}
		for s := range r.cfg.ShardCount {
			if v != nil && v.inSet(v.Self, s) {
				seen[s] = true
			}
		}
		for s := range seen {
			shards = append(shards, s)
		}
	}
	shards = slices.Clone(shards)
	slices.Sort(shards)
	shards = slices.Compact(shards)
	claimed, err := r.cfg.Local.ClaimedByShard(ctx)
	if err != nil {
		return rep, err
	}
	unshipped := r.ship.pendingShards()
	r.mu.Lock()
	defer r.mu.Unlock()
	isolated := v != nil && r.aloneAfterPeersLocked(v)
	rep.States = make([]ShardState, 0, len(shards))
	for _, s := range shards {
		if s >= r.cfg.ShardCount {
			continue
		}
		d := digests[s]
		st := ShardState{Shard: s, Rows: d.Rows, Sum: d.Sum, Claimed: claimed[s], Unshipped: unshipped[s]}
		if v != nil && !v.Leaving && v.inSet(v.Self, s) {
			// Asked by a peer while its view is alone after having had
			// peers: it is about to rejoin and its copy may be stale
			// (Apply's rejoined): not a synced source for anyone.
			st.Replica, st.Synced = true, r.syncs.synced[s] && !isolated
		}
		if v != nil {
			st.Primary = v.primary(s)
		}
		rep.States = append(rep.States, st)
	}
	return rep, nil
}

// ReadShardsCopy answers Peers.ReadShards: copy reads (never marking) of
// reads in order, sharing maxRows and maxBytes (≤ 0: Limits).
func (r *Replicator) ReadShardsCopy(ctx context.Context, reads []outbox.ShardRead, maxRows, maxBytes int) ([]outbox.ShardPage, error) {
	if maxRows <= 0 {
		maxRows = r.cfg.Limits.MaxRows
	}
	if maxBytes <= 0 {
		maxBytes = r.cfg.Limits.MaxBytes
	}
	var pages []outbox.ShardPage
	rows, size := 0, 0
	for _, p := range reads {
		if rows >= maxRows || size >= maxBytes {
			break
		}
		if p.Shard >= r.cfg.ShardCount {
			return nil, fmt.Errorf("shard %d ≥ shard count %d", p.Shard, r.cfg.ShardCount)
		}
		p.Mark, p.MaxRows, p.MaxBytes = false, maxRows-rows, maxBytes-size
		page, err := r.cfg.Local.ReadShard(ctx, p)
		if err != nil {
			return nil, fmt.Errorf("read shard %d: %w", p.Shard, err)
		}
		rows += len(page.Rows)
		size += bytesOf(page.Rows)
		pages = append(pages, page)
		if !page.Done && len(page.Rows) > 0 {
			break // the budget ran out inside this shard
		}
	}
	return pages, nil
}

// Keys answers Peers.Keys.
func (r *Replicator) Keys(ctx context.Context, shard uint32, after []byte, maxKeys int) (KeyPage, error) {
	if shard >= r.cfg.ShardCount {
		return KeyPage{}, fmt.Errorf("shard %d ≥ shard count %d", shard, r.cfg.ShardCount)
	}
	if maxKeys <= 0 || maxKeys > maxKeysPage {
		maxKeys = maxKeysPage
	}
	return r.localKeys(ctx, shard, after, maxKeys)
}

// RowsByKey answers Peers.Rows: the rows of keys held here, read in order
// until maxBytes of rows were gathered (at least one key examined), and
// how many keys were examined.
func (r *Replicator) RowsByKey(ctx context.Context, keys []string, maxBytes int) ([]outbox.Row, int, error) {
	if maxBytes <= 0 {
		maxBytes = r.cfg.Limits.MaxBytes
	}
	var out []outbox.Row
	size := 0
	for i, k := range keys {
		if i > 0 && size >= maxBytes {
			return out, i, nil
		}
		row, err := r.cfg.Local.Get(ctx, k)
		if errors.Is(err, outbox.ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, 0, err
		}
		out = append(out, row)
		size += outbox.RowBytes(&row)
	}
	return out, len(keys), nil
}

// MissingOf answers Peers.Missing.
func (r *Replicator) MissingOf(ctx context.Context, kvs []KeyVersion) (MissingReply, error) {
	rep := MissingReply{Need: []int{}, Synced: map[uint32]bool{}}
	for i, kv := range kvs {
		kv.Shard = r.shardOf(kv.Key)
		row, err := r.cfg.Local.Get(ctx, kv.Key)
		switch {
		case errors.Is(err, outbox.ErrNotFound):
			rep.Need = append(rep.Need, i)
		case err != nil:
			return rep, err
		case compareKV(kv, keyVersionOf(&row)) > 0:
			rep.Need = append(rep.Need, i)
		}
		if _, ok := rep.Synced[kv.Shard]; !ok {
			rep.Synced[kv.Shard] = false
		}
	}
	v := r.view.Load()
	r.mu.Lock()
	for s := range rep.Synced {
		rep.Synced[s] = v != nil && !v.Leaving && v.inSet(v.Self, s) && r.syncs.synced[s]
	}
	r.mu.Unlock()
	return rep, nil
}

// Status returns this node's replication state (GET /v1/cluster's
// "replication").
func (r *Replicator) Status() api.ReplicationStatus {
	v := r.view.Load()
	st := api.ReplicationStatus{PendingChanges: r.ship.pending()}
	if v == nil {
		return st
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st.Factor, st.Copies, st.WriteCopies = v.Factor, v.copies(), r.writeCopiesLocked(v)
	for s := range r.cfg.ShardCount {
		if v.inSet(v.Self, s) && !v.Leaving {
			st.ReplicaShards++
			if !r.syncs.synced[s] {
				st.SyncingShards++
			}
		}
	}
	st.UnderReplicatedShards, st.UnderReplicatedRows, st.PolledAt = r.repairs.under.shards, r.repairs.under.rows, r.repairs.under.at
	st.HandoverShards = len(r.handovers.since)
	st.Leave = r.leaveStatus(v)
	st.UnderReplicated = st.Copies < st.Factor || st.UnderReplicatedShards > 0
	return st
}

// ShardStatus asks every replica of shard for its state, live (GET
// /v1/shards/{shard}); an error for a shard out of range or a failed read
// of the local digest.
func (r *Replicator) ShardStatus(ctx context.Context, shard uint32) (api.ShardStatus, error) {
	v := r.view.Load()
	out := api.ShardStatus{Shard: shard, Replicas: []api.ReplicaStatus{}}
	if shard >= r.cfg.ShardCount {
		return out, fmt.Errorf("shard %d ≥ shard count %d", shard, r.cfg.ShardCount)
	}
	d, err := r.cfg.Local.ShardDigest(ctx, shard)
	if err != nil {
		return out, err
	}
	out.HeldHere = d.Rows
	if v == nil {
		return out, nil
	}
	out.InSync = len(v.set(shard)) > 0
	for i, m := range v.set(shard) {
		rs := api.ReplicaStatus{Node: m, Role: "backup"}
		if i == 0 {
			rs.Role = "primary"
		}
		var rep StatesReply
		var err error
		if m == v.Self {
			rep, err = r.States(ctx, []uint32{shard})
		} else {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			rep, err = r.cfg.Peers.States(cctx, v.Addrs[m], []uint32{shard})
			cancel()
		}
		if err == nil {
			st, _ := stateOf(rep, shard)
			rs.Reachable, rs.Synced, rs.Rows, rs.Digest = true, st.Synced && rep.Joined, st.Rows, st.Sum
		}
		if !rs.Reachable || !rs.Synced || (len(out.Replicas) > 0 && (rs.Rows != out.Replicas[0].Rows || rs.Digest != out.Replicas[0].Digest)) {
			out.InSync = false
		}
		out.Replicas = append(out.Replicas, rs)
	}
	return out, nil
}
