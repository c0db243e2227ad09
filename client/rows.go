package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/fairshard/fairshard/api"
)

// Append limits of the API (api/openapi.yaml; docs/api.md "Appending
// rows"): Append splits larger calls into several requests within them.
const (
	// MaxBatchRows is the most rows one POST /v1/rows takes.
	MaxBatchRows = 1000
	// MaxRequestBytes is the largest POST /v1/rows body, in bytes.
	MaxRequestBytes = 10 << 20
	// MaxPayloadBytes is the largest payload of one row, in bytes (decoded).
	MaxPayloadBytes = 1 << 20
)

// Row is one row to append. Every row needs a dispatch_key: either
// DispatchKey, or WorkflowID with Ordinal (the key is then
// "{workflow_id}:{ordinal}").
type Row struct {
	// DispatchKey identifies the row cluster-wide (1–512 bytes of UTF-8
	// without control characters); it picks the row's shard, deduplicates
	// appends, and reaches the target as the Idempotency-Key header.
	DispatchKey string
	// WorkflowID groups rows (holds apply per workflow); up to 123 bytes.
	WorkflowID string
	// Ordinal is the row's position in its workflow. It is sent whenever
	// WorkflowID is set (0 included) or it is non-zero.
	Ordinal uint64
	// Namespace (the tenant) and TaskQueue name the route; empty means
	// "default". 1–64 letters, digits, '-', '_' or '.'.
	Namespace, TaskQueue string
	// ActivityType is a free label delivered in Fairshard-Activity-Type.
	ActivityType string
	// Payload is a JSON payload, delivered as the request body with
	// Content-Type application/json. At most 1 MiB.
	Payload json.RawMessage
	// PayloadBytes is a payload of any bytes (sent base64-encoded),
	// delivered as is with Content-Type application/octet-stream unless
	// ContentType says otherwise. Set Payload or PayloadBytes, not both.
	PayloadBytes []byte
	// ContentType overrides the delivered Content-Type (a media type).
	ContentType string
	// Delay holds the row back this long before its first delivery; it is
	// sent in whole milliseconds, rounded up. At most 30 days.
	Delay time.Duration
}

// wireRow is Row as POST /v1/rows takes it.
type wireRow struct {
	DispatchKey   string          `json:"dispatch_key,omitempty"`
	WorkflowID    string          `json:"workflow_id,omitempty"`
	Ordinal       *uint64         `json:"ordinal,omitempty"`
	Namespace     string          `json:"namespace,omitempty"`
	TaskQueue     string          `json:"task_queue,omitempty"`
	ActivityType  string          `json:"activity_type,omitempty"`
	Payload       json.RawMessage `json:"payload,omitempty"`
	PayloadBase64 *[]byte         `json:"payload_base64,omitempty"`
	ContentType   string          `json:"content_type,omitempty"`
	DelayMS       *int64          `json:"delay_ms,omitempty"`
}

// MarshalJSON encodes the row as POST /v1/rows takes it.
func (r Row) MarshalJSON() ([]byte, error) {
	return json.Marshal(r.wire())
}

func (r *Row) wire() wireRow {
	w := wireRow{DispatchKey: r.DispatchKey, WorkflowID: r.WorkflowID, Namespace: r.Namespace,
		TaskQueue: r.TaskQueue, ActivityType: r.ActivityType, Payload: r.Payload, ContentType: r.ContentType}
	if r.WorkflowID != "" || r.Ordinal != 0 {
		w.Ordinal = &r.Ordinal
	}
	if r.PayloadBytes != nil {
		w.PayloadBase64 = &r.PayloadBytes
	}
	if r.Delay != 0 {
		ms := r.Delay.Milliseconds()
		if r.Delay > 0 && r.Delay%time.Millisecond != 0 {
			ms++
		}
		w.DelayMS = &ms
	}
	return w
}

// AppendStatus is one row's outcome of an append.
type AppendStatus = api.AppendStatus

// The append outcomes.
const (
	// Created: the row is new and durable on its shard's replicas
	// (AppendResult.Copies of them).
	Created = api.AppendCreated
	// Duplicate: a row with this dispatch_key exists (live, or finished
	// within the dedupe window); nothing was changed. A retried append whose
	// first attempt stored the row answers this too.
	Duplicate = api.AppendDuplicate
)

// AppendResult is one row's answer to an append, in the order of the rows.
type AppendResult = api.AppendResult

// Append stores rows durably and returns one result per row, in order. It
// returns only once every row is fsync'd on some node.
//
// More than MaxBatchRows rows, or rows whose JSON exceeds MaxRequestBytes,
// are sent as several requests, one after the other; a bad row's error
// names it by its index in rows (Error.Field "rows[1234].namespace"). The
// API validates each request whole: a bad row stores nothing of its request.
//
// Retrying is safe: rows are deduplicated by dispatch_key, so Append is
// retried on connection errors, timeouts and 503s (see the package doc),
// and a caller may retry a failed call with the same rows. A row stored by
// an attempt whose answer was lost then answers Duplicate, not Created.
//
// On error, the results returned are those of the requests acknowledged
// before it (a prefix of rows, possibly empty); rows after them may or may
// not be stored.
func (c *Client) Append(ctx context.Context, rows ...Row) ([]AppendResult, error) {
	if len(rows) == 0 {
		return nil, fmt.Errorf("fairshard: append: no rows")
	}
	// Every row is encoded once into one buffer (ends[i] is where row i
	// ends); requests are cut from it within the row and byte limits.
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	ends := make([]int, len(rows))
	var w wireRow // one variable: boxing it for Encode allocates once
	for i := range rows {
		w = rows[i].wire()
		if err := enc.Encode(&w); err != nil {
			return nil, fmt.Errorf("fairshard: append: encode rows[%d]: %w", i, err)
		}
		ends[i] = buf.Len()
	}
	encoded := buf.Bytes()
	rowBytes := func(i int) []byte {
		start := 0
		if i > 0 {
			start = ends[i-1]
		}
		return encoded[start:ends[i]]
	}
	const prefix, suffix = `{"rows":[`, `]}`
	results := make([]AppendResult, 0, len(rows))
	for first := 0; first < len(rows); {
		end, size := first, len(prefix)+len(suffix)
		for end < len(rows) && end-first < MaxBatchRows {
			n := len(rowBytes(end)) + 1
			if end > first && size+n > MaxRequestBytes {
				break
			}
			size += n
			end++
		}
		body := make([]byte, 0, size)
		body = append(body, prefix...)
		for i := first; i < end; i++ {
			if i > first {
				body = append(body, ',')
			}
			body = append(body, rowBytes(i)...)
		}
		body = append(body, suffix...)
		var out struct {
			Rows []AppendResult `json:"rows"`
		}
		err := c.do(ctx, call{method: http.MethodPost, path: "/v1/rows", body: body, retry: idempotent, out: &out})
		if err != nil {
			return results, shiftRowIndex(err, first)
		}
		if len(out.Rows) != end-first {
			return results, fmt.Errorf("fairshard: append: %d results for %d rows", len(out.Rows), end-first)
		}
		results = append(results, out.Rows...)
		first = end
	}
	return results, nil
}

// shiftRowIndex renames "rows[i]" in an *Error's Field and Message to
// "rows[i+offset]", so errors of a later request name the caller's index.
func shiftRowIndex(err error, offset int) error {
	e, ok := err.(*Error)
	if !ok || offset == 0 || !strings.HasPrefix(e.Field, "rows[") {
		return err
	}
	end := strings.IndexByte(e.Field, ']')
	if end < 0 {
		return err
	}
	i, perr := strconv.Atoi(e.Field[len("rows["):end])
	if perr != nil {
		return err
	}
	shifted := *e
	old := e.Field[:end+1]
	shifted.Field = fmt.Sprintf("rows[%d]", i+offset) + e.Field[end+1:]
	shifted.Message = strings.Replace(e.Message, old, fmt.Sprintf("rows[%d]", i+offset), 1)
	return &shifted
}

// Status is a row's state (the vocabulary of DESIGN.md).
type Status = api.RowStatus

// The row states.
const (
	// StatusPending: waiting to be claimed (maybe delayed or backing off).
	StatusPending = api.RowPending
	// StatusClaimed: claimed by its owner and being delivered.
	StatusClaimed = api.RowClaimed
	// StatusDone: delivered (the target answered 2xx).
	StatusDone = api.RowDone
	// StatusFailed: a dead letter (a permanent failure, or attempts ran
	// out); Redrive sends it again.
	StatusFailed = api.RowFailed
	// StatusCancelled: cancelled before delivery.
	StatusCancelled = api.RowCancelled
)

// RowInfo is a stored row as the API shows it (Get, row and dead-letter
// pages).
type RowInfo = api.Row

// Get returns the row with this dispatch_key, wherever it is held in the
// cluster. A key no node knows (never appended, or finished and past the
// dedupe window) returns an *Error matching ErrNotFound.
func (c *Client) Get(ctx context.Context, dispatchKey string) (*RowInfo, error) {
	if dispatchKey == "" {
		return nil, fmt.Errorf("fairshard: get: empty dispatch_key")
	}
	var out RowInfo
	if err := c.do(ctx, call{method: http.MethodGet, path: "/v1/rows/" + url.PathEscape(dispatchKey), out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}
