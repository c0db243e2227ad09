package kv

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Store is one node's replica of the gossiped map. Build it with New; it
// is safe for concurrent use. A host (cluster) feeds it its peers' gossip
// (MergeMessage, MergeRemoteState), serves its full state (LocalState),
// tells it the live members (SetMembers) and runs its two loops
// (RunPersist, RunCollect) until it stops them, then calls Close.
type Store struct {
	cfg Config
	m   *metrics

	// writeMu serialises local writes and persistence, so the Persister is
	// never called concurrently and never stores an older version after a
	// newer one. It is taken before mu.
	writeMu   sync.Mutex
	persisted map[string]Version // what the Persister holds, per key

	mu      sync.RWMutex
	entries map[string]*record
	clock   uint64              // hybrid logical clock (Version)
	live    int                 // entries that are not tombstones
	bytes   int                 // encoded bytes of live entries
	tomb    int                 // tombstones
	tbytes  int                 // encoded bytes of tombstones
	pending map[string]struct{} // keys whose persisted copy may be stale
	// ghosts remembers collected tombstones until their TTL, outside the
	// state: a copy they supersede (the tombstone itself, sent back by a
	// peer that has not collected it yet, or an older value) is refused,
	// so a collected tombstone does not bounce between replicas for ever.
	ghosts  map[string]Entry
	known   map[string]time.Time // member name → last time it was live
	current map[string]bool      // members live now
	lastRep report               // the latest full state merged

	persistCh chan struct{} // 1-buffered: pending changed

	watchMu sync.RWMutex
	watches map[*Watch]struct{} // nil after Close

	closed atomic.Bool
}

// record is one key's entry plus this node's bookkeeping.
type record struct {
	e    Entry
	size int // encodedSize(e)
	// tombstones only: when this store accepted it, and per member the
	// time of the latest full state from that member showing it had seen
	// it (a version at least as new, or no entry for the key).
	acceptedAt time.Time
	acks       map[string]time.Time
}

type report struct {
	from string
	at   time.Time
}

// New validates cfg, loads cfg.Initial and registers the metrics. It
// starts nothing: the host runs RunPersist and RunCollect.
func New(cfg Config) (*Store, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Store{
		cfg:       cfg,
		persisted: make(map[string]Version),
		entries:   make(map[string]*record),
		pending:   make(map[string]struct{}),
		ghosts:    make(map[string]Entry),
		known:     make(map[string]time.Time),
		current:   map[string]bool{cfg.Node: true},
		persistCh: make(chan struct{}, 1),
		watches:   make(map[*Watch]struct{}),
	}
	now := cfg.Now()
	s.known[cfg.Node] = now
	for _, e := range cfg.Initial {
		e = e.Clone()
		if len(e.Value) == 0 {
			e.Value = nil
		}
		if e.Deleted && e.DeletedAt == 0 {
			e.DeletedAt = now.UnixMilli()
		}
		_, _ = s.apply(e, now)
		// It came from the Persister. An expired tombstone is not taken
		// in: RunPersist forgets what is stored but not held.
		s.persisted[e.Key] = e.Version
		if r := s.entries[e.Key]; r == nil || r.e.Version != e.Version {
			s.pending[e.Key] = struct{}{}
		}
	}
	for k, r := range s.entries {
		s.persisted[k] = r.e.Version
		delete(s.pending, k)
	}
	m, err := newMetrics(s, cfg.Registerer)
	if err != nil {
		return nil, err
	}
	s.m = m
	s.m.sync(s)
	return s, nil
}

// Node returns this store's node name.
func (s *Store) Node() string { return s.cfg.Node }

// Write is one change of an Update: Key = Value, or Key deleted.
type Write struct {
	Key    string
	Value  []byte
	Delete bool
}

// Put writes key = value and returns the entry written. It returns once
// the Persister stored it and it is applied here and handed to Broadcast;
// peers see it within a few gossip rounds, a peer that is down catches up
// by push/pull when it comes back. A concurrent newer write of the key
// (on any node) supersedes it: last writer wins. Errors: ctx's, an
// ErrInvalidEntry for a bad key or value, a *LimitError (ErrLimit) past a
// cap, ErrClosed, or the Persister's (wrapped); on error nothing changed.
func (s *Store) Put(ctx context.Context, key string, value []byte) (Entry, error) {
	es, err := s.Update(ctx, Write{Key: key, Value: value})
	if err != nil {
		return Entry{}, err
	}
	return es[0], nil
}

// Delete deletes key by writing a tombstone and returns it. Deleting an
// absent key still writes a tombstone, which also overrides any older
// write still in flight. A delete never fails a cap. Errors as for Put.
func (s *Store) Delete(ctx context.Context, key string) (Entry, error) {
	es, err := s.Update(ctx, Write{Key: key, Delete: true})
	if err != nil {
		return Entry{}, err
	}
	return es[0], nil
}

// Update applies several writes as one: all are validated and checked
// against the caps first (a refused write changes nothing), then each is
// persisted in order and applied. If the Persister fails part way, the
// writes it stored are applied (they are durable) and the rest are not;
// the error says how many were applied, and repeating the Update is safe.
// It returns the entries written, in order. Errors as for Put.
func (s *Store) Update(ctx context.Context, writes ...Write) ([]Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s.closed.Load() {
		return nil, ErrClosed
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	now := s.cfg.Now()
	out := make([]Entry, len(writes))
	for i, w := range writes {
		e := Entry{Key: w.Key, Value: bytes.Clone(w.Value), Deleted: w.Delete}
		if len(e.Value) == 0 {
			e.Value = nil
		}
		if e.Deleted {
			e.Value, e.DeletedAt = nil, now.UnixMilli() // dated by the clock below
		}
		e.Version.Node = s.cfg.Node
		if err := e.Validate(); err != nil {
			return nil, err
		}
		out[i] = e
	}
	if err := s.checkCaps(out); err != nil {
		s.m.refused(err)
		return nil, err
	}
	s.mu.Lock()
	for i := range out {
		s.clock = max(s.clock+1, uint64(now.UnixMilli()))
		out[i].Version.Clock = s.clock
		if out[i].Deleted {
			// The hybrid clock, not the bare wall clock: a node whose wall
			// clock lags still dates its delete no earlier than every clock
			// it has seen, so peers do not take it for an expired one.
			out[i].DeletedAt = int64(s.clock)
		}
	}
	s.mu.Unlock()

	applied := out
	var perr error
	if p := s.cfg.Persister; p != nil {
		for i, e := range out {
			if err := p.Save(ctx, e.Clone()); err != nil {
				applied = out[:i]
				perr = fmt.Errorf("persist config key %q version %s (%d of %d writes applied): %w", e.Key, e.Version, i, len(out), err)
				break
			}
			s.persisted[e.Key] = e.Version
		}
	}
	s.accept(applied, "local", now)
	if perr != nil {
		return nil, perr
	}
	for i := range out {
		out[i] = out[i].Clone()
	}
	return out, nil
}

// checkCaps refuses writes that would take the live entries past
// MaxEntries or MaxBytes. A write that does not grow a figure passes, so
// deletes and shrinking writes are always possible at the cap.
func (s *Store) checkCaps(writes []Entry) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	count, size := s.live, s.bytes
	seen := map[string]int{} // key → live size after the earlier writes of this batch
	for _, e := range writes {
		cur, ok := seen[e.Key]
		if !ok {
			if r := s.entries[e.Key]; r != nil && !r.e.Deleted {
				cur = r.size
			} else {
				cur = -1
			}
		}
		next := -1
		if !e.Deleted {
			next = encodedSize(Entry{Key: e.Key, Value: e.Value, Version: Version{Clock: 1 << 42, Node: e.Version.Node}})
		}
		if cur >= 0 {
			count--
			size -= cur
		}
		if next >= 0 {
			count++
			size += next
		}
		seen[e.Key] = next
	}
	if count > s.live && count > s.cfg.MaxEntries {
		return &LimitError{Limit: "entries", Max: s.cfg.MaxEntries, Have: s.live, Want: count}
	}
	if size > s.bytes && size > s.cfg.MaxBytes {
		return &LimitError{Limit: "bytes", Max: s.cfg.MaxBytes, Have: s.bytes, Want: size}
	}
	return nil
}

// accept applies entries that are already persisted (local) or came from
// a peer (remote): merged in, broadcast, watchers woken, remote ones
// queued for persistence. It never blocks for long (memberlist callbacks
// call it).
func (s *Store) accept(es []Entry, source string, now time.Time) []Entry {
	var won, repair []Entry
	s.mu.Lock()
	for _, e := range es {
		ok, ghost := s.apply(e, now)
		if ok {
			e = s.entries[e.Key].e // the stored copy, not the message's bytes
		}
		if ghost != nil && !e.Deleted {
			// A peer still holds a value the collected delete superseded:
			// tell it again, the state no longer carries the tombstone.
			repair = append(repair, *ghost)
		}
		if !ok {
			continue
		}
		won = append(won, e)
		if source != "local" && s.cfg.Persister != nil {
			s.pending[e.Key] = struct{}{}
		}
	}
	s.m.sync(s)
	s.mu.Unlock()
	if s.cfg.Broadcast != nil {
		for _, e := range repair {
			s.cfg.Broadcast(e.Key, encodeEntryMsg(e))
		}
	}
	if len(won) == 0 {
		return nil
	}
	s.m.updates.WithLabelValues(source).Add(float64(len(won)))
	if source != "local" && s.cfg.Persister != nil {
		poke(s.persistCh)
	}
	for _, e := range won {
		if s.cfg.Broadcast != nil {
			s.cfg.Broadcast(e.Key, encodeEntryMsg(e))
		}
	}
	s.notify(won)
	return won
}

// apply merges e into the map under s.mu and reports whether it won; when
// a ghost (a collected tombstone) refused it, it returns that ghost. It
// moves the clock past e's (witness) even when e loses. A tombstone older
// than TombstoneTTL is not taken in: it counts as collected.
func (s *Store) apply(e Entry, now time.Time) (bool, *Entry) {
	s.clock = max(s.clock, e.Version.Clock)
	if g, ok := s.ghosts[e.Key]; ok {
		if Compare(e, g) <= 0 {
			return false, &g
		}
		delete(s.ghosts, e.Key) // a newer write of the key: the ghost is done
	}
	cur := s.entries[e.Key]
	if cur != nil && Compare(e, cur.e) <= 0 {
		return false, nil
	}
	if e.Deleted && now.UnixMilli()-e.DeletedAt >= s.cfg.TombstoneTTL.Milliseconds() {
		return false, nil
	}
	if cur != nil {
		s.uncount(cur)
	}
	e = e.Clone() // the caller's slice may alias a gossip message
	r := &record{e: e, size: encodedSize(e)}
	if e.Deleted {
		r.acceptedAt = now
		r.acks = map[string]time.Time{}
	}
	s.entries[e.Key] = r
	s.count(r)
	return true, nil
}

func (s *Store) count(r *record) {
	if r.e.Deleted {
		s.tomb++
		s.tbytes += r.size
	} else {
		s.live++
		s.bytes += r.size
	}
}

func (s *Store) uncount(r *record) {
	if r.e.Deleted {
		s.tomb--
		s.tbytes -= r.size
	} else {
		s.live--
		s.bytes -= r.size
	}
}

// Get returns the live entry of key; ok is false when the key is absent
// or deleted.
func (s *Store) Get(key string) (Entry, bool) {
	s.mu.RLock()
	r := s.entries[key]
	s.mu.RUnlock()
	if r == nil || r.e.Deleted {
		return Entry{}, false
	}
	return r.e.Clone(), true
}

// List returns the live entries whose key starts with prefix ("" for
// all), sorted by key.
func (s *Store) List(prefix string) []Entry { return s.list(prefix, false) }

// All returns every entry, tombstones included, sorted by key: the full
// replicated state, e.g. to compare replicas or export a backup.
func (s *Store) All() []Entry { return s.list("", true) }

// Count returns how many live entries have a key starting with prefix.
func (s *Store) Count(prefix string) int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := 0
	for k, r := range s.entries {
		if !r.e.Deleted && strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

func (s *Store) list(prefix string, tombstones bool) []Entry {
	s.mu.RLock()
	out := make([]Entry, 0, len(s.entries))
	for k, r := range s.entries {
		if strings.HasPrefix(k, prefix) && (tombstones || !r.e.Deleted) {
			out = append(out, r.e.Clone())
		}
	}
	s.mu.RUnlock()
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Stats is a snapshot of the store's size and sync state.
type Stats struct {
	// Live and Tombstones count entries; LiveBytes and StateBytes are
	// encoded sizes: of the live entries (the MaxBytes figure) and of the
	// whole state LocalState sends, tombstones and framing included.
	Live, Tombstones      int
	LiveBytes, StateBytes int
	// PersistPending counts keys whose change is not yet durable here.
	PersistPending int
	// Ghosts counts collected tombstones still remembered (outside the
	// state) to refuse the copies they superseded.
	Ghosts int
	// LastStateFrom and LastStateAt tell the latest peer whose full state
	// was merged, and when; empty before the first push/pull.
	LastStateFrom string
	LastStateAt   time.Time
}

// Stats returns the store's current figures.
func (s *Store) Stats() Stats {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return Stats{
		Live: s.live, Tombstones: s.tomb, LiveBytes: s.bytes,
		StateBytes:     s.stateBytes(),
		PersistPending: len(s.pending),
		Ghosts:         len(s.ghosts),
		LastStateFrom:  s.lastRep.from, LastStateAt: s.lastRep.at,
	}
}

// stateBytes is the size LocalState would have (s.mu held).
func (s *Store) stateBytes() int {
	n := len(s.entries)
	return 2 + uvarintLen(uint64(len(s.cfg.Node))) + len(s.cfg.Node) + uvarintLen(uint64(n)) + s.bytes + s.tbytes
}

// Close closes every Watch, unregisters the metrics and refuses further
// writes. The host stops RunPersist and RunCollect first (RunPersist
// flushes on its way out). Idempotent.
func (s *Store) Close() {
	if s.closed.Swap(true) {
		return
	}
	s.watchMu.Lock()
	ws := s.watches
	s.watches = nil
	s.watchMu.Unlock()
	for w := range ws {
		w.close()
	}
	s.m.unregister()
}

// poke does a non-blocking send on a 1-buffered wake-up channel: bursts
// merge into one wake-up.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
