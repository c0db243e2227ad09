package kv

import (
	"context"
	"slices"
	"time"
)

// finalFlushTimeout bounds RunPersist's last attempt after its context
// ended.
const finalFlushTimeout = 5 * time.Second

// RunPersist hands remote changes (and collected tombstones, as Forget) to
// the Persister, latest version per key, one at a time, until ctx ends.
// A key whose persistence failed stays pending and is retried with
// exponential backoff (PersistRetryMin doubling up to PersistRetryMax)
// until it succeeds: the same version arriving again by gossip is not a
// change and would never bring it back. When ctx ends it makes one last
// attempt, bounded by 5 s, and returns nil. Without a Persister it just
// waits for ctx.
func (s *Store) RunPersist(ctx context.Context) error {
	if s.cfg.Persister == nil {
		<-ctx.Done()
		return nil
	}
	backoff := time.Duration(0)
	var retry <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finalFlushTimeout)
			left := s.PersistPending(fctx)
			cancel()
			if left > 0 {
				s.cfg.Logger.Error("config entries not persisted at stop; peers still hold them and push/pull brings them back",
					"keys", left)
			}
			return nil
		case <-s.persistCh:
		case <-retry:
		}
		if s.PersistPending(ctx) == 0 {
			backoff, retry = 0, nil
			continue
		}
		backoff = min(max(2*backoff, s.cfg.PersistRetryMin), s.cfg.PersistRetryMax)
		retry = time.After(backoff)
	}
}

// PersistPending makes one attempt at every pending key and returns how
// many are still pending (failed). RunPersist calls it; tests call it to
// persist without waiting on the loop.
func (s *Store) PersistPending(ctx context.Context) int {
	p := s.cfg.Persister
	if p == nil {
		return 0
	}
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	s.mu.Lock()
	keys := make([]string, 0, len(s.pending))
	for k := range s.pending {
		keys = append(keys, k)
	}
	s.mu.Unlock()
	slices.Sort(keys)

	failed := 0
	for _, k := range keys {
		if ctx.Err() != nil {
			return len(keys) // the rest stays pending
		}
		s.mu.RLock()
		r := s.entries[k]
		var e Entry
		if r != nil {
			e = r.e.Clone()
		}
		s.mu.RUnlock()
		stored, onDisk := s.persisted[k]
		var err error
		switch {
		case r != nil && (!onDisk || stored != e.Version):
			if err = p.Save(ctx, e); err == nil {
				s.persisted[k] = e.Version
			}
		case r == nil && onDisk:
			if err = p.Forget(ctx, k); err == nil {
				delete(s.persisted, k)
			}
		}
		if err != nil {
			failed++
			s.m.persistErrors.Inc()
			s.cfg.Logger.Error("persisting config entry failed; retrying", "key", k, "version", e.Version.String(),
				"forget", r == nil, "error", err)
			continue
		}
		s.mu.Lock()
		// Done unless a newer change arrived meanwhile (accept re-marks it).
		if r2 := s.entries[k]; (r2 == nil && r == nil) || (r2 != nil && r != nil && r2.e.Version == e.Version) {
			delete(s.pending, k)
		}
		s.m.sync(s)
		s.mu.Unlock()
	}
	return failed
}
