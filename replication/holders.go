package replication

import (
	"slices"
	"time"
)

// Leftover holders. A member that leaves a shard's replica set keeps its
// copy (a leftover) until the new set answers as synced copies (drop.go),
// and a leftover copy is a sync source: a new member of the set with no
// synced replica to copy from (the primary wiped, its backup cut off)
// takes the union of every holder's rows. A settle the leftover lacks is
// then delivered a second time. So each state change is also queued, as
// a change of the member's outside queue (see outsideQueue: the member is
// asked first whether it still holds rows of the shard, is sent only
// those it does, and gets outsideTries tries), for every live, active
// member known to hold a leftover copy of the row's shard.
//
// The shipper knows a member holds a leftover copy of a shard when
//   - a view change took it out of the shard's set (retarget; a member
//     that turned leaving is not marked: its drain hands its copies to
//     the sets and deletes them, and a change shipped to it would only
//     re-mark rows the drain must hand back);
//   - it answered a States call (a sync round, a repair poll) holding
//     rows of a shard this node's view puts it outside the set of;
//   - it answered its outside queue's question holding rows of it.
//
// The mark goes when the member answers its outside queue's question
// holding none of the shard (asked after the mark was made or last
// confirmed), when it is back in the shard's set (shipped to as a
// replica), or lostMarkTTL after it was last confirmed. Memory: at most
// maxLeftoverHolders marks per shard (past it the mark confirmed longest
// ago is given up), so ShardCount × maxLeftoverHolders at most.
//
// Given up: a holder this node never learnt of (it left the set before
// this node's first view, or while this node was down, and no States
// answer has shown it since) gets no changes from this node; nor does
// one whose mark was evicted or expired; and a change a holder missed
// (its tries given up, its queue over MaxPending, this node killed
// before shipping) stays missed until the holder drops its copy. A
// holder that drops its copy between the question and the batch gets
// the batch's rows back (merged): a leftover copy in their latest state,
// which its next drop pass hands to the set and deletes again.

// maxLeftoverHolders bounds the leftover holders remembered per shard. A
// shard's set changes by at most R members per view change, and a
// leftover normally goes within seconds of the new set syncing.
const maxLeftoverHolders = 8

// holdLocked records that member m held a leftover copy of shard at at
// (see shipper.holders). s.mu held.
func (s *shipper) holdLocked(shard uint32, m string, at time.Time) {
	ms := s.holders[shard]
	if ms == nil {
		ms = map[string]time.Time{}
		s.holders[shard] = ms
	}
	if prev, ok := ms[m]; ok {
		if at.After(prev) {
			ms[m] = at
		}
		return
	}
	if len(ms) >= maxLeftoverHolders {
		oldest := ""
		for name, t := range ms {
			if oldest == "" || t.Before(ms[oldest]) {
				oldest = name
			}
		}
		delete(ms, oldest)
	}
	ms[m] = at
}

// releasedLocked forgets that member m holds a leftover copy of shard, if
// it was not known to hold one later than asked (when the question that
// found none was sent). s.mu held.
func (s *shipper) releasedLocked(shard uint32, m string, asked time.Time) {
	ms := s.holders[shard]
	if at, ok := ms[m]; !ok || at.After(asked) {
		return
	}
	delete(ms, m)
	if len(ms) == 0 {
		delete(s.holders, shard)
	}
}

// retargetHoldersLocked marks the members that v took out of a shard's
// set (prev is the view before v) as holding a leftover copy of it, and
// forgets the marks of members back in the set and those not confirmed
// for lostMarkTTL. s.active is v's already. s.mu held.
func (s *shipper) retargetHoldersLocked(prev, v *View, now time.Time) {
	if prev != nil {
		for sh := range v.ShardCount {
			for _, m := range prev.set(sh) {
				if m == v.Self || v.inSet(m, sh) {
					continue
				}
				if _, live := v.Addrs[m]; live && !s.active[m] {
					continue // leaving: its drain hands the copy over
				}
				s.holdLocked(sh, m, now)
			}
		}
	}
	for sh, ms := range s.holders {
		for m, at := range ms {
			if v.inSet(m, sh) || now.Sub(at) > lostMarkTTL {
				delete(ms, m)
			}
		}
		if len(ms) == 0 {
			delete(s.holders, sh)
		}
	}
}

// leftoversLocked queues a change of key (of shard) for the live, active
// members v puts outside the shard's set that are known to hold a
// leftover copy of it. s.mu held.
func (s *shipper) leftoversLocked(v *View, key string, shard uint32, now time.Time) {
	for m := range s.holders[shard] {
		if _, live := v.Addrs[m]; !live || m == v.Self || !s.active[m] || v.inSet(m, shard) {
			continue
		}
		s.enqueueOutsideLocked(m, key, shard, now)
	}
}

// enqueueOutsideLocked queues a change of key (of shard) in member m's
// outside queue (both created if need be). Past MaxPending changes the
// queue takes no more: the member is no replica of their shards. s.mu
// held.
func (s *shipper) enqueueOutsideLocked(m, key string, shard uint32, now time.Time) {
	o := s.queueLocked(m).outsideQueue()
	if e := o.entries[key]; e != nil {
		e.changed(now)
		return
	}
	if len(o.entries) >= s.r.cfg.MaxPending {
		return
	}
	o.put(key, &shipEntry{shard: shard, since: now, gen: 1})
	s.total++
}

// addLeftovers queues the current copies of keys, changed here by a
// repair or a sync (rows pulled from a replica), for the leftover holders
// of their shards: the shipper that made the change queued it for the
// set, and for the holders it knew of.
func (s *shipper) addLeftovers(v *View, keys []string) {
	now := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, key := range keys {
		s.leftoversLocked(v, key, s.r.shardOf(key), now)
	}
	s.r.m.pending.Set(float64(s.total))
}

// noteStates records the leftover copies a States answer of peer shows:
// shards it holds rows of that v puts it outside the set of. at is when
// the answer arrived.
func (s *shipper) noteStates(v *View, peer string, rep StatesReply, at time.Time) {
	if v == nil || peer == v.Self {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, st := range rep.States {
		if st.Rows > 0 && int(st.Shard) < len(v.Sets) && !slices.Contains(v.set(st.Shard), peer) {
			s.holdLocked(st.Shard, peer, at)
		}
	}
}
