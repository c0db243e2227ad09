package client

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/fairshard/fairshard/api"
)

// The read-back and list calls: targets and holds read back, rows listed,
// cancel, dead-letter purge, cluster-wide namespace totals.

// NamespaceTotals are a namespace's counts summed over the members that
// answered, with each member's.
type NamespaceTotals = api.NamespaceTotals

// NodeNamespaceStats is one member's counts of a namespace.
type NodeNamespaceStats = api.NodeNamespaceStats

// TargetView is a route's target as read back, secrets redacted.
type TargetView = api.TargetView

// TargetList is every route's own target and the nodes' default.
type TargetList = api.TargetList

// PurgeResult counts the dead letters purged cluster-wide.
type PurgeResult = api.PurgeResult

// RowAttempt is one settled delivery attempt of a row.
type RowAttempt = api.RowAttempt

// RowPage is one page of a row listing, ordered by dispatch_key.
type RowPage = api.RowPage

// CancelResult is what a cancel did: Cancelled is false for a row being
// delivered or already finished (Row shows its status).
type CancelResult = api.CancelResult

// GetTarget reads the route's target back: its own, else the nodes'
// default. A route without either returns an *Error matching ErrNotFound.
func (c *Client) GetTarget(ctx context.Context, namespace, taskQueue string) (*TargetView, error) {
	var out TargetView
	if err := c.do(ctx, call{method: http.MethodGet, path: targetPath(namespace, taskQueue), out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListTargets lists the routes with a target of their own and the nodes'
// default target.
func (c *Client) ListTargets(ctx context.Context) (*TargetList, error) {
	var out TargetList
	if err := c.do(ctx, call{method: http.MethodGet, path: "/v1/targets", out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// ListHolds returns the held workflows' ids, sorted.
func (c *Client) ListHolds(ctx context.Context) ([]string, error) {
	var out struct {
		Holds []struct {
			WorkflowID string `json:"workflow_id"`
		} `json:"holds"`
	}
	if err := c.do(ctx, call{method: http.MethodGet, path: "/v1/holds", out: &out}); err != nil {
		return nil, err
	}
	ids := make([]string, len(out.Holds))
	for i, h := range out.Holds {
		ids[i] = h.WorkflowID
	}
	return ids, nil
}

// IsHeld reports whether the workflow is held.
func (c *Client) IsHeld(ctx context.Context, workflowID string) (bool, error) {
	var out struct {
		Held bool `json:"held"`
	}
	if err := c.do(ctx, call{method: http.MethodGet, path: holdPath(workflowID), out: &out}); err != nil {
		return false, err
	}
	return out.Held, nil
}

// RowQuery selects a page of a namespace's rows; empty fields match all.
type RowQuery struct {
	TaskQueue, WorkflowID string
	Status                Status
	// Limit is the page size, 1–1000 (0: 100); After starts the page after
	// this dispatch_key (a page's Next).
	Limit int
	After string
}

// ListRows returns one page of the namespace's rows on every node.
func (c *Client) ListRows(ctx context.Context, namespace string, q RowQuery) (*RowPage, error) {
	v := url.Values{}
	for k, s := range map[string]string{"task_queue": q.TaskQueue, "workflow_id": q.WorkflowID, "status": string(q.Status), "after": q.After} {
		if s != "" {
			v.Set(k, s)
		}
	}
	if q.Limit != 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	path := "/v1/namespaces/" + url.PathEscape(namespace) + "/rows"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	var out RowPage
	if err := c.do(ctx, call{method: http.MethodGet, path: path, out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// Cancel withdraws a pending row wherever it is held (reason, ≤ 256
// bytes, is recorded as its last_error; "" for the default). A key no
// node holds returns an *Error matching ErrNotFound. Repeating it is
// safe.
func (c *Client) Cancel(ctx context.Context, dispatchKey, reason string) (*CancelResult, error) {
	body, err := marshal(map[string]string{"dispatch_key": dispatchKey, "reason": reason})
	if err != nil {
		return nil, err
	}
	var out CancelResult
	if err := c.do(ctx, call{method: http.MethodPost, path: "/v1/rows/cancel", body: body, retry: idempotent, out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// PurgeDeadLetters turns the namespace's dead letters (all, or those of
// dispatchKeys) into cancelled tombstones on every node: never delivered
// nor redriven. Repeating it is safe.
func (c *Client) PurgeDeadLetters(ctx context.Context, namespace string, dispatchKeys ...string) (*PurgeResult, error) {
	cl := call{method: http.MethodPost, path: "/v1/namespaces/" + url.PathEscape(namespace) + "/dead-letters/purge", retry: idempotent}
	if dispatchKeys != nil {
		body, err := marshal(map[string][]string{"keys": dispatchKeys})
		if err != nil {
			return nil, err
		}
		cl.body = body
	}
	var out PurgeResult
	cl.out = &out
	if err := c.do(ctx, cl); err != nil {
		return nil, err
	}
	return &out, nil
}
