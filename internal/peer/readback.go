package peer

import (
	"context"
	"net/http"
	"net/url"

	"github.com/fairshard/fairshard/api"
)

// The read-back's node-to-node paths (a namespace's rows and counts, a
// cancel, a purge).
const (
	PathStats  = "/internal/v1/stats"
	PathCancel = "/internal/v1/rows/cancel"
)

// PathRowList is a namespace's row listing on one node (ns escaped).
func PathRowList(ns string) string { return "/internal/v1/namespaces/" + ns + "/rows" }

// PathPurge is a namespace's dead-letter purge on one node (ns escaped).
func PathPurge(ns string) string { return PathDeadLetters(ns) + "/purge" }

// NodeStats is one node's answer to RouteStats: its counts and delivery
// figures for every namespace holding rows or with metrics on it.
type NodeStats struct {
	Node       string                            `json:"node"`
	Namespaces map[string]api.NodeNamespaceStats `json:"namespaces"`
}

// CancelRequest is the body of a cancel (public and node-to-node): the
// row's dispatch_key and an optional reason (stored as its last_error).
type CancelRequest struct {
	DispatchKey string `json:"dispatch_key"`
	Reason      string `json:"reason,omitempty"`
}

// PurgeResponse counts the dead letters a node purged.
type PurgeResponse struct {
	Purged int `json:"purged"`
}

// Stats returns the counts of the node at apiAddr (RouteStats).
func (c *Client) Stats(ctx context.Context, apiAddr string) (NodeStats, error) {
	var s NodeStats
	err := c.Call(ctx, http.MethodGet, apiAddr, PathStats, nil, &s)
	return s, err
}

// Rows returns the page of ns's row listing held by the node at apiAddr;
// query is the public listing's query string as the caller validated it
// (task_queue, workflow_id, status, after, limit). Its UnreachableNodes is
// empty: the asking node names those itself.
func (c *Client) Rows(ctx context.Context, apiAddr, ns string, query url.Values) (api.RowPage, error) {
	var p api.RowPage
	err := c.Call(ctx, http.MethodGet, apiAddr, PathRowList(url.PathEscape(ns))+"?"+query.Encode(), nil, &p)
	return p, err
}

// Cancel cancels req's row on the node at apiAddr, if it holds it; an
// error wrapping ErrNotFound when it does not.
func (c *Client) Cancel(ctx context.Context, apiAddr string, req CancelRequest) (api.CancelResult, error) {
	var res api.CancelResult
	err := c.Call(ctx, http.MethodPost, apiAddr, PathCancel, req, &res)
	return res, err
}

// Purge purges the dead letters of ns (all, or req.Keys) the node at
// apiAddr is primary of, and returns how many it purged.
func (c *Client) Purge(ctx context.Context, apiAddr, ns string, req DeadLetterKeys) (int, error) {
	var resp PurgeResponse
	err := c.Call(ctx, http.MethodPost, apiAddr, PathPurge(url.PathEscape(ns)), req, &resp)
	return resp.Purged, err
}
