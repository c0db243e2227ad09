package client

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"time"
)

// Target is where a route's (namespace, task_queue) rows are delivered.
type Target struct {
	// URL is an absolute http(s) URL of at most 900 bytes; "{namespace}"
	// and "{task_queue}" in it are replaced by the row's.
	URL string
	// Timeout bounds one delivery attempt (whole milliseconds, at most
	// 10 min); 0 means the node's --delivery-timeout.
	Timeout time.Duration
}

type wireTarget struct {
	URL       string `json:"url"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
}

// MarshalJSON encodes the target as the API takes it (url, timeout_ms).
func (t Target) MarshalJSON() ([]byte, error) {
	return json.Marshal(wireTarget{URL: t.URL, TimeoutMS: t.Timeout.Milliseconds()})
}

// UnmarshalJSON decodes the API's form.
func (t *Target) UnmarshalJSON(b []byte) error {
	var w wireTarget
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*t = Target{URL: w.URL, Timeout: time.Duration(w.TimeoutMS) * time.Millisecond}
	return nil
}

func targetPath(namespace, taskQueue string) string {
	return "/v1/namespaces/" + url.PathEscape(namespace) + "/task-queues/" + url.PathEscape(taskQueue) + "/target"
}

// SetTarget sets the delivery target of the route (namespace, task_queue),
// replacing any previous one, and returns it as stored. Rows of a route
// without a target go to the nodes' --default-target, or wait.
func (c *Client) SetTarget(ctx context.Context, namespace, taskQueue string, t Target) (*Target, error) {
	body, err := marshal(t)
	if err != nil {
		return nil, err
	}
	var out Target
	if err := c.do(ctx, call{method: http.MethodPut, path: targetPath(namespace, taskQueue), body: body, retry: idempotent, out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// DeleteTarget removes the route's target (deleting an absent one is not
// an error).
func (c *Client) DeleteTarget(ctx context.Context, namespace, taskQueue string) error {
	return c.do(ctx, call{method: http.MethodDelete, path: targetPath(namespace, taskQueue), retry: idempotent})
}

func holdPath(workflowID string) string {
	return "/v1/workflows/" + url.PathEscape(workflowID) + "/hold"
}

// Hold holds a workflow: none of its rows is claimed until Release (rows
// in flight finish). workflow_id is 1–123 bytes. Holding twice is fine.
func (c *Client) Hold(ctx context.Context, workflowID string) error {
	return c.do(ctx, call{method: http.MethodPut, path: holdPath(workflowID), retry: idempotent})
}

// Release lets a held workflow's rows flow again. Releasing a workflow that
// is not held is fine.
func (c *Client) Release(ctx context.Context, workflowID string) error {
	return c.do(ctx, call{method: http.MethodDelete, path: holdPath(workflowID), retry: idempotent})
}
