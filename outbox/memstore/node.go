package memstore

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/fairshard/fairshard/outbox"
)

// The calls below are what a node needs of its store beside the contract
// and the shard-level calls (package node's Store): the admin reads, the
// ceiling's held-claims count and the persisted gossiped config. They let
// a node run on memstore in tests.

// ListDeadLetters returns up to limit failed rows of namespace (any shard)
// whose dispatch_key sorts strictly after afterKey, ordered by
// dispatch_key ("" starts at the beginning; limit ≤ 0 returns nothing).
func (s *Store) ListDeadLetters(ctx context.Context, namespace, afterKey string, limit int) ([]outbox.Row, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if limit <= 0 {
		return nil, nil
	}
	var out []outbox.Row
	for _, r := range s.rows {
		if r.Namespace == namespace && r.Status == outbox.StatusFailed && r.DispatchKey > afterKey {
			out = append(out, r.Clone())
		}
	}
	slices.SortFunc(out, func(a, b outbox.Row) int { return strings.Compare(a.DispatchKey, b.DispatchKey) })
	if len(out) > limit {
		out = out[:limit]
	}
	return out, nil
}

// ListDeadLetterPage returns one page of the failed rows of namespace
// (any shard) after q.After (and not after q.Through, when set), in
// dispatch_key order, bounded by q.Limit rows and q.MaxBytes bytes
// (outbox.RowBytes; at least one row), with or without their payloads
// (outbox.DeadLetterQuery); More says rows were left out by the bounds.
func (s *Store) ListDeadLetterPage(ctx context.Context, namespace string, q outbox.DeadLetterQuery) (outbox.DeadLetterPage, error) {
	if err := s.lock(ctx); err != nil {
		return outbox.DeadLetterPage{}, err
	}
	defer s.mu.Unlock()
	var page outbox.DeadLetterPage
	if q.Limit <= 0 {
		return page, nil
	}
	var keys []string
	for _, r := range s.rows {
		if r.Namespace == namespace && r.Status == outbox.StatusFailed && r.DispatchKey > q.After &&
			(q.Through == "" || r.DispatchKey <= q.Through) && (q.Keep == nil || q.Keep(r.DispatchKey)) {
			keys = append(keys, r.DispatchKey)
		}
	}
	slices.Sort(keys)
	size := 0
	for _, k := range keys {
		if len(page.Rows) >= q.Limit {
			page.More = true
			break
		}
		r := s.rows[k].Clone()
		payloadLen := len(r.Payload)
		if q.WithoutPayload {
			r.Payload = nil
		}
		n := outbox.RowBytes(&r)
		if q.MaxBytes > 0 && len(page.Rows) > 0 && size+n > q.MaxBytes {
			page.More = true
			break
		}
		size += n
		page.Rows = append(page.Rows, r)
		page.PayloadBytes = append(page.PayloadBytes, payloadLen)
	}
	return page, nil
}

// NamespaceStats returns the row counts of every namespace holding rows
// here, all shards (owned or not); OldestPending counts pending rows not in
// transfer.
func (s *Store) NamespaceStats(ctx context.Context) (map[string]outbox.NamespaceStats, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := map[string]outbox.NamespaceStats{}
	for _, r := range s.rows {
		st := out[r.Namespace]
		switch r.Status {
		case outbox.StatusPending:
			st.Pending++
			if !s.marked[r.DispatchKey] && (st.OldestPending.IsZero() || r.VisibleAfter.Before(st.OldestPending)) {
				st.OldestPending = r.VisibleAfter
			}
		case outbox.StatusClaimed:
			st.Claimed++
		case outbox.StatusDone:
			st.Done++
		case outbox.StatusFailed:
			st.Failed++
		case outbox.StatusCancelled:
			st.Cancelled++
		}
		out[r.Namespace] = st
	}
	return out, nil
}

// CountClaimedHeld counts, per asked namespace, every claimed row held
// here, owned shard or not (the conservative count for a per-node ceiling
// right after an ownership change). The map has one entry per asked
// namespace.
func (s *Store) CountClaimedHeld(ctx context.Context, namespaces []string) (map[string]int, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := make(map[string]int, len(namespaces))
	for _, ns := range namespaces {
		out[ns] = 0
	}
	for _, r := range s.rows {
		if n, asked := out[r.Namespace]; asked && r.Status == outbox.StatusClaimed {
			out[r.Namespace] = n + 1
		}
	}
	return out, nil
}

// maxConfigKeyBytes bounds a config key (as boltstore's).
const maxConfigKeyBytes = 4096

// SaveConfigEntry stores value (copied) under key, replacing any previous
// value. key must be 1 … 4096 bytes (else an error, nothing stored).
func (s *Store) SaveConfigEntry(ctx context.Context, key string, value []byte) error {
	if key == "" || len(key) > maxConfigKeyBytes {
		return fmt.Errorf("memstore: save config entry: key must be 1 to %d bytes, got %d", maxConfigKeyBytes, len(key))
	}
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if s.config == nil {
		s.config = map[string][]byte{}
	}
	s.config[key] = append([]byte{}, value...)
	return nil
}

// DeleteConfigEntry removes key; a missing key is a no-op.
func (s *Store) DeleteConfigEntry(ctx context.Context, key string) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	delete(s.config, key)
	return nil
}

// LoadConfigEntries returns every config entry (copies).
func (s *Store) LoadConfigEntries(ctx context.Context) (map[string][]byte, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := make(map[string][]byte, len(s.config))
	for k, v := range maps.All(s.config) {
		out[k] = append([]byte{}, v...)
	}
	return out, nil
}
