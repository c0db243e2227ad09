// Package peer is how one node talks to another: a Client for the
// node-to-node routes (/internal/v1: forwarded appends, handoff batches,
// batched capacity-lease calls (lease.go),
// row lookups, dead-letter pages, redrives), authenticated with the
// cluster secret, and the shapes those routes exchange (RowView, also the
// public API's row). The routes themselves are served by package httpapi.
// It knows nothing of ownership or stores: callers choose the peer.
package peer
