package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/transfer"
)

// syncState is what shard sync knows of the copies; Replicator.mu guards
// it.
type syncState struct {
	// synced[s]: this node is a replica of s and counts as a synced copy.
	synced []bool
	// peerStates holds the latest States answer of each peer (primary
	// polls and sync rounds), for the under-replication figures and the
	// leftover drop.
	peerStates map[string]peerState
	// tokens keeps the resume token of an interrupted bulk copy, per
	// (shard, source).
	tokens map[syncKey][]byte
}

// Shard sync: a node that joins a shard's replica set (a new member, a
// restart, a set change) copies the shard before it counts as a copy and
// before, as primary, it claims from it. Every sync round:
//
//  1. asks every live peer for its state of the shards still to sync
//     (States: digest, replica, synced);
//  2. per shard, picks the sources: a synced replica if one answered (the
//     primary first), else every peer holding rows of the shard (after a
//     whole-cluster restart nobody is synced yet: the union of the copies
//     is);
//  3. pulls from each source whose digest differs from ours: the whole
//     shard, streamed in pages (transfer.Copy), when we hold none of it,
//     else a key/version comparison (diff) exchanging only what differs,
//     in both directions;
//  4. marks the shard synced once every source succeeded, unless a
//     replica of the set did not answer (it may hold rows nobody else
//     has): then the shard is retried.
//
// Rows that change while a copy runs reach us by the write path and the
// state shipping (we are in the set already); the digest polls repair the
// rest.

func (r *Replicator) syncLoop(ctx context.Context) error {
	for {
		if !r.syncRound(ctx) {
			if !sleep(ctx, r.cfg.SyncRetry, r.syncWake) {
				return nil
			}
			continue
		}
		if !sleep(ctx, time.Hour, r.syncWake) {
			return nil
		}
	}
}

// toSync lists the shards this node replicates and has not synced.
func (r *Replicator) toSync(v *View) []uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []uint32
	if v.Leaving {
		return nil
	}
	for s := range r.cfg.ShardCount {
		if !r.syncs.synced[s] && v.inSet(v.Self, s) {
			out = append(out, s)
		}
	}
	return out
}

// syncRound syncs every shard still to sync; it reports whether all are
// synced now (false: retry after SyncRetry).
func (r *Replicator) syncRound(ctx context.Context) bool {
	v := r.view.Load()
	if v == nil {
		return true
	}
	need := r.toSync(v)
	if len(need) == 0 {
		return true
	}
	states := r.gatherStates(ctx, v, v.peers(), need)
	mine, err := r.localDigests(ctx)
	if err != nil {
		r.log.Warn("shard sync: read local digests", "err", err)
		return false
	}
	// Under-replicated shards first: after a member loss they have one
	// copy left, and each second they wait is exposure to a second loss.
	need = urgentFirst(v, need, states)
	// Shards we hold none of, with one synced source, are copied in bulk
	// (a stream per source); the rest one at a time.
	bulk := map[string][]uint32{}
	var each []uint32
	for _, s := range need {
		src, theirs, ok := r.bulkSource(v, s, states)
		if ok && mine[s].Rows == 0 && theirs.Rows > 0 {
			bulk[src] = append(bulk[src], s)
		} else {
			each = append(each, s)
		}
	}
	var mu sync.Mutex
	failed := 0
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(r.cfg.SyncConcurrency)
	for src, list := range bulk {
		g.Go(func() error {
			n, err := r.bulkCopy(gctx, v, src, list)
			if err != nil {
				mu.Lock()
				failed += n
				mu.Unlock()
				if gctx.Err() == nil {
					r.log.Info("bulk shard sync incomplete; retrying", "from", src, "shards", len(list), "unfinished", n, "err", err)
				}
			}
			return nil
		})
	}
	for _, s := range each {
		if gctx.Err() != nil {
			break
		}
		if !r.replicatesNow(s) {
			// The view changed under the round (a rebalance, or this node
			// turned leaving): not pulled, the next round decides.
			mu.Lock()
			failed++
			mu.Unlock()
			continue
		}
		g.Go(func() error {
			if err := r.syncShard(gctx, v, s, mine[s], states); err != nil {
				mu.Lock()
				failed++
				mu.Unlock()
				if gctx.Err() == nil {
					r.log.Info("shard sync incomplete; retrying", "shard", s, "err", err)
				}
			}
			return nil
		})
	}
	_ = g.Wait()
	if failed == 0 && ctx.Err() == nil {
		wake(r.dropWake) // leftovers may wait for us
		wake(r.pollWake)
	}
	return failed == 0 && r.view.Load() == v
}

// urgentFirst orders shards to sync: first those with fewer than R copies
// elsewhere (R = min(Factor, members)): counting the peers that answered
// as a synced replica of the shard, or hold rows of it outside its set (a
// leftover copy, kept until the set is synced: a rebalance, not a loss).
// A shard this node joined because a member died has one copy left until
// this sync ends; one it joined on a rebalance has its old copy too. The
// order within each group is kept. It sorts need in place and returns it.
func urgentFirst(v *View, need []uint32, states map[string]StatesReply) []uint32 {
	want := min(max(v.Factor, 1), len(v.Addrs))
	urgent := func(shard uint32) bool {
		copies := 0
		for p, rep := range states {
			if p == v.Self || !rep.Joined {
				continue
			}
			st, _ := stateOf(rep, shard)
			if (st.Replica && st.Synced) || (!st.Replica && st.Rows > 0) {
				copies++
			}
		}
		return copies < want
	}
	slices.SortStableFunc(need, func(a, b uint32) int {
		ua, ub := urgent(a), urgent(b)
		switch {
		case ua == ub:
			return 0
		case ua:
			return -1
		}
		return 1
	})
	return need
}

// bulkSource returns the synced replica a shard would sync from (the
// first of the set, primary first, that answered synced) and its state.
func (r *Replicator) bulkSource(v *View, shard uint32, states map[string]StatesReply) (string, ShardState, bool) {
	for _, p := range v.set(shard) {
		if p == v.Self {
			continue
		}
		rep, ok := states[p]
		if !ok {
			continue
		}
		st, _ := stateOf(rep, shard)
		if rep.Joined && st.Replica && st.Synced {
			return p, st, true
		}
	}
	return "", ShardState{}, false
}

// gatherStates asks peers for their states of shards, concurrently, and
// records each answer (recordStates). A peer that did not answer is
// absent from the result.
func (r *Replicator) gatherStates(ctx context.Context, v *View, peers []string, shards []uint32) map[string]StatesReply {
	ask := make(map[string][]uint32, len(peers))
	for _, p := range peers {
		ask[p] = shards
	}
	out := r.askStates(ctx, v, ask)
	for p, rep := range out {
		r.recordStates(p, rep)
	}
	return out
}

// askStates asks each member of ask for its states of the shards listed
// for it: one States call per member, all at once, each bounded by
// CallTimeout. A member without an address in v, or that did not
// answer, is absent from the result.
func (r *Replicator) askStates(ctx context.Context, v *View, ask map[string][]uint32) map[string]StatesReply {
	out := map[string]StatesReply{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for p, shards := range ask {
		addr := v.Addrs[p]
		if addr == "" {
			continue
		}
		wg.Go(func() {
			cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
			defer cancel()
			rep, err := r.cfg.Peers.States(cctx, addr, shards)
			if err != nil {
				r.log.Debug("shard states of peer unavailable", "peer", p, "err", err)
				return
			}
			mu.Lock()
			out[p] = rep
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// recordStates keeps a peer's latest answer (merged over earlier ones),
// and the leftover copies it shows (shipper.holders).
func (r *Replicator) recordStates(peer string, rep StatesReply) {
	now := time.Now()
	r.ship.noteStates(r.view.Load(), peer, rep, now)
	r.mu.Lock()
	defer r.mu.Unlock()
	ps := r.syncs.peerStates[peer]
	if ps.states == nil {
		ps.states = map[uint32]ShardState{}
	}
	ps.at, ps.joined = now, rep.Joined
	for _, st := range rep.States {
		ps.states[st.Shard] = st
	}
	r.syncs.peerStates[peer] = ps
}

// localDigests returns this node's digest of every shard holding rows.
func (r *Replicator) localDigests(ctx context.Context) (map[uint32]outbox.ShardDigest, error) {
	ds, err := r.cfg.Local.ShardDigests(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[uint32]outbox.ShardDigest, len(ds))
	for _, d := range ds {
		out[d.Shard] = d
	}
	return out, nil
}

func stateOf(rep StatesReply, shard uint32) (ShardState, bool) {
	i, ok := slices.BinarySearchFunc(rep.States, shard, func(st ShardState, s uint32) int {
		return int(int64(st.Shard) - int64(s))
	})
	if !ok {
		return ShardState{Shard: shard}, false
	}
	return rep.States[i], true
}

// syncShard syncs one shard from the sources the states name (see the
// comment at the top of this file).
func (r *Replicator) syncShard(ctx context.Context, v *View, shard uint32, mine outbox.ShardDigest, states map[string]StatesReply) error {
	set := v.set(shard)
	var synced, holders []string
	missing := false
	order := append(slices.Clone(set), v.peers()...)
	seen := map[string]bool{v.Self: true}
	for _, p := range order {
		if seen[p] {
			continue
		}
		seen[p] = true
		rep, ok := states[p]
		if !ok {
			if slices.Contains(set, p) {
				missing = true
			}
			continue
		}
		st, _ := stateOf(rep, shard)
		if rep.Joined && st.Replica && st.Synced {
			synced = append(synced, p)
		}
		if st.Rows > 0 {
			holders = append(holders, p)
		}
	}
	sources := holders
	if len(synced) > 0 {
		sources = synced[:1]
	} else if missing {
		// No synced copy answered and a replica is silent: it may hold
		// what nobody else has. Take what the others hold meanwhile.
		for _, p := range holders {
			if err := r.pull(ctx, v, shard, p, &mine, stateMust(states[p], shard)); err != nil {
				return err
			}
		}
		return fmt.Errorf("shard %d: no synced replica answered and a replica of %v is unreachable", shard, set)
	}
	for _, p := range sources {
		if err := r.pull(ctx, v, shard, p, &mine, stateMust(states[p], shard)); err != nil {
			return err
		}
	}
	if !r.markSynced(v, shard) {
		return fmt.Errorf("shard %d: the view changed during the sync", shard)
	}
	return nil
}

func stateMust(rep StatesReply, shard uint32) ShardState {
	st, _ := stateOf(rep, shard)
	return st
}

// pull brings shard's rows held by peer here: nothing when the digests
// agree, the whole shard streamed when we hold none of it, else a
// key/version diff, which also pushes what the peer lacks when the peer is
// a replica of the shard. A peer outside the set (a leftover copy: a
// leaving node, a replica that left the set on a rebalance) is only
// pulled from: it takes no rows for the shard, and a leaving one refuses
// them, which would fail the sync, and the leave waiting for it, for good.
// *mine is updated to the local digest afterwards.
func (r *Replicator) pull(ctx context.Context, v *View, shard uint32, peer string, mine *outbox.ShardDigest, theirs ShardState) error {
	if theirs.Rows == mine.Rows && theirs.Sum == mine.Sum {
		return nil
	}
	addr := v.Addrs[peer]
	if mine.Rows == 0 {
		key := syncKey{shard, peer}
		r.mu.Lock()
		from := r.syncs.tokens[key]
		r.mu.Unlock()
		next, st, err := transfer.Copy(ctx, remoteReader{r: r, addr: addr}, pullSink{r: r}, shard, from, r.cfg.Limits)
		r.m.syncRows.WithLabelValues("bulk").Add(float64(st.Rows))
		r.m.syncBytes.WithLabelValues("bulk").Add(float64(st.Bytes))
		r.mu.Lock()
		if err != nil {
			r.syncs.tokens[key] = next
		} else {
			delete(r.syncs.tokens, key)
		}
		r.mu.Unlock()
		if err != nil {
			return fmt.Errorf("copy shard %d from %s: %w", shard, peer, err)
		}
		if st.Rows > 0 {
			r.log.Debug("shard copied", "shard", shard, "from", peer, "rows", st.Rows, "bytes", st.Bytes)
		}
	} else if !slices.Contains(v.set(shard), peer) {
		pulled, err := r.pullNewer(ctx, addr, shard)
		if err != nil {
			return fmt.Errorf("pull shard %d from %s (outside its set): %w", shard, peer, err)
		}
		if len(pulled) > 0 {
			r.log.Debug("shard pulled from a copy outside its set", "shard", shard, "from", peer, "pulled", len(pulled))
		}
	} else {
		pulled, pushed, err := r.diff(ctx, addr, shard)
		if err != nil {
			return fmt.Errorf("diff shard %d with %s: %w", shard, peer, err)
		}
		if pulled+pushed > 0 {
			r.log.Debug("shard diffed", "shard", shard, "with", peer, "pulled", pulled, "pushed", pushed)
		}
	}
	d, err := r.cfg.Local.ShardDigest(ctx, shard)
	if err != nil {
		return err
	}
	*mine = d
	return nil
}

// remoteReader reads a shard on a peer: a transfer.ShardReader for Copy.
type remoteReader struct {
	r    *Replicator
	addr string
}

func (rr remoteReader) ReadShard(ctx context.Context, p outbox.ShardRead) (outbox.ShardPage, error) {
	cctx, cancel := context.WithTimeout(ctx, rr.r.cfg.CallTimeout)
	defer cancel()
	pages, err := rr.r.cfg.Peers.ReadShards(cctx, rr.addr, []outbox.ShardRead{p}, p.MaxRows, p.MaxBytes)
	if err != nil {
		return outbox.ShardPage{Next: p.After}, err
	}
	if len(pages) != 1 {
		return outbox.ShardPage{Next: p.After}, fmt.Errorf("read of shard %d answered %d pages", p.Shard, len(pages))
	}
	return pages[0], nil
}

// localSink merges pages into the local store: a transfer.Sink.
type localSink struct{ r *Replicator }

func (ls localSink) Merge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
	res, err := ls.r.cfg.Local.Merge(ctx, rows)
	if err == nil && res.Created+res.Updated > 0 && ls.r.cfg.Wake != nil {
		ls.r.cfg.Wake()
	}
	return res, err
}

// errNoLongerReplica ends a pull (a sync, a repair, a handover's pull)
// once this node's current view no longer names it a replica of the
// shard, or names it leaving.
var errNoLongerReplica = errors.New("this node no longer replicates the shard by its current view (the view changed)")

// replicatesNow reports whether this node's current view names it a
// replica of shard and not leaving.
func (r *Replicator) replicatesNow(shard uint32) bool {
	cur := r.view.Load()
	return cur != nil && !cur.Leaving && cur.inSet(cur.Self, shard)
}

// pullSink merges rows this node pulled from a peer (a sync, a repair, a
// handover's pull) into the local store: only those of shards its current
// view still names it a replica of. The view may change while a pull is
// in flight, and a pull that went on would take copies this node no
// longer holds for anyone: a node that turned leaving would fill its disk
// with rows its drain must hand back, and never finish leaving. A
// leaving node refuses the whole page with errNoLongerReplica, which ends
// the pull. With skipped set (a bulk copy of many shards), rows of other
// shards are skipped (counted Skipped) and their shards recorded there:
// such a shard has a hole and must not be marked synced from this copy
// (a later view may name this node again). Without it (one shard's pull),
// any such row refuses the page.
type pullSink struct {
	r       *Replicator
	skipped map[uint32]bool
}

func (ps pullSink) Merge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
	cur := ps.r.view.Load()
	if cur == nil || cur.Leaving {
		return outbox.MergeResult{}, errNoLongerReplica
	}
	keep := rows
	for i := range rows {
		if !cur.inSet(cur.Self, rows[i].Shard) {
			if ps.skipped == nil {
				return outbox.MergeResult{}, fmt.Errorf("shard %d: %w", rows[i].Shard, errNoLongerReplica)
			}
			keep = make([]outbox.Row, 0, len(rows))
			for j := range rows {
				if cur.inSet(cur.Self, rows[j].Shard) {
					keep = append(keep, rows[j])
				} else {
					ps.skipped[rows[j].Shard] = true
				}
			}
			break
		}
	}
	if len(keep) == 0 {
		return outbox.MergeResult{Skipped: len(rows)}, nil
	}
	res, err := localSink{ps.r}.Merge(ctx, keep)
	res.Skipped += len(rows) - len(keep)
	return res, err
}

// maxKeysPage is the most key/versions one Keys call returns.
const maxKeysPage = 4000

// keyList reads every key/version of shard from read (local or remote
// pages), into a map by key.
func keyList(ctx context.Context, shard uint32, read func(ctx context.Context, after []byte) (KeyPage, error)) (map[string]KeyVersion, error) {
	out := map[string]KeyVersion{}
	var after []byte
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		page, err := read(ctx, after)
		if err != nil {
			return nil, err
		}
		for _, kv := range page.Keys {
			if old, ok := out[kv.Key]; !ok || compareKV(kv, old) > 0 {
				out[kv.Key] = kv
			}
		}
		if page.Done || len(page.Keys) == 0 && string(page.Next) == string(after) {
			return out, nil
		}
		after = page.Next
	}
}

// localKeys is one page of this node's key/version list of shard.
func (r *Replicator) localKeys(ctx context.Context, shard uint32, after []byte, maxKeys int) (KeyPage, error) {
	return readKeys(ctx, r.cfg.Local, shard, after, maxKeys, r.cfg.Limits.MaxBytes)
}

// readKeys reads up to maxKeys key/versions of shard from a store, in
// pages bounded by maxBytes of rows read.
func readKeys(ctx context.Context, st interface {
	ReadShard(context.Context, outbox.ShardRead) (outbox.ShardPage, error)
}, shard uint32, after []byte, maxKeys, maxBytes int) (KeyPage, error) {
	kp := KeyPage{Next: after}
	for len(kp.Keys) < maxKeys {
		page, err := st.ReadShard(ctx, outbox.ShardRead{Shard: shard, After: kp.Next, MaxRows: min(maxKeys-len(kp.Keys), 1000), MaxBytes: maxBytes})
		if err != nil {
			return KeyPage{}, err
		}
		for i := range page.Rows {
			kp.Keys = append(kp.Keys, keyVersionOf(&page.Rows[i]))
		}
		kp.Next = page.Next
		if page.Done || len(page.Rows) == 0 {
			kp.Done = true
			return kp, nil
		}
	}
	return kp, nil
}

// diff compares shard's key/version lists here and on the peer at addr
// and exchanges what differs: rows the peer holds newer (or alone) are
// fetched and merged here, rows held newer (or alone) here are merged on
// the peer. It returns the rows pulled and pushed.
func (r *Replicator) diff(ctx context.Context, addr string, shard uint32) (pulled, pushed int, err error) {
	keys, pushed, err := r.exchange(ctx, addr, shard, true)
	if v := r.view.Load(); v != nil && len(keys) > 0 {
		// A change learnt by repair (its shipment was lost) goes on to the
		// leftover holders known here too.
		r.ship.addLeftovers(v, keys)
	}
	return len(keys), pushed, err
}

// pullNewer is diff in one direction: it pulls the rows of shard whose
// version on the peer at addr is newer than ours (or that we lack) and
// pushes nothing (the handover's pull from a leftover copy, which is
// dropped once the set holds it). It returns the keys of the rows merged
// here.
func (r *Replicator) pullNewer(ctx context.Context, addr string, shard uint32) (pulled []string, err error) {
	pulled, _, err = r.exchange(ctx, addr, shard, false)
	return pulled, err
}

// exchange is diff, pushing only when push is set; it returns the keys of
// the rows pulled.
func (r *Replicator) exchange(ctx context.Context, addr string, shard uint32, push bool) (pulledKeys []string, pushed int, err error) {
	pull, pushKeys, err := r.keyDiff(ctx, addr, shard, push)
	if err != nil {
		return nil, 0, err
	}
	pulledKeys, err = r.pullRows(ctx, addr, shard, pull)
	if err != nil {
		return pulledKeys, 0, err
	}
	pushed, err = r.pushRows(ctx, addr, pushKeys)
	return pulledKeys, pushed, err
}

// keyDiff reads shard's key/version lists on the peer at addr and here
// and returns, sorted, the keys to pull (the peer's version is newer, or
// we lack the key) and, when push is set, the keys to push (ours is
// newer, or the peer lacks it).
func (r *Replicator) keyDiff(ctx context.Context, addr string, shard uint32, push bool) (pull, pushKeys []string, err error) {
	theirs, err := keyList(ctx, shard, func(ctx context.Context, after []byte) (KeyPage, error) {
		cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
		defer cancel()
		return r.cfg.Peers.Keys(cctx, addr, shard, after, maxKeysPage)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("their keys: %w", err)
	}
	mine, err := keyList(ctx, shard, func(ctx context.Context, after []byte) (KeyPage, error) {
		return r.localKeys(ctx, shard, after, maxKeysPage)
	})
	if err != nil {
		return nil, nil, fmt.Errorf("our keys: %w", err)
	}
	for k, t := range theirs {
		if m, ok := mine[k]; !ok || compareKV(t, m) > 0 {
			pull = append(pull, k)
		}
	}
	for k, m := range mine {
		if t, ok := theirs[k]; push && (!ok || compareKV(m, t) > 0) {
			pushKeys = append(pushKeys, k)
		}
	}
	slices.Sort(pull)
	slices.Sort(pushKeys)
	return pull, pushKeys, nil
}

// pullRows fetches the peer's copies of the rows of keys (of shard) in
// calls bounded by Limits and merges them here, and returns the keys of
// the rows merged, counted as pulled repaired rows even when a later call
// fails. A key the peer examined but did not return expired there. It
// stops with errNoLongerReplica once this node stops replicating shard.
func (r *Replicator) pullRows(ctx context.Context, addr string, shard uint32, keys []string) (pulledKeys []string, err error) {
	defer func() {
		if len(pulledKeys) > 0 {
			r.m.repairedRows.WithLabelValues("pulled").Add(float64(len(pulledKeys)))
		}
	}()
	pull := keys
	for len(pull) > 0 {
		cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
		rows, examined, err := r.cfg.Peers.Rows(cctx, addr, pull[:min(len(pull), r.cfg.Limits.MaxRows)], r.cfg.Limits.MaxBytes)
		cancel()
		if err != nil {
			return pulledKeys, fmt.Errorf("fetch %d rows: %w", len(pull), err)
		}
		if examined <= 0 || examined > len(pull) {
			return pulledKeys, fmt.Errorf("fetch rows: the peer examined %d of %d keys", examined, len(pull))
		}
		pull = pull[examined:] // keys examined but not returned expired there
		if len(rows) == 0 {
			continue
		}
		if !r.replicatesNow(shard) {
			return pulledKeys, fmt.Errorf("shard %d: %w", shard, errNoLongerReplica)
		}
		if _, err := (pullSink{r: r}).Merge(ctx, rows); err != nil {
			return pulledKeys, fmt.Errorf("merge %d rows: %w", len(rows), err)
		}
		r.m.syncRows.WithLabelValues("diff").Add(float64(len(rows)))
		r.m.syncBytes.WithLabelValues("diff").Add(float64(bytesOf(rows)))
		for k := range rows {
			pulledKeys = append(pulledKeys, rows[k].DispatchKey)
		}
	}
	return pulledKeys, nil
}

// pushRows merges our copies of the rows of keys on the peer at addr, in
// batches bounded by Limits, and returns how many it pushed. A key no
// longer held here is skipped. Pushed rows count as repaired only when
// every batch was merged.
func (r *Replicator) pushRows(ctx context.Context, addr string, keys []string) (pushed int, err error) {
	var batch []outbox.Row
	size := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		cctx, cancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
		defer cancel()
		if _, err := r.cfg.Peers.Merge(cctx, addr, batch); err != nil {
			return fmt.Errorf("push %d rows: %w", len(batch), err)
		}
		pushed += len(batch)
		batch, size = batch[:0], 0
		return nil
	}
	for _, k := range keys {
		row, err := r.cfg.Local.Get(ctx, k)
		if errors.Is(err, outbox.ErrNotFound) {
			continue
		}
		if err != nil {
			return pushed, err
		}
		batch = append(batch, row)
		size += outbox.RowBytes(&row)
		if len(batch) >= r.cfg.Limits.MaxRows || size >= r.cfg.Limits.MaxBytes {
			if err := flush(); err != nil {
				return pushed, err
			}
		}
	}
	if err := flush(); err != nil {
		return pushed, err
	}
	if pushed > 0 {
		r.m.repairedRows.WithLabelValues("pushed").Add(float64(pushed))
	}
	return pushed, nil
}

func bytesOf(rows []outbox.Row) int {
	n := 0
	for i := range rows {
		n += outbox.RowBytes(&rows[i])
	}
	return n
}
