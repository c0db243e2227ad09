package memstore

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/fairshard/fairshard/outbox"
)

// The calls below are an operator's read-back: the attempt history, the row
// listing and the dead-letter purge, as boltstore has them.

// recording wraps a settle's transition so that, when it applies, the
// attempt is appended to the row's history (called with s.mu held, by
// change).
func (s *Store) recording(outcome outbox.AttemptOutcome, code int, errText string, now time.Time, apply func(*outbox.Row) bool) func(*outbox.Row) bool {
	return func(r *outbox.Row) bool {
		before := *r
		if !apply(r) {
			return false
		}
		if outcome == outbox.AttemptDone && len(s.attempts[r.DispatchKey]) == 0 {
			return true // delivered at the first try: nothing to keep (outbox.Attempt)
		}
		if s.attempts == nil {
			s.attempts = map[string][]outbox.Attempt{}
		}
		s.attempts[r.DispatchKey] = outbox.RecordAttempt(s.attempts[r.DispatchKey], outbox.SettledAttempt(&before, outcome, code, errText, now))
		return true
	}
}

// Attempts returns the row's last attempts (at most
// outbox.MaxAttemptHistory), oldest first; none (nil error) for a key
// without history.
func (s *Store) Attempts(ctx context.Context, dispatchKey string) ([]outbox.Attempt, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return slices.Clone(s.attempts[dispatchKey]), nil
}

// ListRows returns a page of the rows (any shard) passing q's filters,
// ordered by dispatch_key after q.After; see outbox.RowQuery and
// outbox.RowPage (at most q.MaxScan rows examined).
func (s *Store) ListRows(ctx context.Context, q outbox.RowQuery) (outbox.RowPage, error) {
	if err := s.lock(ctx); err != nil {
		return outbox.RowPage{}, err
	}
	defer s.mu.Unlock()
	if q.Limit <= 0 {
		return outbox.RowPage{}, nil
	}
	budget := q.MaxScan
	if budget <= 0 {
		budget = outbox.DefaultMaxScan
	}
	keys := make([]string, 0, len(s.rows))
	for k := range s.rows {
		if k > q.After {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, strings.Compare)
	var page outbox.RowPage
	for i, k := range keys {
		if i == budget {
			return page, nil
		}
		page.Next = k
		if r := s.rows[k]; q.Matches(r) {
			page.Rows = append(page.Rows, r.Clone())
			if len(page.Rows) == q.Limit {
				if i == len(keys)-1 {
					page.Next = ""
				}
				return page, nil
			}
		}
	}
	page.Next = ""
	return page, nil
}

// PurgeDeadLetters turns the namespace's dead letters (all, or the listed
// keys that are) into cancelled tombstones (outbox.ApplyPurge) and returns
// how many it purged.
func (s *Store) PurgeDeadLetters(ctx context.Context, namespace string, keys []string, now time.Time) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	now = s.nowOr(now)
	n := 0
	purge := func(r *outbox.Row) {
		if r.Namespace == namespace && outbox.ApplyPurge(r, now) {
			delete(s.marked, r.DispatchKey)
			n++
		}
	}
	if keys == nil {
		for _, r := range s.rows {
			purge(r)
		}
		return n, nil
	}
	for _, k := range keys {
		if r, ok := s.rows[k]; ok {
			purge(r)
		}
	}
	return n, nil
}
