package replication

import (
	"context"
	"time"

	"github.com/fairshard/fairshard/outbox"
)

// Rows is the read side of the local store that Store passes through
// unchanged: lookups, listings and counters.
type Rows interface {
	Get(ctx context.Context, dispatchKey string) (outbox.Row, error)
	PendingRoutes(ctx context.Context, now time.Time) ([]outbox.ClaimScope, error)
	// CountClaimedHeld counts the claimed rows held here per namespace,
	// every shard (owned or not).
	CountClaimedHeld(ctx context.Context, namespaces []string) (map[string]int, error)
	NamespaceStats(ctx context.Context) (map[string]outbox.NamespaceStats, error)
	ListDeadLetterPage(ctx context.Context, namespace string, q outbox.DeadLetterQuery) (outbox.DeadLetterPage, error)
	Attempts(ctx context.Context, dispatchKey string) ([]outbox.Attempt, error)
	ListRows(ctx context.Context, q outbox.RowQuery) (outbox.RowPage, error)
}

// Mutator is the write side of the local store that Store wraps: every
// change of a row's state a node makes outside replication itself.
type Mutator interface {
	Claim(ctx context.Context, p outbox.ClaimParams) ([]outbox.Row, error)
	ClaimBatch(ctx context.Context, run func(claim func(outbox.ClaimParams) ([]outbox.Row, error)) error) error
	Complete(ctx context.Context, p outbox.CompleteParams) error
	Retry(ctx context.Context, p outbox.RetryParams) error
	Fail(ctx context.Context, p outbox.FailParams) error
	Cancel(ctx context.Context, p outbox.CancelParams) (bool, error)
	RearmStale(ctx context.Context, p outbox.RearmParams) ([]outbox.Row, error)
	Redrive(ctx context.Context, namespace string, keys []string, now time.Time) (int, error)
	PurgeDeadLetters(ctx context.Context, namespace string, keys []string, now time.Time) (int, error)
}

// Store is the node's outbox store as every part of the node outside
// replication sees it: the dispatcher, the claim planner and the API
// (DESIGN.md "One write path"). Each method that changes a row commits
// locally and queues the row's new state for the other members of its
// replica set itself (Replicator.Changed), so no caller can change a row
// without it reaching the backups. Settles, retries, dead letters and
// cancels also hold the handover fence while they commit
// (Replicator.Settling). Claims are the one change not shipped (DESIGN.md
// "Replicated shards": a new primary treats a row the old one had claimed
// as pending). Reads pass through to the local store.
//
// Appends do not go through Store: they take the replicated write path
// (Replicator.Route), which makes a row durable on its backups before it
// answers. Copies that replication itself merges, syncs and hands off use
// the local store directly.
type Store struct {
	Rows
	m Mutator
	r *Replicator
}

// NewStore wraps the local store (its reads and writes) for r.
func NewStore(local interface {
	Rows
	Mutator
}, r *Replicator) *Store {
	return &Store{Rows: local, m: local, r: r}
}

// Claim claims as the local store does; claims are not replicated.
func (s *Store) Claim(ctx context.Context, p outbox.ClaimParams) ([]outbox.Row, error) {
	return s.m.Claim(ctx, p)
}

// ClaimBatch runs a sweep's claims in one local transaction
// (backpressure.BatchClaimer); claims are not replicated.
func (s *Store) ClaimBatch(ctx context.Context, run func(claim func(outbox.ClaimParams) ([]outbox.Row, error)) error) error {
	return s.m.ClaimBatch(ctx, run)
}

// Complete settles a delivered row done and ships its new state.
func (s *Store) Complete(ctx context.Context, p outbox.CompleteParams) error {
	return s.settle(p.DispatchKey, func() error { return s.m.Complete(ctx, p) })
}

// Retry reschedules a claimed row and ships its new state.
func (s *Store) Retry(ctx context.Context, p outbox.RetryParams) error {
	return s.settle(p.DispatchKey, func() error { return s.m.Retry(ctx, p) })
}

// Fail dead-letters a claimed row and ships its new state.
func (s *Store) Fail(ctx context.Context, p outbox.FailParams) error {
	return s.settle(p.DispatchKey, func() error { return s.m.Fail(ctx, p) })
}

// Cancel withdraws a pending row and, when it did, ships its new state.
func (s *Store) Cancel(ctx context.Context, p outbox.CancelParams) (bool, error) {
	defer s.r.Settling(p.DispatchKey)()
	ok, err := s.m.Cancel(ctx, p)
	if ok {
		s.r.Changed(p.DispatchKey)
	}
	return ok, err
}

// RearmStale re-arms stale claims and ships the rows' new state. It holds
// no handover fence: a re-armed row's delivery was given up (its
// visibility timeout passed), so a new primary claiming it delivers it
// once more, as any node would after that timeout.
func (s *Store) RearmStale(ctx context.Context, p outbox.RearmParams) ([]outbox.Row, error) {
	rows, err := s.m.RearmStale(ctx, p)
	if len(rows) > 0 {
		keys := make([]string, len(rows))
		for i := range rows {
			keys[i] = rows[i].DispatchKey
		}
		s.r.Changed(keys...)
	}
	return rows, err
}

// Redrive makes dead letters of namespace pending again (the listed keys,
// or every one when keys is nil; outbox.ApplyRedrive) and ships them. It
// returns how many it redrove.
func (s *Store) Redrive(ctx context.Context, namespace string, keys []string, now time.Time) (int, error) {
	return s.deadLetters(ctx, namespace, keys, func(keys []string) (int, error) { return s.m.Redrive(ctx, namespace, keys, now) })
}

// PurgeDeadLetters turns dead letters of namespace into cancelled
// tombstones (the listed keys, or every one when keys is nil;
// outbox.ApplyPurge) and ships them. It returns how many it purged.
func (s *Store) PurgeDeadLetters(ctx context.Context, namespace string, keys []string, now time.Time) (int, error) {
	return s.deadLetters(ctx, namespace, keys, func(keys []string) (int, error) { return s.m.PurgeDeadLetters(ctx, namespace, keys, now) })
}

// deadLetterPage bounds the pages deadLetters lists keys by.
const deadLetterPage = 1000

// deadLetters runs change over dead letters of namespace and ships the
// keys it was given: keys, or, when nil, every dead letter of the
// namespace, listed first one page at a time, so the rows that changed
// are known.
func (s *Store) deadLetters(ctx context.Context, namespace string, keys []string, change func([]string) (int, error)) (int, error) {
	if keys != nil {
		n, err := change(keys)
		if n > 0 {
			s.r.Changed(keys...)
		}
		return n, err
	}
	total := 0
	after := ""
	for {
		page, err := s.ListDeadLetterPage(ctx, namespace, outbox.DeadLetterQuery{After: after, Limit: deadLetterPage, WithoutPayload: true})
		if err != nil {
			return total, err
		}
		if len(page.Rows) == 0 {
			return total, nil
		}
		pageKeys := make([]string, len(page.Rows))
		for i := range page.Rows {
			pageKeys[i] = page.Rows[i].DispatchKey
		}
		n, err := change(pageKeys)
		total += n
		if n > 0 {
			s.r.Changed(pageKeys...)
		}
		if err != nil || !page.More {
			return total, err
		}
		after = pageKeys[len(pageKeys)-1]
	}
}

// settle runs one settle of key under the handover fence and ships the
// row's new state once it committed.
func (s *Store) settle(key string, commit func() error) error {
	defer s.r.Settling(key)()
	err := commit()
	if err == nil {
		s.r.Changed(key)
	}
	return err
}
