package kv

import (
	"slices"
	"strings"
	"sync"
)

// Watch delivers accepted changes under a key prefix, local and remote.
// C receives a value whenever changes are pending; Changes drains them
// (latest entry per key, tombstones included). A slow reader never blocks
// gossip and never misses the latest value of a key: pending changes
// coalesce per key. Collecting a tombstone is not a change (the key was
// already deleted). Safe for concurrent use.
type Watch struct {
	s      *Store
	name   string
	prefix string
	ch     chan struct{}

	mu      sync.Mutex
	pending map[string]Entry
	closed  bool
}

// Watch starts a watch of keys starting with prefix ("" for all). name
// labels the watcher in logs. Close it when done; Store.Close closes all
// watches (C is then closed).
func (s *Store) Watch(name, prefix string) *Watch {
	w := &Watch{s: s, name: name, prefix: prefix, ch: make(chan struct{}, 1), pending: map[string]Entry{}}
	s.watchMu.Lock()
	defer s.watchMu.Unlock()
	if s.watches == nil { // closed
		w.closed = true
		close(w.ch)
		return w
	}
	s.watches[w] = struct{}{}
	return w
}

// C returns the notification channel; it is closed by Close or by the
// Store's Close.
func (w *Watch) C() <-chan struct{} { return w.ch }

// Changes returns and forgets the pending changes, sorted by key.
func (w *Watch) Changes() []Entry {
	w.mu.Lock()
	out := make([]Entry, 0, len(w.pending))
	for _, e := range w.pending {
		out = append(out, e.Clone())
	}
	clear(w.pending)
	w.mu.Unlock()
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// Close stops the watch and closes C. It is idempotent.
func (w *Watch) Close() {
	w.s.watchMu.Lock()
	if w.s.watches != nil {
		delete(w.s.watches, w)
	}
	w.s.watchMu.Unlock()
	w.close()
}

func (w *Watch) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.ch)
	}
}

func (w *Watch) add(e Entry) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return
	}
	w.pending[e.Key] = e
	poke(w.ch)
}

// notify hands accepted entries to the watches whose prefix they match.
func (s *Store) notify(es []Entry) {
	s.watchMu.RLock()
	defer s.watchMu.RUnlock()
	for w := range s.watches {
		for _, e := range es {
			if strings.HasPrefix(e.Key, w.prefix) {
				w.add(e)
			}
		}
	}
}
