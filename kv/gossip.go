package kv

import (
	"errors"
	"time"
)

// The host side: what a gossip layer (cluster, over memberlist's
// Delegate) calls. None of these blocks for long or calls back into the
// host, so they are safe from memberlist's callbacks.

// LocalState returns this node's full state for a push/pull: every entry,
// tombstones included, and this node's name, so the receiver can tell
// which member has seen which tombstone.
func (s *Store) LocalState() []byte {
	s.mu.RLock()
	entries := make([]Entry, 0, len(s.entries))
	for _, r := range s.entries {
		entries = append(entries, r.e)
	}
	size := s.bytes + s.tbytes
	b := encodeState(s.cfg.Node, entries, size)
	s.mu.RUnlock()
	s.m.stateSent.Observe(float64(len(b)))
	return b
}

// MergeRemoteState merges a peer's full state (LocalState of another
// node) and records, for each tombstone held here, whether that peer has
// seen it. It returns an error for a state it cannot decode (nothing is
// merged then; the error is also counted and logged).
func (s *Store) MergeRemoteState(buf []byte) error {
	d, err := s.decode(buf, "push_pull")
	if err != nil {
		return err
	}
	if d.kind != msgState {
		return s.drop("decode", errors.New("kv gossip: push/pull carried a single entry, not a state"))
	}
	now := s.cfg.Now()
	s.accept(d.entries, "remote", now)

	// The sender's versions, to date its acknowledgements.
	theirs := make(map[string]Version, len(d.entries))
	for _, e := range d.entries {
		theirs[e.Key] = e.Version
	}
	s.mu.Lock()
	for key, r := range s.entries {
		if !r.e.Deleted {
			continue
		}
		if v, ok := theirs[key]; !ok || v.Compare(r.e.Version) >= 0 {
			r.acks[d.sender] = now
		} else {
			delete(r.acks, d.sender) // it still holds an older copy
		}
	}
	s.lastRep = report{from: d.sender, at: now}
	s.mu.Unlock()
	return nil
}

// MergeMessage merges one gossiped entry (a Broadcast message of a peer).
// It returns an error for a message it cannot decode (counted and logged).
func (s *Store) MergeMessage(buf []byte) error {
	d, err := s.decode(buf, "gossip")
	if err != nil {
		return err
	}
	if d.kind != msgEntry {
		return s.drop("decode", errors.New("kv gossip: a broadcast carried a full state"))
	}
	s.accept(d.entries, "remote", s.cfg.Now())
	return nil
}

func (s *Store) decode(buf []byte, via string) (decoded, error) {
	d, err := decode(buf)
	if err == nil {
		return d, nil
	}
	reason := "decode"
	if errors.Is(err, errWireVersion) {
		reason = "protocol_version"
	}
	s.cfg.Logger.Warn("dropping config gossip", "via", via, "reason", reason, "error", err)
	s.m.dropped.WithLabelValues(reason).Inc()
	return d, err
}

func (s *Store) drop(reason string, err error) error {
	s.cfg.Logger.Warn("dropping config gossip", "reason", reason, "error", err)
	s.m.dropped.WithLabelValues(reason).Inc()
	return err
}

// SetMembers tells the store which members are live now (this node
// included or not: it always counts itself). Every tombstone must be seen
// by each of them, and by each member that was live less than
// TombstoneTTL ago, before it is collected early (see RunCollect).
func (s *Store) SetMembers(names []string) {
	now := s.cfg.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for n := range s.current { // live until now, whether or not still live
		s.known[n] = now
	}
	clear(s.current)
	s.current[s.cfg.Node] = true
	for _, n := range names {
		s.current[n] = true
	}
	for n := range s.current {
		s.known[n] = now
	}
	s.forgetMembers(now)
}

// forgetMembers drops members not live for TombstoneTTL (s.mu held).
func (s *Store) forgetMembers(now time.Time) {
	for n, last := range s.known {
		if !s.current[n] && now.Sub(last) >= s.cfg.TombstoneTTL {
			delete(s.known, n)
		}
	}
}

// Members returns the members a tombstone must be seen by: live now or
// less than TombstoneTTL ago, this node included.
func (s *Store) Members() []string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	out := make([]string, 0, len(s.known))
	for n := range s.known {
		out = append(out, n)
	}
	return out
}
