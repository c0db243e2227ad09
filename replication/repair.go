package replication

import (
	"cmp"
	"context"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/fairshard/fairshard/outbox"
)

// repairState is what the digest polls learned; Replicator.mu guards it.
type repairState struct {
	// mismatch is what the last polls saw of each (shard, peer) whose
	// digests disagreed.
	mismatch map[syncKey]mismatchState
	// under is the last poll's count of under-replicated primary shards.
	under underCounts
	// fullRepair marks peers whose change queue was dropped: all their
	// shards are compared by the next poll.
	fullRepair map[string]bool
	// urgentRetry backs off failing lost-mark repairs.
	urgentRetry map[syncKey]urgentRetry
}

// Repair (anti-entropy): every PollInterval, and at once after a
// membership change, a primary asks each backup for its state of the
// shards they share (States: digest and sync state). A shard whose digests
// disagree in two polls in a row, with no state change of it still queued
// for that backup, is repaired: the two exchange their key/version lists
// and merge what differs, both ways (diff). A disagreement seen once is
// usually replication lag; lost messages, crashes and partitions leave one
// that persists. At most maxRepairsPerPoll shards are repaired per poll,
// longest disagreement first, so a busy cluster (whose digests are often
// caught mid-change) spends bounded effort on false alarms.
//
// The same polls tell the primary which of its shards are
// under-replicated: fewer members than R, or a replica (itself included)
// not synced.

// maxRepairsPerPoll bounds the shard repairs one poll starts.
const maxRepairsPerPoll = 8

// repairAfterPolls is how many polls in a row a busy shard's digests may
// disagree before it is repaired anyway.
const repairAfterPolls = 10

// mismatchState is what the last polls saw of one (shard, backup) pair.
type mismatchState struct {
	streak int
	mine   outbox.ShardDigest
	theirs ShardState
}

func (r *Replicator) pollLoop(ctx context.Context) error {
	for {
		r.pollRound(ctx)
		if !sleep(ctx, r.cfg.PollInterval, r.pollWake) {
			return nil
		}
	}
}

// markFullRepair is called when member's change queue was dropped: the
// next poll compares its shards at once.
func (r *Replicator) markFullRepair(member string) {
	r.mu.Lock()
	r.repairs.fullRepair[member] = true
	r.mu.Unlock()
	wake(r.pollWake)
}

type repairJob struct {
	shard  uint32
	peer   string
	streak int
	// urgent: a lost mark's repair (the peer is known to lack changes):
	// first in line, at most maxUrgentRepairsPerPoll per poll, not held
	// back by changes queued for the peer, backed off when it fails.
	urgent bool
}

// maxUrgentRepairsPerPoll bounds a poll's lost-mark repairs, so failing
// ones cannot take every repair slot.
const maxUrgentRepairsPerPoll = maxRepairsPerPoll / 2

// urgentBackoffMax bounds the wait between tries of a failing lost-mark
// repair of one (shard, peer): it starts at a poll and doubles. Short: a
// copy known to lack changes is repaired within a few seconds of the
// failures ending (packet loss, a peer busy syncing).
const urgentBackoffMax = 5 * time.Second

// urgentRetry is when a failed lost-mark repair may run again, and the
// last wait.
type urgentRetry struct {
	next time.Time
	wait time.Duration
}

// pollRound is one repair poll: it asks the backups of this node's
// primary shards, and the members of its lost marks, for their states of
// those shards; repairs (at most maxRepairsPerPoll at once, lost marks'
// first) the copies that differ; and updates the under-replication
// figures. Marks left over for want of repair slots wake the next poll at
// once.
func (r *Replicator) pollRound(ctx context.Context) {
	v := r.view.Load()
	if v == nil || ctx.Err() != nil {
		return
	}
	lost := r.ship.lostMarks() // before the digests: see lostMarks
	mine, err := r.localDigests(ctx)
	if err != nil {
		r.log.Warn("repair poll: read local digests", "err", err)
		return
	}
	primaries, byPeer := r.primaryShards(v)
	lost, ask := r.lostMarksToAsk(v, lost, mine, byPeer)
	got := r.askStates(ctx, v, ask)
	for p, rep := range got {
		r.recordStates(p, rep)
	}
	// Digest comparisons: what to repair. A lost mark's shard that
	// differs is repaired at once (it is known to lack changes), first.
	jobs, marked := r.lostMarkRepairs(lost, mine, got)
	r.mu.Lock()
	jobs = append(jobs, r.mismatchRepairsLocked(byPeer, mine, got, marked)...)
	r.updateUnderLocked(v, primaries, mine, got)
	r.mu.Unlock()

	run, urgentLeft := r.pickRepairs(jobs)
	// The repairs of one poll run at once: each is a few calls to one
	// peer, and a backup back from a partition may lack changes of many
	// shards.
	var repairs sync.WaitGroup
	for _, j := range run {
		if ctx.Err() != nil {
			break
		}
		r.m.mismatches.Inc()
		repairs.Go(func() { r.repair(ctx, v, j, lost) })
	}
	repairs.Wait()
	if urgentLeft && ctx.Err() == nil {
		// Marks left for the next poll, which starts at once: a copy known
		// to lack changes is not left stale for a poll interval per batch.
		wake(r.pollWake)
	}
}

// primaryShards returns the shards v makes this node the primary of
// (none while it is leaving) and, per backup, the ones it backs up.
func (r *Replicator) primaryShards(v *View) (primaries []uint32, byPeer map[string][]uint32) {
	byPeer = map[string][]uint32{}
	for s := range r.cfg.ShardCount {
		set := v.set(s)
		if len(set) == 0 || set[0] != v.Self || v.Leaving {
			continue
		}
		primaries = append(primaries, s)
		for _, b := range set[1:] {
			byPeer[b] = append(byPeer[b], s)
		}
	}
	return primaries, byPeer
}

// lostMarksToAsk returns the lost marks this poll judges and, per member,
// the shards to ask it about: byPeer's, plus each judged mark's shard (a
// mark goes once the member's copy equals ours). A mark of a shard of
// which nothing is held here is cleared (nothing to ship); one of a
// member outside the view or the shard's set is kept for its return, not
// judged (see shipper.lost).
func (r *Replicator) lostMarksToAsk(v *View, lost []lostMark, mine map[uint32]outbox.ShardDigest, byPeer map[string][]uint32) ([]lostMark, map[string][]uint32) {
	ask := map[string][]uint32{}
	for p, shards := range byPeer {
		ask[p] = shards
	}
	for i := 0; i < len(lost); i++ {
		mk := lost[i]
		if mine[mk.shard].Rows == 0 {
			r.ship.clearLost(mk) // nothing of the shard here to ship
			lost = slices.Delete(lost, i, i+1)
			i--
			continue
		}
		if _, ok := v.Addrs[mk.member]; !ok || !slices.Contains(v.set(mk.shard), mk.member) {
			lost = slices.Delete(lost, i, i+1)
			i--
			continue
		}
		if !slices.Contains(ask[mk.member], mk.shard) {
			ask[mk.member] = append(slices.Clip(ask[mk.member]), mk.shard)
		}
	}
	return lost, ask
}

// lostMarkRepairs judges the lost marks by the members' answers: a mark
// whose member's copy equals ours is cleared; one whose shard is synced
// on both sides and due (not backing off) becomes an urgent repair, one
// per (shard, member), whether this node is the primary or not: it holds
// changes the member lacks, and a diff works between any two replicas.
// It returns the repairs and the (shard, member) pairs they cover.
func (r *Replicator) lostMarkRepairs(lost []lostMark, mine map[uint32]outbox.ShardDigest, got map[string]StatesReply) ([]repairJob, map[syncKey]bool) {
	var jobs []repairJob
	marked := map[syncKey]bool{}
	for _, mk := range lost {
		rep, ok := got[mk.member]
		if !ok || !rep.Joined {
			continue
		}
		st, _ := stateOf(rep, mk.shard)
		switch {
		case st.Rows == mine[mk.shard].Rows && st.Sum == mine[mk.shard].Sum:
			r.ship.clearLost(mk)
		case r.isSynced(mk.shard) && st.Synced && !marked[syncKey{mk.shard, mk.member}] && r.urgentDue(syncKey{mk.shard, mk.member}):
			marked[syncKey{mk.shard, mk.member}] = true
			jobs = append(jobs, repairJob{shard: mk.shard, peer: mk.member, streak: math.MaxInt, urgent: true})
		}
	}
	return jobs, marked
}

// mismatchRepairsLocked updates the mismatch streak of each (primary
// shard, backup) pair from the backups' answers and returns the pairs to
// repair: synced on both sides, digests differing, not already marked,
// and either quiet (neither copy changed since the last poll, so no write
// is in flight between them) or differing for repairAfterPolls polls (a
// busy shard). An equal pair, or one with a side still syncing (the sync
// brings it), loses its streak. A backup that answered as joined loses
// its full-repair mark. r.mu held.
func (r *Replicator) mismatchRepairsLocked(byPeer map[string][]uint32, mine map[uint32]outbox.ShardDigest, got map[string]StatesReply, marked map[syncKey]bool) []repairJob {
	var jobs []repairJob
	for p, shards := range byPeer {
		rep, ok := got[p]
		if !ok || !rep.Joined {
			continue
		}
		delete(r.repairs.fullRepair, p)
		for _, s := range shards {
			key := syncKey{s, p}
			st, _ := stateOf(rep, s)
			d := mine[s]
			if !r.syncs.synced[s] || !st.Synced || (st.Rows == d.Rows && st.Sum == d.Sum) {
				delete(r.repairs.mismatch, key)
				continue
			}
			prev := r.repairs.mismatch[key]
			cur := mismatchState{streak: prev.streak + 1, mine: d, theirs: st}
			r.repairs.mismatch[key] = cur
			quiet := prev.streak > 0 && prev.mine == d && prev.theirs.Rows == st.Rows && prev.theirs.Sum == st.Sum
			if (quiet || cur.streak >= repairAfterPolls) && !marked[key] {
				jobs = append(jobs, repairJob{shard: s, peer: p, streak: cur.streak})
			}
		}
	}
	return jobs
}

// pickRepairs chooses the poll's repairs, longest disagreement first
// (urgent ones rank above all): at most maxRepairsPerPoll, of which at
// most maxUrgentRepairsPerPoll urgent; a non-urgent one whose changes are
// still queued for the peer waits (they are on the way). urgentLeft
// reports urgent repairs left for want of a slot.
func (r *Replicator) pickRepairs(jobs []repairJob) (run []repairJob, urgentLeft bool) {
	slices.SortFunc(jobs, func(a, b repairJob) int { return cmp.Compare(b.streak, a.streak) })
	urgent := 0
	for _, j := range jobs {
		if len(run) >= maxRepairsPerPoll {
			urgentLeft = urgentLeft || j.urgent
			continue
		}
		if j.urgent {
			if urgent >= maxUrgentRepairsPerPoll {
				urgentLeft = true
				continue
			}
			urgent++
		} else if r.ship.pendingFor(j.peer, j.shard) {
			continue // its changes are on the way
		}
		run = append(run, j)
	}
	return run, urgentLeft
}

// repair runs one repair job of a poll: a diff of j.shard with j.peer,
// then it clears what the diff settled (the mismatch streak, a failing
// mark's backoff, and the marks of lost it stands for).
func (r *Replicator) repair(ctx context.Context, v *View, j repairJob, lost []lostMark) {
	pulled, pushed, err := r.diff(ctx, v.Addrs[j.peer], j.shard)
	key := syncKey{j.shard, j.peer}
	if err != nil {
		if j.urgent {
			r.urgentFailed(key)
		}
		r.log.Info("repair incomplete; retried by the next poll", "shard", j.shard, "peer", j.peer, "err", err)
		return
	}
	r.mu.Lock()
	delete(r.repairs.mismatch, key)
	delete(r.repairs.urgentRetry, key)
	r.mu.Unlock()
	// The diff read both key lists after the marks were taken: the peer
	// now holds every change a mark of (peer, shard) stands for, even if
	// the shard changed again since (a busy shard's digests may never be
	// equal at one instant).
	for _, mk := range lost {
		if mk.member == j.peer && mk.shard == j.shard {
			r.ship.clearLost(mk)
		}
	}
	if pulled+pushed > 0 {
		r.m.repairedShards.Inc()
		r.log.Info("shard repaired", "shard", j.shard, "peer", j.peer, "pulled", pulled, "pushed", pushed)
	}
}

// updateUnderLocked counts this node's primary shards with fewer than R
// synced copies, and their rows, from the latest poll answers.
func (r *Replicator) updateUnderLocked(v *View, primaries []uint32, mine map[uint32]outbox.ShardDigest, got map[string]StatesReply) {
	shards, rows := 0, int64(0)
	for _, s := range primaries {
		set := v.set(s)
		under := len(set) < v.Factor || !r.syncs.synced[s]
		for _, b := range set[1:] {
			if under {
				break
			}
			rep, ok := got[b]
			if !ok {
				under = true
				break
			}
			st, _ := stateOf(rep, s)
			under = !rep.Joined || !st.Replica || !st.Synced
		}
		if under {
			shards++
			rows += mine[s].Rows
		}
	}
	r.repairs.under = underCounts{shards: shards, rows: rows, at: time.Now()}
	r.m.underShards.Set(float64(shards))
	r.m.underRows.Set(float64(rows))
}

type underCounts struct {
	shards int
	rows   int64
	at     time.Time
}

// isSynced reports whether this node holds a synced copy of shard.
func (r *Replicator) isSynced(shard uint32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.syncs.synced[shard]
}

// urgentDue reports whether a lost mark's repair of key may run now (not
// backing off after a failure).
func (r *Replicator) urgentDue(key syncKey) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	b, ok := r.repairs.urgentRetry[key]
	return !ok || !time.Now().Before(b.next)
}

// urgentFailed backs off key's lost-mark repair.
func (r *Replicator) urgentFailed(key syncKey) {
	r.mu.Lock()
	defer r.mu.Unlock()
	b := r.repairs.urgentRetry[key]
	b.wait = min(max(2*b.wait, r.cfg.PollInterval), urgentBackoffMax)
	b.next = time.Now().Add(b.wait)
	r.repairs.urgentRetry[key] = b
}
