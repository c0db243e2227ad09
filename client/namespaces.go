package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// Namespace is a namespace (tenant) as GET /v1/namespaces/{ns} shows it:
// its cluster-wide settings plus the answering node's counts.
type Namespace struct {
	Name string `json:"namespace"`
	// MaxInFlight is the cluster-wide quota: the most rows of the namespace
	// being delivered at once (rows). MaxInFlightDefault says it is the
	// nodes' --default-max-in-flight because none was set.
	MaxInFlight        uint32 `json:"max_in_flight"`
	MaxInFlightDefault bool   `json:"max_in_flight_default"`
	Paused             bool   `json:"paused"`
	// Mode is the quota mode, "exact" (the cluster never runs more than
	// MaxInFlight at once; nodes hold capacity leases) or "proportional"
	// (each node runs up to ceil(quota × owned/total)). ModeDefault says
	// it is the nodes' --default-quota-mode because none was set.
	Mode        string `json:"mode"`
	ModeDefault bool   `json:"mode_default"`
	// Retry is the namespace's retry policy override, nil when it uses the
	// nodes' policy.
	Retry *NamespaceRetry `json:"retry,omitempty"`
	// Node is the node whose counts these are; the counts below cover only
	// the rows it holds.
	Node        string `json:"node"`
	Pending     int    `json:"pending"`
	Claimed     int    `json:"claimed"`
	DeadLetters int    `json:"dead_letters"`
	// OwnedShardFraction is the node's share of shards, in [0,1].
	OwnedShardFraction float64 `json:"owned_shard_fraction"`
	// Ceiling is the node's ceiling: its unexpired capacity lease in exact
	// mode, ceil(quota × owned/total) in proportional mode, 0 while
	// paused; Headroom is Ceiling − Claimed, at least 0.
	Ceiling  uint32 `json:"ceiling"`
	Headroom int    `json:"headroom"`
	// WaitingRoutes are task queues whose rows wait because no target is
	// set for them (nor a node default).
	WaitingRoutes []string `json:"waiting_routes,omitempty"`
	// Cluster sums the namespace's counts over every member that answered
	// (GetNamespace and ListNamespaces; nil in UpdateNamespace's answer).
	Cluster *NamespaceTotals `json:"cluster,omitempty"`
}

// NamespaceRetry is a namespace's retry policy override. Zero fields keep
// the node's value. Durations travel in whole milliseconds (finer parts are
// dropped).
type NamespaceRetry struct {
	// Base is the first backoff (at most 1 h); Factor multiplies it per
	// attempt (1–10); Cap bounds it (at most 24 h, at least Base).
	Base   time.Duration
	Factor float64
	Cap    time.Duration
	// MaxAttempts before the row becomes a dead letter (at most 1000).
	MaxAttempts uint32
}

type wireRetry struct {
	BaseMS      int64   `json:"base_ms,omitempty"`
	Factor      float64 `json:"factor,omitempty"`
	CapMS       int64   `json:"cap_ms,omitempty"`
	MaxAttempts uint32  `json:"max_attempts,omitempty"`
}

// MarshalJSON encodes the policy as the API takes it (base_ms, factor,
// cap_ms, max_attempts).
func (r NamespaceRetry) MarshalJSON() ([]byte, error) {
	return json.Marshal(wireRetry{BaseMS: r.Base.Milliseconds(), Factor: r.Factor, CapMS: r.Cap.Milliseconds(), MaxAttempts: r.MaxAttempts})
}

// UnmarshalJSON decodes the API's form.
func (r *NamespaceRetry) UnmarshalJSON(b []byte) error {
	var w wireRetry
	if err := json.Unmarshal(b, &w); err != nil {
		return err
	}
	*r = NamespaceRetry{Base: time.Duration(w.BaseMS) * time.Millisecond, Factor: w.Factor,
		Cap: time.Duration(w.CapMS) * time.Millisecond, MaxAttempts: w.MaxAttempts}
	return nil
}

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
