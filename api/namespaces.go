package api

import (
	"encoding/json"
	"time"
)

// Namespace is a namespace (tenant) as GET /v1/namespaces/{ns}, each entry
// of GET /v1/namespaces and the answer of PUT /v1/namespaces/{ns} show it:
// its cluster-wide settings plus the answering node's counts, ceiling and
// headroom. An exact-mode namespace's view also carries a "lease" object
// (the server's, documented in api/openapi.yaml; not decoded here).
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
	// (each node runs up to ceil(quota × owned/total), seed §3.6). ModeDefault
	// says it is the nodes' --default-quota-mode because none was set.
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
	// Ceiling is the node's ceiling (rows): its unexpired capacity lease in
	// exact mode, ceil(quota × owned/total) in proportional mode, 0 while
	// paused; Headroom is Ceiling − Claimed, at least 0.
	Ceiling  uint32 `json:"ceiling"`
	Headroom int    `json:"headroom"`
	// WaitingRoutes are task queues whose rows wait because no target is
	// set for them (nor a node default).
	WaitingRoutes []string `json:"waiting_routes,omitempty"`
	// Cluster sums the namespace's counts over every member that answered
	// (the GETs; nil in PUT's answer).
	Cluster *NamespaceTotals `json:"cluster,omitempty"`
}

// NamespaceRetry is a namespace's retry policy override. Zero fields keep
// the node's value. Durations travel in whole milliseconds (base_ms,
// cap_ms; finer parts are dropped).
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

// MarshalJSON encodes the policy as the API takes and shows it (base_ms,
// factor, cap_ms, max_attempts; zero fields left out).
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
