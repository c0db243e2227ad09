package kv

import (
	"context"
	"slices"
	"time"

	"github.com/fairshard/fairshard/internal/tick"
)

// RunCollect collects tombstones every CollectInterval until ctx ends,
// then returns nil. See Collect for the rule.
func (s *Store) RunCollect(ctx context.Context) error {
	return tick.Every(ctx, s.cfg.CollectInterval, func(context.Context) { s.Collect() })
}

// Collect removes the tombstones that no replica needs any more and
// returns how many it removed, by reason. A tombstone of key k at version
// v is collected when
//
//   - "acked": it is at least TombstoneMinAge old here, and every member
//     (live now, or live less than TombstoneTTL ago; SetMembers) has sent
//     this node, at least TombstoneMinAge after this node took the
//     tombstone in, a full state whose copy of k is at least v or which has
//     no k at all (it collected k already) — dskit's "once everyone has
//     seen it";
//   - "ttl": it was written (DeletedAt) TombstoneTTL ago or more — the
//     bounded time, whoever has not seen it; or
//   - "cap": more than MaxTombstones are held; the oldest go first.
//
// A collected tombstone leaves the state (and the Persister, by Forget).
// This node remembers it in memory (a ghost, outside the state) until its
// TTL, and refuses it and any older copy of the key meanwhile: a peer
// that has not collected it yet sends it back in every push/pull, and
// without the ghost it would be taken in again, forever, since push/pull
// runs more often than TombstoneMinAge. A ghost that refuses an older
// value re-broadcasts the delete, so a peer holding a stale copy (one that
// came back from a long absence) learns the delete after all. The waiting on reports received TombstoneMinAge after the tombstone
// arrived is what makes "no k at all" safe: by then the tombstone's own
// gossip has reached every live member, so none of them still carries an
// older copy it could hand on. What is not covered: a member away longer
// than TombstoneTTL (or gone when the cap forced an early collection)
// may come back with an older copy of a collected key, and that copy
// wins again. docs/adr/0036-config-tombstone-collection.md states the rule
// and its limit.
func (s *Store) Collect() map[string]int {
	now := s.cfg.Now()
	ttl := s.cfg.TombstoneTTL.Milliseconds()
	out := map[string]int{}
	s.mu.Lock()
	s.forgetMembers(now)
	var rest []*record
	for k, r := range s.entries {
		if !r.e.Deleted {
			continue
		}
		switch {
		case now.UnixMilli()-r.e.DeletedAt >= ttl:
			s.remove(k, r, false)
			out["ttl"]++
		case s.seenByAll(r, now):
			s.remove(k, r, true)
			out["acked"]++
		default:
			rest = append(rest, r)
		}
	}
	if over := len(rest) - s.cfg.MaxTombstones; over > 0 {
		slices.SortFunc(rest, func(a, b *record) int {
			if c := a.acceptedAt.Compare(b.acceptedAt); c != 0 {
				return c
			}
			return Compare(a.e, b.e)
		})
		for _, r := range rest[:over] {
			s.remove(r.e.Key, r, true)
			out["cap"]++
		}
	}
	for k, g := range s.ghosts {
		if now.UnixMilli()-g.DeletedAt >= ttl {
			delete(s.ghosts, k)
		}
	}
	if over := len(s.ghosts) - maxGhosts(s.cfg.MaxTombstones); over > 0 {
		gs := make([]Entry, 0, len(s.ghosts))
		for _, g := range s.ghosts {
			gs = append(gs, g)
		}
		slices.SortFunc(gs, func(a, b Entry) int { return Compare(a, b) })
		for _, g := range gs[:over] {
			delete(s.ghosts, g.Key)
		}
	}
	s.m.sync(s)
	s.mu.Unlock()
	for reason, n := range out {
		s.m.collected.WithLabelValues(reason).Add(float64(n))
	}
	if len(out) > 0 {
		if s.cfg.Persister != nil {
			poke(s.persistCh)
		}
		if out["cap"] > 0 {
			s.cfg.Logger.Warn("more tombstones than MaxTombstones: the oldest were collected before every member had seen them",
				"collected", out["cap"], "max_tombstones", s.cfg.MaxTombstones)
		}
	}
	return out
}

// seenByAll reports whether every member that counts has acknowledged r
// late enough (s.mu held).
func (s *Store) seenByAll(r *record, now time.Time) bool {
	minAge := s.cfg.TombstoneMinAge
	if now.Sub(r.acceptedAt) < minAge {
		return false
	}
	for n := range s.known {
		if n == s.cfg.Node {
			continue
		}
		at, ok := r.acks[n]
		if !ok || at.Sub(r.acceptedAt) < minAge {
			return false
		}
	}
	return true
}

// maxGhosts bounds the ghosts kept (memory only, about 300 bytes each):
// past it the oldest are forgotten, and a peer may send those tombstones
// back once more, to be collected again.
func maxGhosts(maxTombstones int) int { return 4 * maxTombstones }

// remove drops a tombstone from the map (s.mu held), remembers it as a
// ghost when asked, and queues its removal from the Persister.
func (s *Store) remove(key string, r *record, ghost bool) {
	delete(s.entries, key)
	s.uncount(r)
	if ghost {
		s.ghosts[key] = r.e
	}
	if s.cfg.Persister != nil {
		s.pending[key] = struct{}{}
	}
}
