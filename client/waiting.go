package client

import "time"

// Waiting is why a live row has not been delivered yet, as the node
// holding it sees it (GET /v1/rows/{dispatch_key}'s `waiting`).
type Waiting struct {
	// Reason is the first cause in check order: "claimed", "in_transfer",
	// "namespace_paused", "no_target", "workflow_held", "retry_backoff",
	// "delayed", "namespace_at_ceiling", "host_slots_full" or "claimable". Also lists the
	// other causes that hold too.
	Reason string   `json:"reason"`
	Also   []string `json:"also,omitempty"`
	// Message is one plain sentence with the numbers.
	Message string `json:"message"`
	// Node holds the row; Owner owns its shard in Node's view.
	Node  string `json:"node"`
	Owner string `json:"owner,omitempty"`
	// Attempt and LastError are the row's.
	Attempt   uint32 `json:"attempt"`
	LastError string `json:"last_error,omitempty"`
	// VisibleAfter is when the row may be claimed, while in the future;
	// ClaimedAt is when a claimed row was claimed.
	VisibleAfter *time.Time `json:"visible_after,omitempty"`
	ClaimedAt    *time.Time `json:"claimed_at,omitempty"`
	// Claimed and Ceiling are the namespace's claimed rows on Node and its
	// per-node ceiling (rows); Quota is the cluster-wide quota (rows);
	// OwnedShardFraction is Node's owned/total in [0,1].
	Claimed            *int     `json:"claimed,omitempty"`
	Ceiling            *uint32  `json:"ceiling,omitempty"`
	Quota              *uint32  `json:"quota,omitempty"`
	OwnedShardFraction *float64 `json:"owned_shard_fraction,omitempty"`
	// Host is the route's target host; HostLimit and HostInFlight its
	// concurrency limit and rows in flight to it on Node (rows).
	Host         string `json:"host,omitempty"`
	HostLimit    *int   `json:"host_limit,omitempty"`
	HostInFlight *int   `json:"host_in_flight,omitempty"`
}
