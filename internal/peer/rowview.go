package peer

import (
	"time"

	"github.com/fairshard/fairshard/internal/waiting"
	"github.com/fairshard/fairshard/outbox"
)

// RowView is a row as the API shows it (GET /v1/rows/{key}, dead letters)
// and as nodes send rows to each other (forwarded appends, handoff).
// Payload travels base64-encoded (encoding/json's []byte form).
type RowView struct {
	DispatchKey  string `json:"dispatch_key"`
	WorkflowID   string `json:"workflow_id,omitempty"`
	Ordinal      uint64 `json:"ordinal"`
	Namespace    string `json:"namespace"`
	TaskQueue    string `json:"task_queue"`
	ActivityType string `json:"activity_type,omitempty"`
	Payload      []byte `json:"payload_base64,omitempty"`
	// PayloadBytes is the payload's size where the payload is left out (a
	// dead-letter page with include_payload=false).
	PayloadBytes int           `json:"payload_bytes,omitempty"`
	ContentType  string        `json:"content_type,omitempty"`
	Status       outbox.Status `json:"status"`
	Attempt      uint32        `json:"attempt"`
	VisibleAfter time.Time     `json:"visible_after"`
	ClaimedAt    *time.Time    `json:"claimed_at,omitempty"`
	CreatedAt    time.Time     `json:"created_at"`
	FinishedAt   *time.Time    `json:"finished_at,omitempty"`
	LastError    string        `json:"last_error,omitempty"`
	Shard        uint32        `json:"shard"`
	// Version is the row's version (outbox.Version: generation, change
	// counter): how copies of the row on different nodes are merged. A
	// node that sends none is read as the zero version.
	Version *outbox.Version `json:"version,omitempty"`
	// Node is the node holding the row (set by the API layer).
	Node string `json:"node,omitempty"`
	// Waiting says why a live row has not been delivered yet, as the node
	// holding it sees it (row lookups only; nil for terminal rows and in
	// node-to-node row batches).
	Waiting *waiting.Waiting `json:"waiting,omitempty"`
	// Attempts is the row's last settled attempts on the node holding it,
	// oldest first (row lookups only).
	Attempts []outbox.Attempt `json:"attempts,omitempty"`
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// ViewOf is r as the API shows it, held by node ("" to leave Node out).
func ViewOf(r outbox.Row, node string) RowView {
	return RowView{
		DispatchKey: r.DispatchKey, WorkflowID: r.WorkflowID, Ordinal: r.Ordinal,
		Namespace: r.Namespace, TaskQueue: r.TaskQueue, ActivityType: r.ActivityType,
		Payload: r.Payload, ContentType: r.ContentType, Status: r.Status, Attempt: r.Attempt,
		VisibleAfter: r.VisibleAfter, ClaimedAt: optTime(r.ClaimedAt), CreatedAt: r.CreatedAt,
		FinishedAt: optTime(r.FinishedAt), LastError: r.LastError, Shard: r.Shard, Node: node,
		Version: &r.Version,
	}
}

// Row is the row v describes (the zero Version when v has none).
func (v RowView) Row() outbox.Row {
	r := outbox.Row{
		DispatchKey: v.DispatchKey, WorkflowID: v.WorkflowID, Ordinal: v.Ordinal,
		Namespace: v.Namespace, TaskQueue: v.TaskQueue, ActivityType: v.ActivityType,
		Payload: v.Payload, ContentType: v.ContentType, Status: v.Status, Attempt: v.Attempt,
		VisibleAfter: v.VisibleAfter, CreatedAt: v.CreatedAt, LastError: v.LastError, Shard: v.Shard,
	}
	if v.ClaimedAt != nil {
		r.ClaimedAt = *v.ClaimedAt
	}
	if v.FinishedAt != nil {
		r.FinishedAt = *v.FinishedAt
	}
	if v.Version != nil {
		r.Version = *v.Version
	}
	return r
}

// ViewsOf is ViewOf of every row.
func ViewsOf(rows []outbox.Row, node string) []RowView {
	out := make([]RowView, len(rows))
	for i := range rows {
		out[i] = ViewOf(rows[i], node)
	}
	return out
}
