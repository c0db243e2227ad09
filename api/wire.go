package api

import "time"

// Error codes of the API's JSON errors ({"error":{"code","field","message"}}),
// as listed in openapi.yaml (components/schemas/ErrorCode). The server
// answers with them and the Go client matches on them.
const (
	// CodeInvalidJSON: the body (or a row of it) is not the JSON the call
	// takes: bad syntax, a value of the wrong type or an unknown field.
	CodeInvalidJSON = "invalid_json"
	// CodeInvalidField: a field's value breaks a rule; the error's field names it,
	// e.g. "rows[3].namespace".
	CodeInvalidField = "invalid_field"
	// CodeTooLarge: the body, the batch or a payload is over its limit
	// (HTTP 413).
	CodeTooLarge = "too_large"
	// CodeUnauthorized: the node runs with --api-token and the call did not
	// carry it (HTTP 401).
	CodeUnauthorized = "unauthorized"
	// CodeNotFound: no such row (GET /v1/rows/{key}) or no such endpoint.
	CodeNotFound = "not_found"
	// CodeMethodNotAllowed: the path exists but not with this method (405).
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeLimitExceeded: the write would pass a documented cap of the
	// gossiped config (--max-namespaces, --max-targets, --max-holds, or its
	// total size); the error's field names what is capped ("namespace", "target",
	// "hold", "config"). Nothing changed (HTTP 409); not retried.
	CodeLimitExceeded = "limit_exceeded"
	// CodeUnavailable: the node cannot take the call now (draining, store
	// failure); another node, or a retry, may (HTTP 503).
	CodeUnavailable = "unavailable"
	// CodeInsufficientCopies: an append some row of which could not be made
	// durable on the write-copies minimum of its replicas (a replica is
	// down); nothing is reported stored (HTTP 503 with Retry-After):
	// retried like any 503.
	CodeInsufficientCopies = "insufficient_copies"
	// CodeInternal: the node failed (HTTP 500).
	CodeInternal = "internal"
	// CodeUnsupportedMediaType: a POST, PUT or PATCH without Content-Type
	// application/json (HTTP 415); the Go client always sends it.
	CodeUnsupportedMediaType = "unsupported_media_type"
	// CodeCrossSite: a write a browser sent for a page of another site
	// (HTTP 403); never sent by the Go client.
	CodeCrossSite = "cross_site"
	// CodeMisdirected: a node without --api-token refused the Host the
	// request named (HTTP 421): reach it by a loopback name, one of its
	// addresses, or a name in its --allow-host.
	CodeMisdirected = "misdirected"
)

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
	// per-node ceiling (rows): in QuotaMode "exact" Node's capacity lease
	// grant, in "proportional" ceil(quota × owned/total) (DESIGN.md
	// "Exact cluster-wide quota"; seed §3.6); Quota is the cluster-wide
	// quota (rows); OwnedShardFraction is Node's owned/total in [0,1].
	Claimed            *int     `json:"claimed,omitempty"`
	Ceiling            *uint32  `json:"ceiling,omitempty"`
	Quota              *uint32  `json:"quota,omitempty"`
	OwnedShardFraction *float64 `json:"owned_shard_fraction,omitempty"`
	QuotaMode          string   `json:"quota_mode,omitempty"`
	// Coordinator is the namespace's lease coordinator in Node's view and
	// Wants Node's last reported demand to it (rows); exact mode only.
	Coordinator string  `json:"coordinator,omitempty"`
	Wants       *uint32 `json:"wants,omitempty"`
	// Host is the route's target host; HostLimit and HostInFlight its
	// concurrency limit and rows in flight to it on Node (rows).
	Host         string `json:"host,omitempty"`
	HostLimit    *int   `json:"host_limit,omitempty"`
	HostInFlight *int   `json:"host_in_flight,omitempty"`
}

// LeaveStatus is a leaving node's hand-off progress, GET /v1/cluster's
// replication.leave (present only while the node leaves): a graceful stop
// ends only once every row held here is held by its shard's replica set
// (docs/operations.md "Drain and stop").
type LeaveStatus struct {
	// Since is when the graceful stop began waiting for the hand-off.
	Since time.Time `json:"since,omitzero"`
	// ShardsLeft counts the shards that still hold rows here, as of At.
	ShardsLeft int       `json:"shards_left"`
	At         time.Time `json:"at,omitzero"`
	// LastError is why the last hand-off pass did not finish ("" if it
	// did): e.g. a member of a set that does not answer.
	LastError string `json:"last_error,omitempty"`
	// StrandedRows are rows still marked in transfer whose release failed
	// (retried before anything else).
	StrandedRows int `json:"stranded_rows"`
	// RowsHandedOff counts the rows (pending and terminal) this leave has
	// had confirmed held by their shards' replica sets so far, batch by
	// batch (a row sent again after a failed pass counts again): it rises
	// while a long pass runs, before ShardsLeft falls.
	RowsHandedOff int64 `json:"rows_handed_off"`
	// Waiting says why a leave that sees no other member to hand off to
	// has not stopped as the last node: a member failed recently and may
	// return (ADR 0082). "" otherwise.
	Waiting string `json:"waiting,omitempty"`
}
