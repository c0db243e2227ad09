package replication

import (
	"context"
	"fmt"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fairshard/fairshard/outbox"
)

// handoverState holds the shards waiting before this node claims them;
// Replicator.mu guards it.
type handoverState struct {
	// since holds the shards this node became primary of while another
	// member was live, since when: out of the claim scope until nobody
	// else delivers them.
	since map[uint32]time.Time
	// failoverUntil holds, per shard waiting for a handover because its
	// old primary vanished from the view, the end of its FailoverGrace:
	// no round releases it before.
	failoverUntil map[uint32]time.Time
	// pullRetry holds, per shard waiting for a handover, when a failed
	// pull from a leftover copy may be tried again.
	pullRetry map[uint32]pullBackoff
}

// Handover: claims are not replicated, so a member that becomes a
// shard's primary while the old primary is alive (a node joined, R was
// raised, the old primary drains or came back) would find the rows the
// old primary is delivering pending in its own copy and deliver them a
// second time. So a new primary keeps such a shard out of its claim scope
// until every other live member reports that it holds no claimed row of
// it and no state change of it waiting to be shipped (StatesReply's
// Claimed and Unshipped) and names it the shard's primary (so it will not
// claim from the shard after answering: when two nodes join at once their
// short-lived views differ, and a compose scale-out 3 → 5 under load saw
// one row delivered twice), and every other synced replica of the set that
// holds a copy has the digest of ours: the old primary finishes its deliveries,
// its settles reach the new primary (by shipping, or by repair between
// the replicas), and only then does the new primary claim; a leftover
// holder's copy (the old primary outside the new set) is no digest test,
// so the rows it holds newer are pulled from it first (handoverRound). The digest condition matters when the new
// primary synced from a backup the old primary had not yet shipped a
// settle to (a backup just back from a partition). The wait is bounded by Config.HandoverTimeout (a stuck delivery
// or an unreachable member then costs a possible duplicate, never a
// loss). A failover waits only Config.FailoverGrace: the dead primary is
// not in the view and the backups hold no claims, but a primary declared
// dead by mistake is still claiming until its refute is heard.

// handoverLoop asks the other live members about the shards waiting for
// a handover every HandoverInterval (at once after a view change) and
// releases those nobody delivers any more.
func (r *Replicator) handoverLoop(ctx context.Context) error {
	for {
		if r.handoverRound(ctx) {
			if !sleep(ctx, r.cfg.HandoverInterval, r.handoverWake) {
				return nil
			}
			continue
		}
		if !sleep(ctx, time.Hour, r.handoverWake) {
			return nil
		}
	}
}

// startHandoverLocked marks the shards this node became primary of in v
// (it was not in prev) as waiting for a handover when another member is
// live, or when the old primary vanished from v (a failover: it may be
// refuting its death, and a handover round would find nobody to ask, so
// the shard also waits out FailoverGrace); shards it is no longer primary
// of stop waiting. r.mu held.
func (r *Replicator) startHandoverLocked(prev, v *View, alone bool) {
	now := time.Now()
	for s := range r.cfg.ShardCount {
		primary := !v.Leaving && v.primary(s) == v.Self
		_, grace := r.handovers.failoverUntil[s]
		gained := prev == nil || prev.Leaving || prev.primary(s) != v.Self
		switch {
		case !primary:
			r.endHandoverLocked(s)
		case gained && failedOver(prev, v, s):
			if _, ok := r.handovers.since[s]; !ok {
				r.handovers.since[s] = now
			}
			if !grace {
				r.handovers.failoverUntil[s] = now.Add(r.cfg.FailoverGrace)
			}
		case alone && !grace:
			r.endHandoverLocked(s)
		case gained:
			if _, ok := r.handovers.since[s]; !ok {
				r.handovers.since[s] = now
			}
		}
	}
	r.m.handoverShards.Set(float64(len(r.handovers.since)))
}

// failedOver reports whether shard s's primary in prev is gone from v
// (neither active nor leaving: it failed, or left without draining).
func failedOver(prev, v *View, s uint32) bool {
	if prev == nil || prev.Leaving {
		return false
	}
	old := prev.primary(s)
	_, live := v.Addrs[old]
	return old != "" && old != v.Self && !live
}

// Fence takes every shard this node is primary of out of its claim scope
// until a handover round releases it, as for a shard it has just become
// primary of: the node's process was paused (internal/pause), and while it
// did not run the others may have declared it dead and claimed from its
// shards, still delivering what they claimed and shipping what they
// settled. The round releases a shard once every live member names this
// node its primary again and none delivers or ships rows of it; after a
// pause nobody noticed, that is the next round. A node alone keeps its
// scope.
func (r *Replicator) Fence() {
	r.mu.Lock()
	v := r.view.Load()
	if v == nil || v.Leaving || len(v.peers()) == 0 {
		r.mu.Unlock()
		return
	}
	now := time.Now()
	for s := range r.cfg.ShardCount {
		if v.primary(s) == v.Self {
			if _, ok := r.handovers.since[s]; !ok {
				r.handovers.since[s] = now
			}
		}
	}
	r.m.handoverShards.Set(float64(len(r.handovers.since)))
	r.updateScopeLocked()
	r.mu.Unlock()
	wake(r.handoverWake)
	wake(r.pollWake)
}

// handoverRound asks every live peer about the shards waiting; it reports
// whether some still wait. A shard whose checks pass and that a leftover
// holder still holds (a member outside its set: the old primary after a
// rebalance or a drain) is released only after the newer versions of its
// rows there were pulled here (pullNewer): a settle the old primary
// committed under a view that did not yet name us was queued for the old
// set only, and at R = 1 for nobody.
func (r *Replicator) handoverRound(ctx context.Context) bool {
	v := r.view.Load()
	r.mu.Lock()
	waiting := make([]uint32, 0, len(r.handovers.since))
	for s := range r.handovers.since {
		waiting = append(waiting, s)
	}
	r.mu.Unlock()
	if v == nil || len(waiting) == 0 {
		return false
	}
	slices.Sort(waiting)
	peers := v.peers()
	states := r.gatherStates(ctx, v, peers, waiting)
	mine, err := r.localDigests(ctx)
	if err != nil {
		r.log.Warn("handover: read local digests", "err", err)
		return true
	}
	r.mu.Lock()
	if r.view.Load() != v {
		r.mu.Unlock()
		return true // a new view: its own round follows
	}
	pulls := r.judgeHandoversLocked(v, waiting, peers, states, mine)
	r.updateScopeLocked()
	r.mu.Unlock()
	r.pullFromLeftovers(ctx, v, pulls)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m.handoverShards.Set(float64(len(r.handovers.since)))
	return len(r.handovers.since) > 0
}

// judgeHandoversLocked decides each waiting shard's handover from the
// peers' answers: a shard nobody holds up (handoverBlocker) is released
// at once when no leftover copy holds anything newer, waits for our sync
// when one does and we are not synced yet (a pull before it would fetch
// row by row what the bulk copy brings), and is otherwise returned to be
// pulled from its leftover holders (unless its last pull failed and is
// backing off). A shard held up for HandoverTimeout is released anyway,
// with a warning. r.mu held.
func (r *Replicator) judgeHandoversLocked(v *View, waiting []uint32, peers []string, states map[string]StatesReply, mine map[uint32]outbox.ShardDigest) []handoverPull {
	var pulls []handoverPull
	now := time.Now()
	for _, s := range waiting {
		since, ok := r.handovers.since[s]
		if !ok {
			continue
		}
		if until, ok := r.handovers.failoverUntil[s]; ok && now.Before(until) {
			continue // a refute may still hand the shard back
		}
		busy, leftovers := handoverBlocker(v, s, peers, states, mine[s])
		switch {
		case busy == "" && len(leftovers) == 0:
			r.releaseHandoverLocked(s, since)
		case busy == "" && !r.syncs.synced[s]:
			// The pull waits for our sync (and the claim scope waits for
			// the sync too).
		case busy == "":
			if b, ok := r.handovers.pullRetry[s]; ok && b.since.Equal(since) && now.Before(b.next) {
				continue // the last pull failed: backing off
			}
			pulls = append(pulls, handoverPull{shard: s, since: since, holders: leftovers})
		case time.Since(since) >= r.cfg.HandoverTimeout:
			r.log.Warn("handover wait timed out: claiming the shard (rows still in flight elsewhere may be delivered twice)",
				"shard", s, "waited", time.Since(since).Round(time.Millisecond), "because", busy)
			r.releaseHandoverLocked(s, since)
		}
	}
	return pulls
}

// handoverBlocker checks every peer's answer about shard s: busy names
// the first peer that holds the handover up, and why ("" when none
// does), leftovers the peers outside the set whose copy differs from
// ours (mine). A peer holds it up when it did not answer, still has a
// claimed row of s or a change of it to ship, names another member the
// primary, or is a synced replica whose non-empty copy differs from ours.
func handoverBlocker(v *View, s uint32, peers []string, states map[string]StatesReply, mine outbox.ShardDigest) (busy string, leftovers []string) {
	for _, p := range peers {
		rep, ok := states[p]
		if !ok {
			return p + " did not answer", leftovers
		}
		st, _ := stateOf(rep, s)
		if st.Claimed > 0 || st.Unshipped {
			return p + " still delivers or ships", leftovers
		}
		// Until p's view names us, p may still claim from the shard
		// after this answer ("" is a member without a view, or of a
		// build that does not say: it does not hold the round up).
		if st.Primary != "" && st.Primary != v.Self {
			return p + " sees " + st.Primary + " as the primary", leftovers
		}
		same := st.Rows == mine.Rows && st.Sum == mine.Sum
		// Replicas only: a leftover copy (a node that left the set or
		// drains) lacks what was appended since, so its digest is no
		// test; what it holds newer is pulled (a copy equal to ours
		// holds nothing newer). Synced ones only: a replica still
		// syncing gets everything from its sync.
		if st.Replica && st.Synced && st.Rows > 0 && !same {
			return p + " holds a copy that differs from ours", leftovers
		}
		if !st.Replica && st.Rows > 0 && !same {
			leftovers = append(leftovers, p)
		}
	}
	return "", leftovers
}

// pullFromLeftovers runs the pulls of shards whose handover checks
// passed, SyncConcurrency shards at a time, and ends each one's wait by
// its outcome (endLeftoverPull). The leftover holders neither claim nor
// settle these shards any more (checked before): what they hold is final.
func (r *Replicator) pullFromLeftovers(ctx context.Context, v *View, pulls []handoverPull) {
	var g errgroup.Group
	g.SetLimit(r.cfg.SyncConcurrency)
	for _, job := range pulls {
		g.Go(func() error {
			err := r.pullLeftovers(ctx, v, job)
			r.endLeftoverPull(ctx, v, job, err)
			return nil
		})
	}
	_ = g.Wait()
}

// endLeftoverPull settles a pull's handover by its error err: a pull
// that succeeded releases the shard, one that failed past HandoverTimeout
// releases it with a warning, and any other failure backs the next pull
// of the shard off (doubling, from 250 ms to 5 s). A handover released
// meanwhile, restarted, or under a view other than v is left to the next
// round.
func (r *Replicator) endLeftoverPull(ctx context.Context, v *View, job handoverPull, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur, ok := r.handovers.since[job.shard]; !ok || !cur.Equal(job.since) || r.view.Load() != v {
		return // released, or a new view: its own round follows
	}
	switch {
	case err == nil:
		r.releaseHandoverLocked(job.shard, job.since)
	case time.Since(job.since) >= r.cfg.HandoverTimeout:
		r.log.Warn("handover wait timed out: claiming the shard (rows a leftover copy settled may be delivered twice)",
			"shard", job.shard, "waited", time.Since(job.since).Round(time.Millisecond), "because", err)
		r.releaseHandoverLocked(job.shard, job.since)
	default:
		b := r.handovers.pullRetry[job.shard]
		if !b.since.Equal(job.since) {
			b = pullBackoff{since: job.since}
		}
		b.wait = min(max(2*b.wait, 250*time.Millisecond), 5*time.Second)
		b.next = time.Now().Add(b.wait)
		r.handovers.pullRetry[job.shard] = b
		if ctx.Err() == nil {
			r.log.Info("handover: pull from a leftover copy failed; retrying", "shard", job.shard, "in", b.wait, "err", err)
		}
		return
	}
	r.updateScopeLocked()
}

// handoverPull is a shard whose handover checks passed, to be released
// once the rows its leftover holders hold newer are pulled here.
type handoverPull struct {
	shard   uint32
	since   time.Time // the handover wait's start
	holders []string
}

// pullBackoff spaces the pulls of a shard from a leftover copy after one
// failed, for the handover wait begun at since.
type pullBackoff struct {
	since, next time.Time
	wait        time.Duration
}

// pullLeftovers pulls into the local store the rows of job's shard that a
// leftover holder holds newer, and ships what it pulled to our backups
// (they lack it too: it was settled under a view that did not name them).
func (r *Replicator) pullLeftovers(ctx context.Context, v *View, job handoverPull) error {
	for _, p := range job.holders {
		keys, err := r.pullNewer(ctx, v.Addrs[p], job.shard)
		if err != nil {
			return fmt.Errorf("pull shard %d from %s: %w", job.shard, p, err)
		}
		if len(keys) > 0 {
			r.Changed(keys...)
			r.log.Info("handover: pulled rows a leftover copy had settled", "shard", job.shard, "from", p, "rows", len(keys))
		}
	}
	return nil
}

// releaseHandoverLocked ends shard s's handover wait, begun at since. The
// caller updates the claim scope. r.mu held.
func (r *Replicator) releaseHandoverLocked(s uint32, since time.Time) {
	r.endHandoverLocked(s)
	r.m.handoverWait.Observe(time.Since(since).Seconds())
}

// endHandoverLocked forgets shard s's handover wait. r.mu held.
func (r *Replicator) endHandoverLocked(s uint32) {
	delete(r.handovers.since, s)
	delete(r.handovers.pullRetry, s)
	delete(r.handovers.failoverUntil, s)
}
