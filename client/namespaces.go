package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"

	"github.com/fairshard/fairshard/api"
)

// Namespace is a namespace (tenant) as GET /v1/namespaces/{ns} shows it:
// its cluster-wide settings plus the answering node's counts (package
// api's type, shared with the server).
type Namespace = api.Namespace

// NamespaceRetry is a namespace's retry policy override (Durations travel
// in whole milliseconds).
type NamespaceRetry = api.NamespaceRetry

// NamespaceUpdate changes some of a namespace's settings; nil fields are
// left as they are. Settings are gossiped: every node applies them within
// moments (last writer wins).
type NamespaceUpdate struct {
	// MaxInFlight sets the cluster-wide quota (0–1,000,000 rows; 0 stops
	// delivery). DefaultMaxInFlight returns it to the nodes' default
	// instead; set one of the two.
	MaxInFlight        *uint32
	DefaultMaxInFlight bool
	// Paused stops (true) or resumes (false) claiming the namespace's rows.
	Paused *bool
	// Retry sets the retry override; DefaultRetry removes it (the node
	// policy applies again). Set one of the two.
	Retry        *NamespaceRetry
	DefaultRetry bool
	// Mode sets the quota mode, "exact" or "proportional" ("" leaves it);
	// DefaultMode returns it to the nodes' default instead.
	Mode        string
	DefaultMode bool
}

// MarshalJSON encodes the update as PUT /v1/namespaces/{ns} takes it:
// absent fields are unchanged, null restores a default.
func (u NamespaceUpdate) MarshalJSON() ([]byte, error) {
	m := map[string]any{}
	switch {
	case u.MaxInFlight != nil && u.DefaultMaxInFlight:
		return nil, fmt.Errorf("NamespaceUpdate: set MaxInFlight or DefaultMaxInFlight, not both")
	case u.MaxInFlight != nil:
		m["max_in_flight"] = *u.MaxInFlight
	case u.DefaultMaxInFlight:
		m["max_in_flight"] = nil
	}
	if u.Paused != nil {
		m["paused"] = *u.Paused
	}
	switch {
	case u.Retry != nil && u.DefaultRetry:
		return nil, fmt.Errorf("NamespaceUpdate: set Retry or DefaultRetry, not both")
	case u.Retry != nil:
		m["retry"] = *u.Retry
	case u.DefaultRetry:
		m["retry"] = nil
	}
	switch {
	case u.Mode != "" && u.DefaultMode:
		return nil, fmt.Errorf("NamespaceUpdate: set Mode or DefaultMode, not both")
	case u.Mode != "":
		m["mode"] = u.Mode
	case u.DefaultMode:
		m["mode"] = nil
	}
	return json.Marshal(m)
}

// ListNamespaces returns every namespace the answering node knows (with
// rows on it or with settings), sorted by name, with that node's counts.
func (c *Client) ListNamespaces(ctx context.Context) ([]Namespace, error) {
	var out struct {
		Namespaces []Namespace `json:"namespaces"`
	}
	if err := c.do(ctx, call{method: http.MethodGet, path: "/v1/namespaces", out: &out}); err != nil {
		return nil, err
	}
	return out.Namespaces, nil
}

// GetNamespace returns a namespace's settings and the answering node's
// counts. Any valid name answers (an unknown namespace has default
// settings and zero counts); an invalid one returns ErrInvalidField.
func (c *Client) GetNamespace(ctx context.Context, namespace string) (*Namespace, error) {
	var out Namespace
	if err := c.do(ctx, call{method: http.MethodGet, path: "/v1/namespaces/" + url.PathEscape(namespace), out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// UpdateNamespace applies u and returns the namespace as the answering node
// sees it afterwards. Invalid values return ErrInvalidField naming the
// field (e.g. "retry.cap_ms") and change nothing.
func (c *Client) UpdateNamespace(ctx context.Context, namespace string, u NamespaceUpdate) (*Namespace, error) {
	body, err := marshal(u)
	if err != nil {
		return nil, err
	}
	var out Namespace
	if err := c.do(ctx, call{method: http.MethodPut, path: "/v1/namespaces/" + url.PathEscape(namespace), body: body, retry: idempotent, out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// SetMaxInFlight sets a namespace's cluster-wide quota (rows delivered at
// once); see UpdateNamespace.
func (c *Client) SetMaxInFlight(ctx context.Context, namespace string, quota uint32) (*Namespace, error) {
	return c.UpdateNamespace(ctx, namespace, NamespaceUpdate{MaxInFlight: &quota})
}

// Pause stops claiming the namespace's rows cluster-wide (rows in flight
// finish); appends still succeed. See UpdateNamespace.
func (c *Client) Pause(ctx context.Context, namespace string) (*Namespace, error) {
	paused := true
	return c.UpdateNamespace(ctx, namespace, NamespaceUpdate{Paused: &paused})
}

// Resume undoes Pause. See UpdateNamespace.
func (c *Client) Resume(ctx context.Context, namespace string) (*Namespace, error) {
	paused := false
	return c.UpdateNamespace(ctx, namespace, NamespaceUpdate{Paused: &paused})
}
