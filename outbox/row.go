package outbox

import (
	"fmt"
	"time"
)

// Status is a row's lifecycle state. The string values are the vocabulary of
// DESIGN.md and appear verbatim in the HTTP API and in metrics.
type Status string

const (
	// StatusPending rows wait to be claimed once VisibleAfter has passed.
	StatusPending Status = "pending"
	// StatusClaimed rows are being delivered by the node that claimed them;
	// they count against the namespace's per-node ceiling (seed §3.1).
	StatusClaimed Status = "claimed"
	// StatusDone rows were delivered; they are kept as tombstones for the
	// dedupe retention window, then removed.
	StatusDone Status = "done"
	// StatusFailed rows are dead letters: attempts exhausted or a permanent
	// delivery error. They are kept until redriven or until retention ends.
	StatusFailed Status = "failed"
	// StatusCancelled rows were withdrawn before delivery; tombstones like done.
	StatusCancelled Status = "cancelled"
)

// Terminal reports whether s is a final state (done, failed or cancelled).
func (s Status) Terminal() bool {
	return s == StatusDone || s == StatusFailed || s == StatusCancelled
}

// Valid reports whether s is one of the five known statuses.
func (s Status) Valid() bool {
	switch s {
	case StatusPending, StatusClaimed, StatusDone, StatusFailed, StatusCancelled:
		return true
	}
	return false
}

// DefaultName is the namespace and task_queue a row gets when the producer
// names none.
const DefaultName = "default"

// Row is one outbox entry: a unit of work to deliver to its route's target.
//
// Times are UTC wall-clock instants; the zero time means "not set"
// (ClaimedAt of a row that is not claimed, for instance).
type Row struct {
	// DispatchKey is the row's unique id and dedupe key. Producers may set it
	// directly; otherwise it is "{workflow_id}:{ordinal}" (see DefaultDispatchKey).
	DispatchKey string
	// WorkflowID groups rows that can be held (paused) together.
	WorkflowID string
	// Ordinal is the row's position within its workflow.
	Ordinal uint64
	// Namespace is the tenant; quotas and fairness are per namespace.
	Namespace string
	// TaskQueue is the route inside the namespace.
	TaskQueue string
	// ActivityType is an opaque label passed to the target.
	ActivityType string
	// Payload is delivered as the request body, byte for byte.
	Payload []byte
	// ContentType is the payload's media type, e.g. "application/json".
	ContentType string

	// Status is the row's lifecycle state.
	Status Status
	// Attempt is the 1-based number of the current (claimed) or next
	// (pending) delivery attempt. A new row has Attempt 1; Retry raises it.
	Attempt uint32
	// VisibleAfter is the earliest instant at which a pending row may be
	// claimed (delays and retry backoff push it into the future).
	VisibleAfter time.Time
	// ClaimedAt is when the row was last claimed; zero unless claimed.
	ClaimedAt time.Time
	// CreatedAt is when the row was first appended.
	CreatedAt time.Time
	// FinishedAt is when the row became terminal; zero while live. The
	// tombstone retention window counts from here.
	FinishedAt time.Time
	// LastError is the most recent delivery error, bounded by the dispatcher.
	LastError string
	// Shard is shards.ShardOf(DispatchKey, shardCount), set by the store on
	// Append.
	Shard uint32
	// Version orders this copy of the row against other copies of it (on
	// other nodes, or resent by a handoff): see [Version] and [Merge]. The
	// store sets it; Append starts every row at [FirstVersion].
	Version Version
}

// Route returns the row's (namespace, task_queue) pair.
func (r *Row) Route() ClaimScope {
	return ClaimScope{Namespace: r.Namespace, TaskQueue: r.TaskQueue}
}

// Clone returns a deep copy of r (the payload is copied).
func (r Row) Clone() Row {
	if r.Payload != nil {
		r.Payload = append([]byte(nil), r.Payload...)
	}
	return r
}

// DefaultDispatchKey is the dispatch_key of a row that names none:
// "{workflow_id}:{ordinal}" (DESIGN.md vocabulary).
func DefaultDispatchKey(workflowID string, ordinal uint64) string {
	return fmt.Sprintf("%s:%d", workflowID, ordinal)
}

// ClaimScope is a route: one (namespace, task_queue) pair. Claims and the
// pending-routes listing speak in scopes.
type ClaimScope struct {
	Namespace string
	TaskQueue string
}

// String renders the scope as "namespace/task_queue" for logs and errors.
func (s ClaimScope) String() string { return s.Namespace + "/" + s.TaskQueue }

// AppendOutcome reports what Append did with one row.
type AppendOutcome string

const (
	// AppendCreated means the row was new and is now durably stored.
	AppendCreated AppendOutcome = "created"
	// AppendDuplicate means a row (live or tombstone) with the same
	// dispatch_key already existed, or appeared earlier in the same batch; the
	// stored row was left unchanged.
	AppendDuplicate AppendOutcome = "duplicate"
)
