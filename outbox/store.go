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
	// NextAttempt becomes the row's Attempt (normally Attempt+1).
	NextAttempt uint32
	// VisibleAfter is when the row may be claimed again (now + backoff).
	VisibleAfter time.Time
	// LastError describes the failed attempt.
	LastError string
}

// FailParams settles a row as a dead letter.
type FailParams struct {
	DispatchKey string
	// LastError says why the row failed for good.
	LastError string
	// Now is recorded as FinishedAt.
	Now time.Time
}

// CompleteParams settles a row as delivered.
type CompleteParams struct {
	DispatchKey string
	// Now is recorded as FinishedAt.
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
	// are stored pending, with Attempt 1 (if zero), CreatedAt defaulted to
	// now, VisibleAfter defaulted to CreatedAt, and Shard computed from the
	// dispatch_key. Append returns only once the batch is durable (for a disk
	// store: fsync'd); retrying the same batch is safe. A row failing
	// validation yields ErrInvalidRow and nothing of the batch is written.
	Append(ctx context.Context, rows []Row) ([]AppendOutcome, error)

	// Claim atomically flips up to Limit visible pending rows to claimed
	// (ClaimedAt = Now) and returns them ordered by (VisibleAfter,
	// DispatchKey). A row is returned by at most one Claim.
	Claim(ctx context.Context, p ClaimParams) ([]Row, error)

	// RearmStale flips claimed rows with ClaimedAt < OlderThan back to
	// pending with the given VisibleAfter, oldest claim first, keeping their
	// Attempt. Terminal rows and rows claimed at or after the cut-off are
	// untouched. It returns the re-armed rows.
	RearmStale(ctx context.Context, p RearmParams) ([]Row, error)

	// Complete marks a pending or claimed row done. A missing or terminal
	// row is a no-op (nil error).
	Complete(ctx context.Context, p CompleteParams) error
	// Retry flips a claimed row back to pending with a new Attempt,
	// VisibleAfter and LastError. A missing or non-claimed row is a no-op.
	Retry(ctx context.Context, p RetryParams) error
	// Fail marks a pending or claimed row failed (dead letter). A missing or
	// terminal row is a no-op.
	Fail(ctx context.Context, p FailParams) error

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
