package outbox

import (
	"context"
	"errors"
	"time"
)

// Sentinel errors returned by Store implementations. Callers test them with
// errors.Is; implementations wrap them with the key or shard involved.
var (
	// ErrNotFound is returned by Get when no row (live or tombstone) has the
	// dispatch_key asked for.
	ErrNotFound = errors.New("outbox: row not found")
	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("outbox: store closed")
	// ErrInvalidRow is returned by Append when a row lacks a dispatch_key,
	// namespace or task_queue; nothing of the batch is written.
	ErrInvalidRow = errors.New("outbox: invalid row")
)

// ClaimParams shapes one atomic claim.
type ClaimParams struct {
	// Scope limits the claim to one route; nil claims across all routes
	// (the unscoped claim the seed's dispatcher used without backpressure).
	Scope *ClaimScope
	// Limit is the most rows to claim; ≤ 0 claims nothing.
	Limit int
	// Now is the claim instant: only rows with VisibleAfter ≤ Now are
	// claimed, and claimed rows get ClaimedAt = Now.
	Now time.Time
	// ExcludeWorkflows holds the workflow ids whose rows must stay pending
	// (held workflows). Excluded rows are skipped, not counted against Limit:
	// the limit still fills from unheld rows of the same route.
	ExcludeWorkflows map[string]struct{}
}

// RearmParams shapes one stale-claim re-arm pass.
type RearmParams struct {
	// OlderThan: claimed rows with ClaimedAt strictly before it are re-armed.
	OlderThan time.Time
	// VisibleAfter is the re-armed rows' new VisibleAfter.
	VisibleAfter time.Time
	// Limit is the most rows to re-arm in one call; ≤ 0 re-arms nothing.
	Limit int
	// ExcludeKeys holds dispatch_keys that must not be re-armed (rows this
	// process is still delivering).
	ExcludeKeys map[string]struct{}
}

// RetryParams settles a claimed row as "try again later".
type RetryParams struct {
	DispatchKey string
	// Claim is the fence: the Version of the row as the Claim being settled
	// returned it. The retry applies only while the row is still claimed
	// under that claim (not re-armed, re-claimed or settled since).
	Claim Version
	// NextAttempt becomes the row's Attempt (Attempt+1 if zero).
	NextAttempt uint32
	// VisibleAfter is when the row may be claimed again (now + backoff).
	VisibleAfter time.Time
	// LastError describes the failed attempt.
	LastError string
	// StatusCode is the target's HTTP status (0: none), recorded in the
	// row's attempt history; Now is the settle instant recorded there
	// (the store clock if zero).
	StatusCode int
	Now        time.Time
	// Unattempted says the claim is handed back without a delivery
	// attempt (its route lost its target): nothing is recorded in the
	// row's attempt history.
	Unattempted bool
}

// FailParams settles a claimed row as a dead letter.
type FailParams struct {
	DispatchKey string
	// Claim is the fence: the Version of the row as the Claim being settled
	// returned it. The row is dead-lettered only while it is still claimed
	// under that claim.
	Claim Version
	// LastError says why the row failed for good.
	LastError string
	// Now is recorded as FinishedAt (the store clock if zero).
	Now time.Time
	// StatusCode is the target's HTTP status (0: none), recorded in the
	// row's attempt history.
	StatusCode int
}

// CompleteParams settles a claimed row as delivered.
type CompleteParams struct {
	DispatchKey string
	// Claim is the fence: the Version of the row as the Claim being settled
	// returned it. The row becomes done while it is still claimed under that
	// claim, or pending in the same generation (re-armed, not claimed
	// again: the delivery did succeed); see ApplyComplete.
	Claim Version
	// Now is recorded as FinishedAt (the store clock if zero).
	Now time.Time
	// StatusCode is the target's HTTP status (0: none), recorded in the
	// row's attempt history.
	StatusCode int
}

// CancelParams withdraws a pending row.
type CancelParams struct {
	DispatchKey string
	// Reason, when set, is recorded as the row's LastError.
	Reason string
	// Now is recorded as FinishedAt (the store clock if zero).
	Now time.Time
}

// Store is the outbox storage contract (ported from the seed's OutboxStore).
// All implementations are safe for concurrent use and must pass
// outboxtest.RunStoreSuite unchanged.
//
// Ownership scoping: a Store may be told which shards this node owns (see
// the implementation). Claim, CountClaimed*, CountInFlight and PendingRoutes
// see only rows of owned shards; Append and Get see every row.
type Store interface {
	// Append stores a batch with insert-or-ignore on dispatch_key and returns
	// one outcome per input row, in order. A row whose dispatch_key already
	// exists (live or tombstone), or appears earlier in the same batch, is
	// reported AppendDuplicate and leaves the stored row unchanged. New rows
	// are stored as outbox.NewRow makes them (pending, Attempt 1 if zero,
	// CreatedAt defaulted to now, VisibleAfter to CreatedAt, Version
	// FirstVersion), with Shard computed from the dispatch_key. Append returns only once the batch is durable (for a disk
	// store: fsync'd); retrying the same batch is safe. A row failing
	// validation yields ErrInvalidRow and nothing of the batch is written.
	Append(ctx context.Context, rows []Row) ([]AppendOutcome, error)

	// Claim atomically flips up to Limit visible pending rows to claimed
	// (ClaimedAt = Now) and returns them ordered by (VisibleAfter,
	// DispatchKey). A row is returned by at most one Claim. Each returned
	// row's Version identifies the claim: pass it as the settle's Claim.
	Claim(ctx context.Context, p ClaimParams) ([]Row, error)

	// RearmStale flips claimed rows with ClaimedAt < OlderThan back to
	// pending with the given VisibleAfter, oldest claim first, keeping their
	// Attempt and raising their Version (outbox.ApplyRearm). Terminal rows and rows claimed at or after the cut-off are
	// untouched. It returns the re-armed rows.
	RearmStale(ctx context.Context, p RearmParams) ([]Row, error)

	// Complete, Retry and Fail settle one claim (fenced by p.Claim, the
	// Version the claim returned): a settle from a claim that was re-armed
	// and claimed again, or already settled, is a no-op, as is a missing
	// row (nil error). The transitions are outbox.ApplyComplete, ApplyRetry
	// and ApplyFail; each raises the row's Version.

	// Complete marks the claimed row done (or a pending row of the claim's
	// generation: a late success after a re-arm).
	Complete(ctx context.Context, p CompleteParams) error
	// Retry flips the claimed row back to pending with a new Attempt,
	// VisibleAfter and LastError.
	Retry(ctx context.Context, p RetryParams) error
	// Fail marks the claimed row failed (dead letter).
	Fail(ctx context.Context, p FailParams) error
	// Cancel marks a pending row cancelled and reports whether it did; a
	// missing, claimed (being delivered) or terminal row is left as it is
	// (false, nil error). See outbox.ApplyCancel.
	Cancel(ctx context.Context, p CancelParams) (bool, error)

	// CountInFlight counts the namespace's pending + claimed rows.
	CountInFlight(ctx context.Context, namespace string) (int, error)
	// CountClaimed counts the namespace's claimed rows: the number the
	// per-node ceiling caps (seed §3.1, CLAIMED-only headroom).
	CountClaimed(ctx context.Context, namespace string) (int, error)
	// CountClaimedByNamespace counts claimed rows for many namespaces in one
	// read. The map has exactly one entry per asked namespace (zero if none).
	CountClaimedByNamespace(ctx context.Context, namespaces []string) (map[string]int, error)
	// PendingRoutes lists the distinct routes having at least one pending row
	// visible at now, sorted by (Namespace, TaskQueue).
	PendingRoutes(ctx context.Context, now time.Time) ([]ClaimScope, error)

	// Get returns the row with the dispatch_key, live or tombstone, or an
	// error wrapping ErrNotFound.
	Get(ctx context.Context, dispatchKey string) (Row, error)
}
