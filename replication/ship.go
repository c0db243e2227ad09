package replication

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/fairshard/fairshard/outbox"
)

// Changed records that the rows of keys changed state on this node (a
// settle, retry, dead letter, cancel, redrive, re-arm): their current
// copies are shipped, asynchronously and batched, to the other members of
// their replica sets, which merge them (outbox.Merge). Claims are not
// replicated (nothing calls Changed for them). A key changed again before
// it was shipped is shipped once, in its latest state. A backup's queue is
// bounded by Config.MaxPending; past it the queue is dropped and the
// backup's shards are repaired by digest comparison instead. A backup that
// leaves the view (failed, or across a partition) keeps its queue for up
// to parkedQueueTTL, and the queue takes every change of the shards this
// node replicates meanwhile: when it is back the queue ships at once what
// its sets need, so a settle made while a partition cut the backup off
// reaches it as soon as the partition heals, not when a repair poll finds
// the copies differ (polls repair a few shards each; its shards are still
// marked for them, for what no queue here holds). The changes such a
// queue holds for shards outside the member's sets on its return go to
// the leftover copies of them it still holds, if any (see outsideQueue),
// and so does every change of a shard some live member is known to hold
// a leftover copy of (holders.go). The lag from Changed to a backup's
// acknowledgement is exported (fairshard_replication_lag_seconds).
func (r *Replicator) Changed(keys ...string) {
	v := r.view.Load()
	if v == nil || len(keys) == 0 {
		return
	}
	r.ship.add(v, keys)
}

// Settling marks keys as about to change state on this node: call it
// before the store transaction that settles, retries, dead-letters or
// cancels them, call Changed after it commits, then the returned func.
// Until then States reports their shards Unshipped. Without the mark a
// new primary's handover check could fall between the commit (the claim
// gone) and Changed (nothing queued yet), release the shard, and deliver
// its stale pending copy of a row the old primary had just delivered.
func (r *Replicator) Settling(keys ...string) (done func()) {
	shards := make([]uint32, len(keys))
	for i, k := range keys {
		shards[i] = r.shardOf(k)
	}
	s := r.ship
	s.mu.Lock()
	for _, sh := range shards {
		s.settling[sh]++
	}
	s.mu.Unlock()
	return func() {
		s.mu.Lock()
		for _, sh := range shards {
			if s.settling[sh]--; s.settling[sh] <= 0 {
				delete(s.settling, sh)
			}
		}
		s.mu.Unlock()
	}
}

// PendingChanges returns how many (row, backup) state changes wait to be
// shipped.
func (r *Replicator) PendingChanges() int { return r.ship.pending() }

// shipper holds one queue of changed keys per backup and ships them.
type shipper struct {
	r      *Replicator
	mu     sync.Mutex
	queues map[string]*shipQueue
	// settling counts, per shard, state changes being committed whose
	// Changed call has not happened yet (Settling).
	settling map[uint32]int
	// lost marks, per member, the shards whose changes for it were
	// dropped unshipped, each with the drop's sequence number: its queue
	// went over MaxPending, or it left the view (dead, or across a
	// partition), or it left the shard's replica set. It lacks changes no
	// queue holds any more. While it is in the shard's set, States reports
	// the shard Unshipped, and the repair poll compares the shard with it
	// at once (no streak wait) and repairs it; a mark goes when its copy
	// equals ours, a repair diff with it succeeded, or we hold none of the
	// shard. Without them a dropped queue would read as quiet to a new
	// primary's handover check, and a member back from a partition would
	// keep a stale copy until a busy shard's digests happened to be
	// compared twice alike: tens of seconds, during which a wipe of the
	// only other copy makes the stale one the source, and a delivered row
	// goes out again.
	lost    map[string]map[uint32]uint64
	lostSeq uint64
	// goneSince: when a member holding lost marks was last seen leaving
	// the view (retarget).
	goneSince map[string]time.Time
	// departed holds the members that left the view, since when
	// (lostMarkTTL at most): one back in a shard's set may lack changes
	// made while it was gone, so retarget marks those shards lost for it.
	departed map[string]time.Time
	// active holds the members named in some replica set of the last view
	// retarget saw (a departing one gets an away queue).
	active        map[string]bool
	activeVersion uint64 // that view's Version
	// holders holds, per shard, the members known to hold a leftover copy
	// of it, each with when it was last known to (holders.go): every
	// change of the shard is also queued for them (shipQueue.outside).
	// At most maxLeftoverHolders per shard.
	holders map[uint32]map[string]time.Time
	wakeCh  chan struct{}
	total   int
	// jobs tracks the batches in flight (one per backup at most), so the
	// final flush can wait for them.
	jobs sync.WaitGroup
}

type shipQueue struct {
	entries map[string]*shipEntry
	order   []string // keys in the order they became dirty; stale keys are skipped
	backoff time.Duration
	next    time.Time // no try before
	// parked is when the member left the view (zero while it is in it):
	// the queue waits for its return, parkedQueueTTL at most.
	parked time.Time
	// away: while parked, the queue also takes every change of a shard
	// this node replicates (the view names no set for the member, so
	// which of them it will replicate again is not known); on its return
	// those of shards outside its set move to outside. A queue kept
	// whole since its member left holds every change the member lacks
	// from this node, so its return ships them at once instead of
	// marking every shared shard for a repair by digest.
	away bool
	// outside holds the changes queued while the member was away for
	// shards outside its replica sets now that it is back (nil: none).
	outside *outsideQueue
	// busy: a batch to this backup is in flight. Each backup's batches
	// run on their own, so an unreachable backup (a call waiting out its
	// timeout) never delays the others' state changes.
	busy bool
}

// outsideQueue holds the changes a member is owed for shards outside its
// replica sets: those queued while it was away from the view, and those
// of shards it is known to hold a leftover copy of (shipper.holders). It
// may still hold a copy of such a shard (a leftover: its drop waits until
// the shard's set answers as synced copies), and a leftover copy is the
// one a new member of the set syncs from when the copies that took the
// change are lost, so a settle it lacks is delivered again. The member
// is asked which of the shards it holds rows of (States); the changes of
// those are shipped to it once the changes of its own shards (the queue's
// entries) are, and the rest are dropped. Failed tries (the question or a
// batch) back off like a backup's; after outsideTries of them every change
// left is given up. Neither a wait nor a give-up marks a shard Unshipped or lost: the
// member is no replica of it, so a handover does not wait for its copy,
// and the repair by digest does not compare it.
type outsideQueue struct {
	entries map[string]*shipEntry
	order   []string // keys in the order they were queued; stale keys are skipped
	// held answers, per shard asked, whether the member holds rows of it;
	// unasked holds the shards of entries not asked yet.
	held    map[uint32]bool
	unasked map[uint32]bool
	asking  bool // the question is in flight
	tries   int
	backoff time.Duration
	next    time.Time // no try before
}

// outsideTries is how many failed tries (the question, a batch) the
// changes of an outsideQueue get before they are given up. The backoff
// between tries (50 ms doubling, 2 s at most; a batch also waits out its
// queue's own backoff) spreads them over 5 to 7 s plus the calls' own
// durations.
const outsideTries = 8

type shipEntry struct {
	shard uint32
	// away: queued while the member was away from the view (see
	// shipQueue.away).
	away     bool
	since    time.Time // first change not yet acknowledged
	gen      uint64    // bumped on every change
	inflight uint64    // gen being shipped (0: none)
	redirty  time.Time // first change while in flight
}

func newShipper(r *Replicator) *shipper {
	return &shipper{r: r, queues: map[string]*shipQueue{}, settling: map[uint32]int{},
		lost: map[string]map[uint32]uint64{}, goneSince: map[string]time.Time{}, departed: map[string]time.Time{},
		holders: map[uint32]map[string]time.Time{}, wakeCh: make(chan struct{}, 1)}
}

func (s *shipper) add(v *View, keys []string) {
	now := time.Now()
	full := false
	s.mu.Lock()
	// v newer than the last view retarget saw: Apply stored it and has
	// not retargeted yet. A member of that last view v lacks is away
	// already; a change in between would otherwise be queued for nobody.
	if v.Version > s.activeVersion {
		for m := range s.active {
			if _, in := v.Addrs[m]; !in && m != v.Self {
				s.awayQueueLocked(m, now)
			}
		}
	}
	var away []string // members away from the view whose queues take every change
	var outside []*outsideQueue
	for m, q := range s.queues {
		if q.away {
			away = append(away, m)
		}
		if q.outside != nil {
			outside = append(outside, q.outside)
		}
	}
	for _, key := range keys {
		shard := s.r.shardOf(key)
		for _, m := range v.set(shard) {
			if m == v.Self {
				continue
			}
			full = s.enqueueLocked(m, s.queueLocked(m), key, shard, now, false) || full
		}
		if len(away) > 0 && v.inSet(v.Self, shard) {
			for _, m := range away {
				if q := s.queues[m]; q != nil {
					s.enqueueLocked(m, q, key, shard, now, true)
				}
			}
		}
		for _, o := range outside {
			if e := o.entries[key]; e != nil {
				e.changed(now)
			}
		}
		s.leftoversLocked(v, key, shard, now)
	}
	s.r.m.pending.Set(float64(s.total))
	s.mu.Unlock()
	if full {
		wake(s.wakeCh)
	}
}

// awayQueueLocked makes m's queue (created if need be) an away queue,
// parked since now unless it was already (see shipQueue.away). s.mu held.
func (s *shipper) awayQueueLocked(m string, now time.Time) {
	q := s.queueLocked(m)
	if q.parked.IsZero() {
		q.parked = now
	}
	q.away = true
}

// activeMembers returns the members named in some replica set of v.
func activeMembers(v *View) map[string]bool {
	out := map[string]bool{}
	for _, set := range v.Sets {
		for _, m := range set {
			out[m] = true
		}
	}
	return out
}

// enqueueLocked queues a change of key (of shard) for member m's queue q
// (away: m is away from the view; see shipQueue.away). Past MaxPending the
// queue is dropped and m's shards are repaired by digest instead. It
// reports whether q holds a full batch. s.mu held.
func (s *shipper) enqueueLocked(m string, q *shipQueue, key string, shard uint32, now time.Time, away bool) bool {
	e := q.entries[key]
	switch {
	case e == nil:
		q.entries[key] = &shipEntry{shard: shard, since: now, gen: 1, away: away}
		q.order = append(q.order, key)
		s.total++
	default:
		e.changed(now)
		e.away = e.away && away
	}
	if len(q.entries) > s.r.cfg.MaxPending {
		// Bounded memory: drop the queue, repair the backup by digest.
		s.r.m.shipDropped.Add(float64(len(q.entries)))
		s.dropQueueLocked(m, q)
		s.r.markFullRepair(m)
		log := s.r.log.Warn
		if q.away {
			log = s.r.log.Info // a member away long, or gone for good
		}
		log("backup's change queue over its bound: dropped; its shards will be repaired by digest",
			"member", m, "max_pending", s.r.cfg.MaxPending, "away", q.away)
		return false
	}
	return len(q.entries) >= s.r.cfg.ShipBatch
}

// changed records one more change of e's key.
func (e *shipEntry) changed(now time.Time) {
	if e.inflight != 0 && e.redirty.IsZero() {
		e.redirty = now
	}
	e.gen++
}

// dropQueueLocked drops member m's queue q: its entries become lost
// marks, its outside changes are given up. s.mu held.
func (s *shipper) dropQueueLocked(m string, q *shipQueue) {
	s.total -= len(q.entries)
	if q.outside != nil {
		s.total -= len(q.outside.entries)
	}
	s.markLostLocked(m, q.entries)
	delete(s.queues, m)
}

// moveOutsideLocked moves e, the entry of key in q queued while its
// member was away, to q.outside (its shard is outside the member's sets).
// s.mu held.
func (s *shipper) moveOutsideLocked(q *shipQueue, key string, e *shipEntry, now time.Time) {
	delete(q.entries, key)
	o := q.outsideQueue()
	if prev := o.entries[key]; prev != nil {
		// Moved before and changed again since: shipped once, in its
		// latest state.
		prev.changed(now)
		s.total--
		return
	}
	o.put(key, e)
}

// queueLocked returns m's queue, created empty if m has none. s.mu held.
func (s *shipper) queueLocked(m string) *shipQueue {
	q := s.queues[m]
	if q == nil {
		q = &shipQueue{entries: map[string]*shipEntry{}}
		s.queues[m] = q
	}
	return q
}

// outsideQueue returns q.outside, created empty if q has none.
func (q *shipQueue) outsideQueue() *outsideQueue {
	if q.outside == nil {
		q.outside = &outsideQueue{entries: map[string]*shipEntry{}, held: map[uint32]bool{}, unasked: map[uint32]bool{}}
	}
	return q.outside
}

// put queues e as key's change (key not queued yet); its shard's question
// is asked first unless it was already.
func (o *outsideQueue) put(key string, e *shipEntry) {
	o.entries[key] = e
	o.order = append(o.order, key)
	if _, asked := o.held[e.shard]; !asked {
		o.unasked[e.shard] = true
	}
}

func (s *shipper) pending() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total
}

// retarget parks the queues of members that left the view (they ship
// again once the member is back) and drops, as lost marks, those parked
// for longer than parkedQueueTTL; entries whose shard's set no longer
// includes their member are dropped, as lost marks, when taken (those
// queued while it was away move to its leftover copies' changes instead:
// shipQueue.outside). A member back in the view after it left (a
// partition healed, a restart) gets a lost mark for every shard both it
// and this node replicate: while it was gone, changes of those shards
// went to other members, or nowhere, and the mark has the repair poll
// compare the copies at once (prev is the view before v; nil for the
// first).
func (s *shipper) retarget(prev, v *View) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	if prev != nil {
		for m := range prev.Addrs {
			if _, in := v.Addrs[m]; !in && m != v.Self {
				s.departed[m] = now
				if s.active[m] {
					// From now on its queue takes every change it will lack
					// (a member that was leaving replicated nothing: none).
					s.awayQueueLocked(m, now)
				}
			}
		}
	}
	s.active, s.activeVersion = activeMembers(v), v.Version
	s.retargetHoldersLocked(prev, v, now)
	var returned []string
	for m, since := range s.departed {
		if _, in := v.Addrs[m]; in {
			delete(s.departed, m)
			if q := s.queues[m]; q != nil {
				// Its queue holds the changes made here while it was away:
				// shipped at once below. The marks stay, for what it lacks
				// that no queue here holds (rows others shipped here, rows
				// appended meanwhile): cleared by the first poll whose
				// digests agree, or a repair.
				q.away = false
			}
			returned = append(returned, m)
		} else if now.Sub(since) > lostMarkTTL {
			delete(s.departed, m)
		}
	}
	if len(returned) > 0 && !v.Leaving {
		s.lostSeq++
		for sh := range v.ShardCount {
			set := v.set(sh)
			if !slices.Contains(set, v.Self) {
				continue
			}
			for _, m := range returned {
				if slices.Contains(set, m) {
					l := s.lost[m]
					if l == nil {
						l = map[uint32]uint64{}
						s.lost[m] = l
					}
					l[sh] = s.lostSeq
				}
			}
		}
	}
	back := false
	for m, q := range s.queues {
		_, in := v.Addrs[m]
		switch {
		case in && !q.parked.IsZero():
			q.parked, q.backoff, q.next = time.Time{}, 0, time.Time{}
			if o := q.outside; o != nil {
				// Back again: what it holds is asked anew.
				clear(o.held)
				for _, e := range o.entries {
					o.unasked[e.shard] = true
				}
			}
			back = true
		case in:
		case q.parked.IsZero():
			q.parked = now
		case now.Sub(q.parked) > parkedQueueTTL && !q.busy:
			s.dropQueueLocked(m, q)
		}
	}
	if back {
		wake(s.wakeCh)
	}
	// Marks of members gone from the view wait for their return, for
	// lostMarkTTL at most (bounded memory: one entry per shard for each
	// departed name; a member back after that long is repaired by the
	// streak-gated polls, or syncs if it was alone).
	for m := range s.lost {
		if _, ok := v.Addrs[m]; ok {
			delete(s.goneSince, m)
			continue
		}
		since, ok := s.goneSince[m]
		if !ok {
			s.goneSince[m] = now
		} else if now.Sub(since) > lostMarkTTL {
			delete(s.lost, m)
			delete(s.goneSince, m)
		}
	}
	s.r.m.pending.Set(float64(s.total))
}

// lostMarkTTL is how long the lost marks of a member gone from the view
// are kept for its return.
const lostMarkTTL = time.Hour

// parkedQueueTTL is how long the change queue of a member gone from the
// view is kept for its return (past it, its entries become lost marks and
// the member is repaired by digest): longer than the partitions and
// restarts a cluster rides out, short beside lostMarkTTL, since a queue
// holds a key per change (up to MaxPending) and a mark one entry per shard.
const parkedQueueTTL = 5 * time.Minute

// markLostLocked marks the shards of entries as lost for member m (see
// shipper.lost). s.mu held.
func (s *shipper) markLostLocked(m string, entries map[string]*shipEntry) {
	if len(entries) == 0 {
		return
	}
	s.lostSeq++
	l := s.lost[m]
	if l == nil {
		l = map[uint32]uint64{}
		s.lost[m] = l
	}
	for _, e := range entries {
		l[e.shard] = s.lostSeq
	}
}

// lostMark is one (backup, shard) lost mark with its drop's sequence
// number (see shipper.lost).
type lostMark struct {
	member string
	shard  uint32
	seq    uint64
}

// lostMarks snapshots the lost marks. Take it before reading the local
// digests a mark is judged against: every change a mark in the snapshot
// stands for is then in those digests.
func (s *shipper) lostMarks() []lostMark {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []lostMark
	for m, l := range s.lost {
		for sh, seq := range l {
			out = append(out, lostMark{m, sh, seq})
		}
	}
	return out
}

// clearLost removes mark unless a later drop renewed it.
func (s *shipper) clearLost(mark lostMark) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.lost[mark.member]
	if l[mark.shard] != mark.seq {
		return
	}
	delete(l, mark.shard)
	if len(l) == 0 {
		delete(s.lost, mark.member)
	}
}

// pendingFor reports whether changes of shard wait for member.
func (s *shipper) pendingFor(member string, shard uint32) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	q := s.queues[member]
	if q == nil {
		return false
	}
	for _, e := range q.entries {
		if e.shard == shard {
			return true
		}
	}
	return false
}

// pendingShards returns the shards with changes waiting for some backup
// or being committed (Settling).
func (s *shipper) pendingShards() map[uint32]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[uint32]bool{}
	for sh := range s.settling {
		out[sh] = true
	}
	v := s.r.view.Load()
	for m, q := range s.queues {
		for _, e := range q.entries {
			// A parked queue counts like a lost mark: only while its member
			// is back in the shard's set (it is shipped then).
			if q.parked.IsZero() || (v != nil && v.inSet(v.Self, e.shard) && slices.Contains(v.set(e.shard), m)) {
				out[e.shard] = true
			}
		}
	}
	for m, l := range s.lost {
		for sh := range l {
			// Only while both m and this node replicate sh (a member
			// outside the set gets nothing shipped for sh; a leftover
			// copy here is pulled by the new primary's handover): the
			// mark otherwise waits for its return.
			if v != nil && v.inSet(v.Self, sh) && slices.Contains(v.set(sh), m) {
				out[sh] = true
			}
		}
	}
	return out
}

// run ships queued changes every ShipInterval (sooner when a queue fills a
// batch) until ctx ends, then tries once more to flush, bounded by a second.
func (s *shipper) run(ctx context.Context) error {
	lastGauge := time.Time{}
	for {
		if !sleep(ctx, s.r.cfg.ShipInterval, s.wakeCh) {
			s.jobs.Wait() // batches in flight end with ctx
			fctx, cancel := context.WithTimeout(context.Background(), time.Second)
			s.round(fctx, true) // the batches ctx cut are due at once
			s.jobs.Wait()
			cancel()
			return nil
		}
		s.round(ctx, false)
		if time.Since(lastGauge) > 250*time.Millisecond {
			s.updateOldest()
			lastGauge = time.Now()
		}
	}
}

// round starts one batch to every backup with changes due (all with
// changes when flush: the final try ignores the retry backoff) and no
// batch in flight; each runs on its own (done wakes the loop again when
// its queue still holds a full batch). A batch takes the changes of the
// member's own shards first and fills what room is left with those of
// its leftover copies (shipQueue.outside), once the member has answered
// which shards it holds; the question runs beside the batches.
func (s *shipper) round(ctx context.Context, flush bool) {
	v := s.r.view.Load()
	if v == nil {
		return
	}
	now := time.Now()
	type job struct {
		member string
		q      *shipQueue
		keys   []string
		gens   []uint64
		// okeys and ogens: the batch's changes of q.outside.
		okeys []string
		ogens []uint64
		// ask: the job asks which of these shards the member holds rows
		// of, at askedAt.
		ask     []uint32
		askedAt time.Time
	}
	var jobs []job
	s.mu.Lock()
	for m, q := range s.queues {
		if !q.parked.IsZero() && !q.busy && now.Sub(q.parked) > parkedQueueTTL {
			s.dropQueueLocked(m, q)
			continue
		}
		if !q.parked.IsZero() {
			continue
		}
		if _, in := v.Addrs[m]; !in {
			continue // parked by the next retarget; its entries wait for m
		}
		if !q.busy && (len(q.entries) > 0 || q.outside != nil) && (flush || !now.Before(q.next)) {
			j := job{member: m, q: q}
			for len(q.order) > 0 && len(j.keys) < s.r.cfg.ShipBatch {
				key := q.order[0]
				q.order = q.order[1:]
				e := q.entries[key]
				if e == nil || e.inflight != 0 {
					continue
				}
				if !v.inSet(m, e.shard) {
					if e.away {
						// Owed while it was away: it may hold a leftover copy.
						s.moveOutsideLocked(q, key, e, now)
						continue
					}
					// It had this change owed as a replica of the shard.
					s.markLostLocked(m, map[string]*shipEntry{key: e})
					delete(q.entries, key)
					s.total--
					continue
				}
				e.inflight = e.gen
				j.keys = append(j.keys, key)
				j.gens = append(j.gens, e.gen)
			}
			if len(q.order) == 0 {
				q.order = nil
			}
			if room := s.r.cfg.ShipBatch - len(j.keys); room > 0 && q.outside != nil {
				j.okeys, j.ogens = s.outsideBatchLocked(q, room, flush, now)
			}
			if len(j.keys) > 0 || len(j.okeys) > 0 {
				q.busy = true
				jobs = append(jobs, j)
			}
		}
		if o := q.outside; o != nil && !o.asking && len(o.unasked) > 0 && (flush || !now.Before(o.next)) {
			o.asking = true
			jobs = append(jobs, job{member: m, q: q, ask: slices.Sorted(maps.Keys(o.unasked)), askedAt: now})
			clear(o.unasked)
		}
	}
	s.r.m.pending.Set(float64(s.total))
	s.mu.Unlock()
	for _, j := range jobs {
		s.jobs.Go(func() {
			var more bool
			if len(j.ask) > 0 {
				held, err := s.askHeld(ctx, v, j.member, j.ask)
				more = s.asked(j.member, j.q, j.ask, j.askedAt, held, err)
			} else {
				err := s.ship(ctx, v, j.member, slices.Concat(j.keys, j.okeys))
				more = s.done(j.member, j.q, j.keys, j.gens, j.okeys, j.ogens, err)
			}
			if more {
				wake(s.wakeCh)
			}
		})
	}
}

// outsideBatchLocked takes up to room changes of q.outside due now (all
// when flush) for a batch, marked in flight: none while the member has
// shards left to answer about. Changes of shards it holds no rows of are
// dropped. s.mu held.
func (s *shipper) outsideBatchLocked(q *shipQueue, room int, flush bool, now time.Time) (keys []string, gens []uint64) {
	o := q.outside
	if o.asking || len(o.unasked) > 0 || (!flush && now.Before(o.next)) {
		return nil, nil
	}
	for len(o.order) > 0 && len(keys) < room {
		key := o.order[0]
		o.order = o.order[1:]
		e := o.entries[key]
		if e == nil || e.inflight != 0 {
			continue
		}
		if !o.held[e.shard] {
			delete(o.entries, key)
			s.total--
			continue
		}
		e.inflight = e.gen
		keys = append(keys, key)
		gens = append(gens, e.gen)
	}
	if len(o.order) == 0 {
		o.order = nil
	}
	if len(o.entries) == 0 {
		q.outside = nil
	}
	return keys, gens
}

// askHeld asks member which of shards it holds rows of (States).
func (s *shipper) askHeld(ctx context.Context, v *View, member string, shards []uint32) (map[uint32]bool, error) {
	addr := v.Addrs[member]
	if addr == "" {
		return nil, fmt.Errorf("ask member %s which of %d shards it holds: it has no API address", member, len(shards))
	}
	cctx, cancel := context.WithTimeout(ctx, s.r.cfg.ShipTimeout)
	defer cancel()
	rep, err := s.r.cfg.Peers.States(cctx, addr, shards)
	if err != nil {
		return nil, fmt.Errorf("ask member %s which of %d shards it holds: %w", member, len(shards), err)
	}
	held := make(map[uint32]bool, len(shards))
	for _, st := range rep.States {
		if st.Rows > 0 {
			held[st.Shard] = true
		}
	}
	return held, nil
}

// asked records member's answer (held, or err) to the question, sent at
// at, which of shards it holds rows of, also as leftover holder marks
// (shipper.holders). It reports whether changes of the queue's outside
// are due now.
func (s *shipper) asked(member string, jq *shipQueue, shards []uint32, at time.Time, held map[uint32]bool, err error) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err == nil {
		for _, sh := range shards {
			if held[sh] {
				s.holdLocked(sh, member, at)
			} else {
				s.releasedLocked(sh, member, at)
			}
		}
	}
	o := jq.outside
	if o == nil {
		return false
	}
	o.asking = false
	if s.queues[member] != jq {
		return false
	}
	if err != nil {
		for _, sh := range shards {
			if _, ok := o.held[sh]; !ok {
				o.unasked[sh] = true
			}
		}
		s.outsideFailedLocked(member, jq, err)
		return false
	}
	for _, sh := range shards {
		o.held[sh] = held[sh]
	}
	o.backoff, o.next = 0, time.Time{}
	return !jq.busy
}

// outsideFailedLocked counts a failed try of q.outside's work (err): it
// backs off, or past outsideTries gives every change left up. s.mu held.
func (s *shipper) outsideFailedLocked(member string, q *shipQueue, err error) {
	o := q.outside
	o.tries++
	if o.tries >= outsideTries {
		s.total -= len(o.entries)
		q.outside = nil
		s.r.log.Info("state changes for a member's leftover copies given up: it is no replica of their shards",
			"member", member, "rows", len(o.entries), "tries", o.tries, "err", err)
		return
	}
	o.backoff = min(max(2*o.backoff, 50*time.Millisecond), 2*time.Second)
	o.next = time.Now().Add(o.backoff)
	s.r.log.Debug("state changes for a member's leftover copies not shipped; retrying",
		"member", member, "tries", o.tries, "err", err)
}

// ship reads the current copies of keys and merges them on member, in
// batches bounded by Limits.MaxBytes. Keys no longer held (expired) are
// skipped.
func (s *shipper) ship(ctx context.Context, v *View, member string, keys []string) error {
	addr := v.Addrs[member]
	if addr == "" {
		return errors.New("member has no API address")
	}
	var batch []outbox.Row
	size := 0
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		cctx, cancel := context.WithTimeout(ctx, s.r.cfg.ShipTimeout)
		defer cancel()
		_, err := s.r.cfg.Peers.Merge(cctx, addr, batch)
		if err == nil {
			s.r.m.shipped.Add(float64(len(batch)))
		}
		batch, size = batch[:0], 0
		return err
	}
	for _, key := range keys {
		row, err := s.r.cfg.Local.Get(ctx, key)
		if errors.Is(err, outbox.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		batch = append(batch, row)
		size += outbox.RowBytes(&row)
		if size >= s.r.cfg.Limits.MaxBytes {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// done settles a shipped batch: acknowledged entries not changed since
// are removed (their lag observed); the others go back in the queue. okeys
// and ogens are the batch's changes of jq.outside, settled alike (no lag
// observed: the member is no replica of their shards), a failure counted
// as one of their tries. It reports whether the backup's queue holds a
// full batch due now.
func (s *shipper) done(member string, jq *shipQueue, keys []string, gens []uint64, okeys []string, ogens []uint64, err error) bool {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	jq.busy = false
	q := s.queues[member]
	if q == nil {
		return false
	}
	if err != nil {
		s.r.m.shipFailures.Inc()
		q.backoff = min(max(2*q.backoff, 50*time.Millisecond), 2*time.Second)
		q.next = now.Add(q.backoff)
		s.r.log.Debug("shipping state changes to backup failed; retrying", "member", member, "rows", len(keys)+len(okeys), "err", err)
	} else {
		q.backoff, q.next = 0, time.Time{}
	}
	for i, key := range keys {
		e := q.entries[key]
		if e == nil || e.inflight != gens[i] {
			continue
		}
		e.inflight = 0
		switch {
		case err == nil && e.gen == gens[i]:
			s.r.m.lag.Observe(now.Sub(e.since).Seconds())
			delete(q.entries, key)
			s.total--
		case err == nil:
			e.since, e.redirty = e.redirty, time.Time{}
			q.order = append(q.order, key)
		default:
			if !e.redirty.IsZero() {
				e.redirty = time.Time{}
			}
			q.order = append(q.order, key)
		}
	}
	if o := jq.outside; o != nil && q == jq && len(okeys) > 0 {
		for i, key := range okeys {
			e := o.entries[key]
			if e == nil || e.inflight != ogens[i] {
				continue
			}
			e.inflight = 0
			if err == nil && e.gen == ogens[i] {
				delete(o.entries, key)
				s.total--
				continue
			}
			e.redirty = time.Time{}
			o.order = append(o.order, key)
		}
		if err != nil {
			s.outsideFailedLocked(member, q, err)
		} else {
			o.backoff, o.next = 0, time.Time{}
		}
		if q.outside != nil && len(q.outside.entries) == 0 {
			q.outside = nil
		}
	}
	s.r.m.pending.Set(float64(s.total))
	due := len(q.order) >= s.r.cfg.ShipBatch || (err == nil && q.outside != nil && len(q.outside.order) > 0)
	return !q.busy && due && !now.Before(q.next)
}

// updateOldest sets the oldest-change gauge (a scan; run a few times a
// second at most).
func (s *shipper) updateOldest() {
	s.mu.Lock()
	defer s.mu.Unlock()
	var oldest time.Time
	for _, q := range s.queues {
		for _, e := range q.entries {
			if oldest.IsZero() || e.since.Before(oldest) {
				oldest = e.since
			}
		}
	}
	if oldest.IsZero() {
		s.r.m.lagOldest.Set(0)
		return
	}
	s.r.m.lagOldest.Set(time.Since(oldest).Seconds())
}
