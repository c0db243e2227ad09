package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// This file is the run's only producer-side API code: one append call. The
// Go client package (issue 18) replaces appendRows with its Append when it
// lands; nothing else in the package builds append requests or reads their
// answers.

// appendRow is one row to append (README "API": dispatch_key, namespace,
// task_queue, payload).
type appendRow struct {
	DispatchKey string          `json:"dispatch_key"`
	Namespace   string          `json:"namespace"`
	TaskQueue   string          `json:"task_queue"`
	Payload     json.RawMessage `json:"payload"`
}

// appendResult is the answer for one row, in request order.
type appendResult struct {
	DispatchKey string `json:"dispatch_key"`
	Status      string `json:"status"` // created, duplicate or accepted
	Shard       int32  `json:"shard"`
	Node        string `json:"node"`
}

// appendError is a failed append call. Retryable says whether the same
// batch may be sent again (to any node): connection errors, timeouts, 429
// and 5xx are; any other status is bad input, a bug of the run or the
// product.
type appendError struct {
	Status    int // HTTP status; 0 when no answer arrived
	Retryable bool
	Msg       string
}

func (e *appendError) Error() string {
	if e.Status == 0 {
		return e.Msg
	}
	return fmt.Sprintf("HTTP %d: %s", e.Status, e.Msg)
}

// appendRows POSTs rows to baseURL/v1/rows and returns one result per row
// in order. The call is bounded by timeout. Any error is an *appendError;
// after one the rows may or may not be stored (README: retrying a batch is
// always safe).
func appendRows(ctx context.Context, client *http.Client, baseURL string, rows []appendRow, timeout time.Duration) ([]appendResult, error) {
	body, err := json.Marshal(map[string]any{"rows": rows})
	if err != nil {
		return nil, &appendError{Msg: err.Error()}
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/rows", bytes.NewReader(body))
	if err != nil {
		return nil, &appendError{Msg: err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return nil, &appendError{Retryable: true, Msg: err.Error()}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
	if err != nil {
		return nil, &appendError{Status: resp.StatusCode, Retryable: true, Msg: "reading the answer: " + err.Error()}
	}
	if resp.StatusCode != http.StatusOK {
		retry := resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500
		return nil, &appendError{Status: resp.StatusCode, Retryable: retry, Msg: string(bytes.TrimSpace(data))}
	}
	var out struct {
		Rows []appendResult `json:"rows"`
	}
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, &appendError{Status: resp.StatusCode, Msg: fmt.Sprintf("decode answer %.200q: %v", data, err)}
	}
	if len(out.Rows) != len(rows) {
		return nil, &appendError{Status: resp.StatusCode, Msg: fmt.Sprintf("%d results for %d rows", len(out.Rows), len(rows))}
	}
	for i, r := range out.Rows {
		if r.DispatchKey != rows[i].DispatchKey {
			return nil, &appendError{Status: resp.StatusCode, Msg: fmt.Sprintf("result %d is for %q, sent %q", i, r.DispatchKey, rows[i].DispatchKey)}
		}
	}
	return out.Rows, nil
}
