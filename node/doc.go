// Package node composes one fairshard process from its parts and runs
// them under one lifecycle: the outbox store (bbolt, or any Store), cluster
// membership and the gossiped config (cluster, kv), the fair dispatcher
// (dispatch, backpressure) and the node's own parts, each a package of its
// own with the interfaces it consumes declared where it consumes them:
//
//   - httpapi: the HTTP API (public /v1, node-to-node /internal/v1,
//     /metrics, /healthz, /readyz): decoding, validation, answers;
//   - router: where each appended row is stored (here, forwarded to its
//     shard's owner, or held here while the owner is unreachable);
//   - settings: the runtime config kept in the gossiped config (quotas,
//     pauses, retry overrides, targets, holds) and its persistence;
//   - handoff: moving rows held for shards owned elsewhere (package
//     transfer's Mover, one sink per owner);
//   - peer: the client of other nodes' /internal/v1 routes.
//
// cmd/node turns flags and signals into a Config and calls New, Start and
// Shutdown; tests build in-process clusters the same way, on bbolt files
// (New) or on memstore (NewWithStore).
//
// # Lifecycle
//
// New opens the store (lock timeout: a second process on the same data dir
// fails clearly), binds the HTTP listener, creates the memberlist node and
// wires the parts. Its services (services.go) start in a declared order
// and stop in the reverse one (lifecycle.Manager): store, peer client,
// HTTP server, cluster, ownership, join, config watcher, tombstone GC,
// stats, handoff, dispatcher, intake. So Shutdown stops in this order:
// refuse appends and mark the node leaving (peers take its shards after a
// gossip round; it owns nothing, so it stops claiming) → finish in-flight
// deliveries → refuse rows from peers and wait for the writes in progress
// → hand off every row it holds (at once when no other member owns their
// shards: they stay on disk) → leave the gossip → stop serving → close the
// store. Close walks the same list at once.
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
// (boltstore, memstore) and membership (cluster) live in their packages;
// this one only wires them.
//
// # Concurrency
//
// A Node is safe for concurrent use. Every goroutine it starts belongs to
// one of its services and has returned when Shutdown or Close returns.
package node
