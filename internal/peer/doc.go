// Package peer is how one node talks to another: a Client for the
// node-to-node routes of the public API's fan-outs (/internal/v1: row
// lookups, dead-letter pages, redrives; batched capacity-lease calls,
// lease.go; forwarded appends, copies and shard sync are package
// replication's own routes), authenticated with the
// cluster secret, and the shapes those routes exchange (api.Row, also the
// public API's row). The routes themselves are served by package httpapi.
// It knows nothing of ownership or stores: callers choose the peer.
package peer
