package peer

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/fairshard/fairshard/lease"
)

// PathLeases is the coordinator's batched lease route: one POST per node
// pair per refresh carries every namespace the caller asks that node about.
const PathLeases = "/internal/v1/leases"

// PathLeaseStatus is a namespace's coordinator state (each node's wants,
// has and grant), read by the namespace view of another node.
func PathLeaseStatus(ns string) string { return PathLeases + "/" + url.PathEscape(ns) }

// Lease sends one batched lease Request to the coordinator at apiAddr and
// returns its Response, validated against the request
// (lease.DecodeResponse: every asked namespace answered once, expiries in
// range). The request is validated before it is sent (lease.EncodeRequest).
// Errors name the peer; a malformed answer is a *lease.FieldError wrapped.
func (c *Client) Lease(ctx context.Context, apiAddr string, req lease.Request) (lease.Response, error) {
	body, err := lease.EncodeRequest(req)
	if err != nil {
		return lease.Response{}, fmt.Errorf("peer lease call to %s: %w", apiAddr, err)
	}
	var raw json.RawMessage
	if err := c.CallBody(ctx, http.MethodPost, apiAddr, PathLeases, "application/json", body, &raw); err != nil {
		return lease.Response{}, err
	}
	resp, err := lease.DecodeResponse(bytes.NewReader(raw), req)
	if err != nil {
		return lease.Response{}, fmt.Errorf("peer lease answer of %s: %w", apiAddr, err)
	}
	return resp, nil
}

// PathLeaseHandoff is the successor's route for a coordinator's records
// (lease/handoff.go).
const PathLeaseHandoff = "/internal/v1/lease-handoff"

// LeaseHandoff ships a coordinator's records to the successor at apiAddr
// (validated first: lease.Handoff.Validate). Errors name the peer.
func (c *Client) LeaseHandoff(ctx context.Context, apiAddr string, h lease.Handoff) error {
	if err := h.Validate(); err != nil {
		return fmt.Errorf("peer lease hand-off to %s: %w", apiAddr, err)
	}
	if h.Namespaces == nil {
		h.Namespaces = []lease.HandoffNamespace{}
	}
	body, err := json.Marshal(h)
	if err != nil {
		return fmt.Errorf("peer lease hand-off to %s: %w", apiAddr, err)
	}
	return c.CallBody(ctx, http.MethodPost, apiAddr, PathLeaseHandoff, "application/json", body, nil)
}

// LeaseStatus returns the coordinator state of namespace ns held by the
// node at apiAddr; an error wrapping ErrNotFound when it holds none (it
// does not coordinate ns, or no node has asked about ns).
func (c *Client) LeaseStatus(ctx context.Context, apiAddr, ns string) (lease.NamespaceStatus, error) {
	var st lease.NamespaceStatus
	err := c.Call(ctx, http.MethodGet, apiAddr, PathLeaseStatus(ns), nil, &st)
	return st, err
}
