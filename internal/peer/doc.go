// Package peer is the node-to-node protocol of the public API's fan-outs:
// every /internal/v1 route's pattern (routes.go), path, request and answer
// types, and a Client method calling each (row lookups, dead-letter pages,
// redrives and purges, row listings, cancels, namespace counts, batched
// capacity-lease calls), and the Server answering them (server.go) from a
// node's Local reads and its Leases. Package httpapi implements Local from
// the same local reads as its /v1 routes and mounts the Server; package
// nodeauth's middleware signs and verifies every call. Forwarded appends, copies and
// shard sync are package replication's own routes (its http.go, server and
// client side by side). It knows nothing of ownership or stores: callers
// choose the peer.
package peer
