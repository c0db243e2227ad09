package api

import (
	"bytes"
	"encoding/json"
	"mime"
	"strings"
	"time"
)

// RowStatus is a row's state (DESIGN.md's vocabulary): pending, claimed,
// done, failed (a dead letter) or cancelled.
type RowStatus string

// The row states.
const (
	// RowPending: waiting to be claimed (maybe delayed or backing off).
	RowPending RowStatus = "pending"
	// RowClaimed: claimed by its shard's owner and being delivered.
	RowClaimed RowStatus = "claimed"
	// RowDone: delivered (the target answered 2xx).
	RowDone RowStatus = "done"
	// RowFailed: a dead letter (a permanent failure, or attempts ran out);
	// a redrive sends it again.
	RowFailed RowStatus = "failed"
	// RowCancelled: cancelled before delivery.
	RowCancelled RowStatus = "cancelled"
)

// RowVersion is a row's version: how copies of the row on different nodes
// are merged (the newer wins; a finished row never goes back to live).
// Gen is the redrive generation (0, then +1 per redrive); Seq the change
// counter within it (1 at append, +1 per retry, re-arm, settle, cancel and
// redrive).
type RowVersion struct {
	Gen uint32 `json:"gen"`
	Seq uint64 `json:"seq"`
}

// Row is a stored row as the API shows it (GET /v1/rows/{dispatch_key},
// row and dead-letter pages, a cancel's answer) and as nodes send rows to
// each other.
type Row struct {
	DispatchKey  string `json:"dispatch_key"`
	WorkflowID   string `json:"workflow_id,omitempty"`
	Ordinal      uint64 `json:"ordinal"`
	Namespace    string `json:"namespace"`
	TaskQueue    string `json:"task_queue"`
	ActivityType string `json:"activity_type,omitempty"`
	// Payload is the row's payload bytes. In JSON they are "payload", a
	// JSON value, when the content type is JSON (JSONContentType) and the
	// bytes parse as JSON; otherwise "payload_base64" (Row.MarshalJSON).
	Payload []byte `json:"payload_base64,omitempty"`
	// PayloadSize is the payload's size in bytes where the payload is left
	// out (a dead-letter page with include_payload=false).
	PayloadSize int       `json:"payload_bytes,omitempty"`
	ContentType string    `json:"content_type,omitempty"`
	Status      RowStatus `json:"status"`
	// Attempt is the delivery attempt the row is at, from 1.
	Attempt uint32 `json:"attempt"`
	// VisibleAfter is when the row may next be claimed (delay, backoff).
	VisibleAfter time.Time  `json:"visible_after"`
	ClaimedAt    *time.Time `json:"claimed_at,omitempty"`
	CreatedAt    time.Time  `json:"created_at"`
	FinishedAt   *time.Time `json:"finished_at,omitempty"`
	// LastError is the last failed attempt's error (status and a bounded
	// excerpt of the target's answer).
	LastError string `json:"last_error,omitempty"`
	Shard     uint32 `json:"shard"`
	// Version is the row's version; a node that sends none is read as the
	// zero version.
	Version *RowVersion `json:"version,omitempty"`
	// Node is the node holding the row.
	Node string `json:"node,omitempty"`
	// Waiting says why a pending or claimed row has not been delivered
	// yet (row look-ups only; nil for finished rows and in node-to-node
	// batches).
	Waiting *Waiting `json:"waiting,omitempty"`
	// Attempts is the row's last settled attempts (at most 20) on the node
	// holding it, oldest first (row look-ups only).
	Attempts []RowAttempt `json:"attempts,omitempty"`
}

// RowAttempt is one settled delivery attempt of a row.
type RowAttempt struct {
	// Attempt is the row's attempt number when it was claimed (from 1).
	Attempt    uint32    `json:"attempt"`
	ClaimedAt  time.Time `json:"claimed_at"`
	FinishedAt time.Time `json:"finished_at"`
	// DurationMS is from the claim to the settle, in ms.
	DurationMS int64 `json:"duration_ms"`
	// Outcome is "done", "retry" or "failed" (dead-lettered).
	Outcome string `json:"outcome"`
	// StatusCode is the target's HTTP status; 0 when there was none.
	StatusCode int    `json:"status_code,omitempty"`
	Error      string `json:"error,omitempty"`
}

// RowPage is one page of a row or dead-letter listing, gathered from
// every node and ordered by dispatch_key.
type RowPage struct {
	Rows []Row `json:"rows"`
	// Next is the cursor of the following page ("" when complete). A page
	// may be short, even empty, with a Next: each node examines a bounded
	// number of rows per page.
	Next string `json:"next"`
	// UnreachableNodes did not answer: their rows are missing.
	UnreachableNodes []string `json:"unreachable_nodes"`
}

// CancelResult is what a cancel (POST /v1/rows/cancel) did: Cancelled is
// false for a row being delivered or already finished; Row is the row as
// it is now.
type CancelResult struct {
	DispatchKey string `json:"dispatch_key"`
	Cancelled   bool   `json:"cancelled"`
	Message     string `json:"message"`
	Row         *Row   `json:"row,omitempty"`
}

// AppendStatus is one row's outcome of an append (POST /v1/rows).
type AppendStatus string

// The append outcomes.
const (
	// AppendCreated: the row is new and durable on its shard's replicas
	// (AppendResult.Copies of them).
	AppendCreated AppendStatus = "created"
	// AppendDuplicate: a row with this dispatch_key exists (live, or
	// finished within the dedupe window); nothing was changed. A retried
	// append whose first attempt stored the row answers this too.
	AppendDuplicate AppendStatus = "duplicate"
)

// AppendResult is one row's answer to an append, in the order of the rows.
type AppendResult struct {
	DispatchKey string       `json:"dispatch_key"`
	Status      AppendStatus `json:"status"`
	// Shard is xxhash64(dispatch_key) mod the cluster's shard count.
	Shard uint32 `json:"shard"`
	// Node is the replica that coordinated the write (the shard's
	// primary, unless it could not be reached).
	Node string `json:"node"`
	// Copies counts the replicas the row is durable (fsync'd) on: at least
	// the cluster's write-copies minimum.
	Copies int `json:"copies"`
}

// rowFields is Row without its JSON methods.
type rowFields Row

// rowJSON is Row as JSON: its fields, and the payload as a JSON value
// where it is one.
type rowJSON struct {
	rowFields
	PayloadJSON json.RawMessage `json:"payload,omitempty"`
}

// MarshalJSON encodes r with its payload as "payload", the JSON value
// itself (whitespace not kept), when its content type is JSON and the
// payload parses; else as "payload_base64". Strings are not HTML-escaped.
func (r Row) MarshalJSON() ([]byte, error) {
	w := rowJSON{rowFields: rowFields(r)}
	if len(r.Payload) > 0 && JSONContentType(r.ContentType) && json.Valid(r.Payload) {
		w.PayloadJSON, w.Payload = r.Payload, nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(w); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

// UnmarshalJSON decodes a row in either payload form.
func (r *Row) UnmarshalJSON(b []byte) error {
	var w rowJSON
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*r = Row(w.rowFields)
	if len(w.PayloadJSON) > 0 && !bytes.Equal(w.PayloadJSON, []byte("null")) {
		r.Payload = []byte(w.PayloadJSON)
	}
	return nil
}

// JSONContentType reports whether contentType is a JSON media type:
// application/json or a +json suffix (RFC 6839), parameters ignored.
func JSONContentType(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json"))
}
