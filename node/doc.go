// Package node composes one fairshard process from its parts and runs
// them under one lifecycle: the outbox store (bbolt, or any Store), cluster
// membership and the gossiped config (cluster, kv), replication (the one
// write path every row change takes: replication.Store), the lease service
// of exact quotas (lease.Service), the fair dispatcher (dispatch,
// backpressure, with quota's claim rule) and the node's own parts, each a
// package of its own with the interfaces it consumes declared where it
// consumes them:
//
//   - httpapi: the HTTP API (public /v1, node-to-node /internal/v1,
//     /metrics, /healthz, /readyz): decoding, validation, answers;
//   - router: where each appended row goes (its shard's primary, which
//     writes it to the replica set before it answers);
//   - settings: the runtime config kept in the gossiped config (quotas,
//     pauses, retry overrides, targets, holds) and its persistence;
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
// and stop in the reverse one (lifecycle.Manager). Shutdown: refuse
// appends and mark the node leaving (peers take its shards after a gossip
// round; it owns nothing, so it stops claiming, and the hand-off of every
// copy it holds begins) → finish in-flight deliveries (half the grace) →
// give the capacity leases back → refuse rows from peers and wait until
// every row held here is held by its shard's replica set (the drain, with
// no deadline of its own: past the grace the node says so and goes on;
// only the caller's context, a second signal, cuts it short; when no
// other member can take the rows they stay on disk, at once unless a
// member failed moments ago and may return: ADR 0082) → leave the
// gossip → stop serving → close the store. Close walks the same list at
// once.
//
// # Ownership
//
// The node has one applied ownership view (applySnapshot, ownership): a
// cluster snapshot becomes the replicator's view and the store's claim
// scope first and is then the view the planner's ceilings, the lease
// service and the admin views read, so they never disagree with the scope.
// While the node waits to join, that view owns nothing.
//
// # What it does not own
//
// Claim semantics (backpressure, quota), delivery (dispatch), replication
// and its hand-offs (replication, transfer), storage (boltstore,
// memstore), exact quotas (lease) and membership (cluster) live in their
// packages; this one only wires them.
//
// # Concurrency
//
// A Node is safe for concurrent use. Every goroutine it starts belongs to
// one of its services and has returned when Shutdown or Close returns.
package node
