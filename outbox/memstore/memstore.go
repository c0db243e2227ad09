// Package memstore is the in-memory reference implementation of
// [outbox.Store]. It is the executable documentation of the contract and the
// fast store behind planner and dispatcher unit tests; production uses
// boltstore. Nothing is durable. Every method is safe for concurrent use;
// one mutex serialises them, and every method scans, which is fine for tests
// and wrong for production.
package memstore

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// Store is an in-memory outbox.Store. Build one with New.
type Store struct {
	shardCount uint32
	now        func() time.Time

	mu     sync.Mutex
	rows   map[string]*outbox.Row
	owned  map[uint32]bool // nil: every shard is owned
	closed bool
}

var _ outbox.Store = (*Store)(nil)

// New returns an empty store that computes shards over shardCount shards
// (0 is treated as 1) and owns every shard until SetOwnedShards is called.
func New(shardCount uint32) *Store {
	return &Store{shardCount: max(shardCount, 1), now: time.Now, rows: map[string]*outbox.Row{}}
}

// SetOwnedShards scopes claims, counts and route listings to the given
// shards. A nil slice restores "owns every shard"; an empty non-nil slice
// owns nothing.
func (s *Store) SetOwnedShards(owned []uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if owned == nil {
		s.owned = nil
		return
	}
	s.owned = make(map[uint32]bool, len(owned))
	for _, sh := range owned {
		s.owned[sh] = true
	}
}

// Close makes every later call return outbox.ErrClosed. It is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// lock checks ctx, then takes the store's mutex unless the store is
// closed. On a nil error the caller holds the mutex.
func (s *Store) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return outbox.ErrClosed
	}
	return nil
}

func (s *Store) ownsLocked(r *outbox.Row) bool { return s.owned == nil || s.owned[r.Shard] }

// Append implements outbox.Store.
func (s *Store) Append(ctx context.Context, rows []outbox.Row) ([]outbox.AppendOutcome, error) {
	for i := range rows {
		if err := outbox.ValidateForAppend(i, &rows[i]); err != nil {
			return nil, err
		}
	}
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	now := s.now().UTC()
	out := make([]outbox.AppendOutcome, len(rows))
	for i := range rows {
		if _, ok := s.rows[rows[i].DispatchKey]; ok {
			out[i] = outbox.AppendDuplicate
			continue
		}
		r := rows[i].Clone()
		r.Status = outbox.StatusPending
		r.ClaimedAt, r.FinishedAt = time.Time{}, time.Time{}
		if r.Attempt == 0 {
			r.Attempt = 1
		}
		if r.CreatedAt.IsZero() {
			r.CreatedAt = now
		}
		if r.VisibleAfter.IsZero() {
			r.VisibleAfter = r.CreatedAt
		}
		r.Shard = shards.ShardOf(r.DispatchKey, s.shardCount)
		s.rows[r.DispatchKey] = &r
		out[i] = outbox.AppendCreated
	}
	return out, nil
}

func byVisibleThenKey(a, b *outbox.Row) int {
	if c := a.VisibleAfter.Compare(b.VisibleAfter); c != 0 {
		return c
	}
	return strings.Compare(a.DispatchKey, b.DispatchKey)
}

// Claim implements outbox.Store.
func (s *Store) Claim(ctx context.Context, p outbox.ClaimParams) ([]outbox.Row, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if p.Limit <= 0 {
		return nil, nil
	}
	var cand []*outbox.Row
	for _, r := range s.rows {
		if r.Status != outbox.StatusPending || r.VisibleAfter.After(p.Now) || !s.ownsLocked(r) {
			continue
		}
		if p.Scope != nil && r.Route() != *p.Scope {
			continue
		}
		if _, held := p.ExcludeWorkflows[r.WorkflowID]; held {
			continue
		}
		cand = append(cand, r)
	}
	slices.SortFunc(cand, byVisibleThenKey)
	if len(cand) > p.Limit {
		cand = cand[:p.Limit]
	}
	out := make([]outbox.Row, 0, len(cand))
	for _, r := range cand {
		r.Status = outbox.StatusClaimed
		r.ClaimedAt = p.Now
		out = append(out, r.Clone())
	}
	return out, nil
}

// RearmStale implements outbox.Store.
func (s *Store) RearmStale(ctx context.Context, p outbox.RearmParams) ([]outbox.Row, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if p.Limit <= 0 {
		return nil, nil
	}
	var cand []*outbox.Row
	for _, r := range s.rows {
		if r.Status != outbox.StatusClaimed || !r.ClaimedAt.Before(p.OlderThan) {
			continue
		}
		if _, skip := p.ExcludeKeys[r.DispatchKey]; skip {
			continue
		}
		cand = append(cand, r)
	}
	slices.SortFunc(cand, func(a, b *outbox.Row) int {
		if c := a.ClaimedAt.Compare(b.ClaimedAt); c != 0 {
			return c
		}
		return strings.Compare(a.DispatchKey, b.DispatchKey)
	})
	if len(cand) > p.Limit {
		cand = cand[:p.Limit]
	}
	out := make([]outbox.Row, 0, len(cand))
	for _, r := range cand {
		r.Status = outbox.StatusPending
		r.ClaimedAt = time.Time{}
		r.VisibleAfter = p.VisibleAfter
		out = append(out, r.Clone())
	}
	return out, nil
}

// Complete implements outbox.Store.
func (s *Store) Complete(ctx context.Context, p outbox.CompleteParams) error {
	return s.settle(ctx, p.DispatchKey, func(r *outbox.Row) {
		if r.Status.Terminal() {
			return
		}
		r.Status, r.ClaimedAt, r.FinishedAt = outbox.StatusDone, time.Time{}, p.Now
	})
}

// Retry implements outbox.Store.
func (s *Store) Retry(ctx context.Context, p outbox.RetryParams) error {
	return s.settle(ctx, p.DispatchKey, func(r *outbox.Row) {
		if r.Status != outbox.StatusClaimed {
			return
		}
		r.Status, r.ClaimedAt = outbox.StatusPending, time.Time{}
		r.Attempt, r.VisibleAfter, r.LastError = p.NextAttempt, p.VisibleAfter, p.LastError
	})
}

// Fail implements outbox.Store.
func (s *Store) Fail(ctx context.Context, p outbox.FailParams) error {
	return s.settle(ctx, p.DispatchKey, func(r *outbox.Row) {
		if r.Status.Terminal() {
			return
		}
		r.Status, r.ClaimedAt, r.FinishedAt, r.LastError = outbox.StatusFailed, time.Time{}, p.Now, p.LastError
	})
}

func (s *Store) settle(ctx context.Context, key string, apply func(*outbox.Row)) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if r, ok := s.rows[key]; ok {
		apply(r)
	}
	return nil
}

func (s *Store) count(ctx context.Context, keep func(*outbox.Row) bool) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.rows {
		if s.ownsLocked(r) && keep(r) {
			n++
		}
	}
	return n, nil
}

// CountInFlight implements outbox.Store.
func (s *Store) CountInFlight(ctx context.Context, namespace string) (int, error) {
	return s.count(ctx, func(r *outbox.Row) bool {
		return r.Namespace == namespace && (r.Status == outbox.StatusPending || r.Status == outbox.StatusClaimed)
	})
}

// CountClaimed implements outbox.Store.
func (s *Store) CountClaimed(ctx context.Context, namespace string) (int, error) {
	return s.count(ctx, func(r *outbox.Row) bool {
		return r.Namespace == namespace && r.Status == outbox.StatusClaimed
	})
}

// CountClaimedByNamespace implements outbox.Store.
func (s *Store) CountClaimedByNamespace(ctx context.Context, namespaces []string) (map[string]int, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := make(map[string]int, len(namespaces))
	for _, ns := range namespaces {
		out[ns] = 0
	}
	for _, r := range s.rows {
		if r.Status != outbox.StatusClaimed || !s.ownsLocked(r) {
			continue
		}
		if n, asked := out[r.Namespace]; asked {
			out[r.Namespace] = n + 1
		}
	}
	return out, nil
}

// PendingRoutes implements outbox.Store.
func (s *Store) PendingRoutes(ctx context.Context, now time.Time) ([]outbox.ClaimScope, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	seen := map[outbox.ClaimScope]bool{}
	for _, r := range s.rows {
		if r.Status == outbox.StatusPending && !r.VisibleAfter.After(now) && s.ownsLocked(r) {
			seen[r.Route()] = true
		}
	}
	out := make([]outbox.ClaimScope, 0, len(seen))
	for sc := range seen {
		out = append(out, sc)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].TaskQueue < out[j].TaskQueue
	})
	return out, nil
}

// Get implements outbox.Store.
func (s *Store) Get(ctx context.Context, dispatchKey string) (outbox.Row, error) {
	if err := s.lock(ctx); err != nil {
		return outbox.Row{}, err
	}
	defer s.mu.Unlock()
	r, ok := s.rows[dispatchKey]
	if !ok {
		return outbox.Row{}, fmt.Errorf("get %q: %w", dispatchKey, outbox.ErrNotFound)
	}
	return r.Clone(), nil
}
