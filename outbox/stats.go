package outbox

import "time"

// NamespaceStats are one namespace's row counts on a node, all shards
// (owned or not), as a store reports them for the admin views and the
// backlog metrics.
type NamespaceStats struct {
	// Pending, Claimed, Done, Failed and Cancelled count rows by status.
	Pending, Claimed, Done, Failed, Cancelled int
	// OldestPending is the earliest VisibleAfter among the namespace's
	// claimable pending rows (not in transfer; future ones included), or the
	// zero time if it has none. now − OldestPending is the dispatch lag.
	OldestPending time.Time
}
