package outbox

import (
	"time"
	"unicode/utf8"
)

// This file holds what an operator's read-back needs of the row model: the
// bounded attempt history kept beside each row, the row listing's query
// and page, and the dead-letter purge's transition.

// AttemptOutcome is how one delivery attempt was settled.
type AttemptOutcome string

const (
	// AttemptDone: the target accepted the row (Complete).
	AttemptDone AttemptOutcome = "done"
	// AttemptRetry: the attempt failed and the row was scheduled again
	// (Retry).
	AttemptRetry AttemptOutcome = "retry"
	// AttemptFailed: the attempt failed for good and the row became a dead
	// letter (Fail).
	AttemptFailed AttemptOutcome = "failed"
)

// MaxAttemptHistory is how many attempts a store keeps per row (the
// latest; older ones are dropped). MaxAttemptErrorBytes bounds each
// attempt's Error.
const (
	MaxAttemptHistory    = 20
	MaxAttemptErrorBytes = 256
)

// Attempt is one settled delivery attempt of a row. A store records one
// for every Retry and Fail that applies, in the same transaction, and for
// a Complete of a row that already has a history; a row delivered at its
// first try keeps none (the row itself says attempt and finished_at), so
// the common case costs no space for the tombstone retention. Redrives
// keep the history (a redriven row's attempts start
// again at 1, its history goes on). The history is local to the node that
// delivered: it does not travel with a handoff or replication.
type Attempt struct {
	// Attempt is the row's attempt number when it was claimed (from 1).
	Attempt uint32 `json:"attempt"`
	// ClaimedAt is when the attempt was claimed; FinishedAt when it was
	// settled. DurationMS is their difference in ms (claim to settle).
	ClaimedAt  time.Time `json:"claimed_at"`
	FinishedAt time.Time `json:"finished_at"`
	DurationMS int64     `json:"duration_ms"`
	// Outcome is how the attempt was settled.
	Outcome AttemptOutcome `json:"outcome"`
	// StatusCode is the target's HTTP status, 0 when there was none (a
	// connection error, a timeout, or a settle that did not say).
	StatusCode int `json:"status_code,omitempty"`
	// Error is the failure, at most MaxAttemptErrorBytes ("" on success).
	Error string `json:"error,omitempty"`
}

// SettledAttempt is the Attempt a settle records: before is the row as it
// was (claimed) before the settle, now the settle's instant.
func SettledAttempt(before *Row, outcome AttemptOutcome, statusCode int, errText string, now time.Time) Attempt {
	a := Attempt{Attempt: before.Attempt, ClaimedAt: before.ClaimedAt, FinishedAt: now,
		Outcome: outcome, StatusCode: statusCode, Error: truncateUTF8(errText, MaxAttemptErrorBytes)}
	if !before.ClaimedAt.IsZero() && now.After(before.ClaimedAt) {
		a.DurationMS = now.Sub(before.ClaimedAt).Milliseconds()
	}
	return a
}

// RecordAttempt appends a to history, keeping the last MaxAttemptHistory
// (oldest first). The result may share history's array.
func RecordAttempt(history []Attempt, a Attempt) []Attempt {
	history = append(history, a)
	if n := len(history) - MaxAttemptHistory; n > 0 {
		history = append(history[:0:0], history[n:]...)
	}
	return history
}

func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for len(s) > 0 && !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s
}

// RowQuery selects rows for a listing page. Empty fields match every row.
type RowQuery struct {
	// Namespace, TaskQueue, WorkflowID and Status filter the rows.
	Namespace, TaskQueue, WorkflowID string
	Status                           Status
	// After starts the page strictly after this dispatch_key ("" at the
	// beginning): a page's Next.
	After string
	// Limit is the most rows to return; ≤ 0 returns none.
	Limit int
	// MaxScan bounds the rows a store examines for one page (rows; ≤ 0:
	// DefaultMaxScan), so a selective filter over a large store answers in
	// bounded time with a short page and a cursor to go on.
	MaxScan int
}

// DefaultMaxScan is RowQuery.MaxScan's default (rows examined per page).
const DefaultMaxScan = 10_000

// Matches reports whether r passes q's filters.
func (q *RowQuery) Matches(r *Row) bool {
	return (q.Namespace == "" || r.Namespace == q.Namespace) &&
		(q.TaskQueue == "" || r.TaskQueue == q.TaskQueue) &&
		(q.WorkflowID == "" || r.WorkflowID == q.WorkflowID) &&
		(q.Status == "" || r.Status == q.Status)
}

// RowPage is one page of a row listing, ordered by dispatch_key.
type RowPage struct {
	Rows []Row
	// Next is the cursor of the following page (pass it as After): the
	// last dispatch_key examined, which may be past the last row returned
	// when the scan budget ran out. "" means the listing is complete.
	Next string
}

// ApplyPurge turns a dead letter (failed) into a cancelled tombstone,
// slimmed (payload and content type dropped, see Slim): the row will never
// be delivered nor redriven, and is removed with the
// other tombstones after the retention window (so a late duplicate append
// of its dispatch_key is still recognised). LastError keeps the failure,
// prefixed "purged: ". Cancelled outranks failed in Merge, so no copy of
// the dead letter undoes the purge. Any other row is left as it is.
func ApplyPurge(r *Row, now time.Time) bool {
	if r.Status != StatusFailed {
		return false
	}
	r.Status, r.FinishedAt = StatusCancelled, now
	r.LastError = truncateUTF8("purged: "+r.LastError, MaxAttemptErrorBytes*4)
	Slim(r) // a tombstone, as every cancelled row (its payload is never needed again)
	r.Version = r.Version.Next()
	return true
}
