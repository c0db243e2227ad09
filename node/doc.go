// Package node composes one fairshard process: the bbolt store, cluster
// membership and gossiped config, the fair dispatcher, append routing to
// shard owners, handoff of rows held for shards owned elsewhere, and the
// HTTP API (public /v1, node-to-node /internal/v1, /metrics, /healthz,
// /readyz). cmd/node turns flags and signals into a Config and calls New,
// Start and Shutdown; tests build in-process clusters the same way.
//
// # Lifecycle
//
// New opens the store (lock timeout: a second process on the same data dir
// fails clearly), binds the HTTP listener and creates the memberlist node.
// Start serves, joins and launches the loops. Shutdown drains in this order:
// refuse appends → stop claiming and finish in-flight deliveries → mark the
// node leaving (it owns nothing) → refuse rows from peers and wait for the
// writes in progress → hand off every row it holds (at once when no other
// member owns their shards: they stay on disk) → leave the gossip → stop
// serving → close the store. Close stops at once.
//
// # Ownership
//
// The node has one applied ownership view (applySnapshot, ownership): a
// cluster snapshot becomes the store's claim scope first and is then the
// view the planner's ceilings, append routing, handoff and the admin views
// read, so they never disagree with the scope. While the node waits to
// join, that view owns nothing.
//
// # What it does not own
//
// Claim semantics (package backpressure), delivery (dispatch), storage
// (boltstore) and membership (cluster) live in their packages; this one only
// wires them and speaks HTTP.
//
// # Concurrency
//
// A Node is safe for concurrent use. Its goroutines (HTTP server, ownership
// and config watchers, dispatcher, handoff, tombstone GC, stats) all stop in
// Close.
package node
