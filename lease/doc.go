// Package lease is the network-free core of exact cluster-wide quotas
// (docs/architecture.md "Exact quotas"; docs/adr/0019-capacity-leases.md).
// The model is YouTube's Doorman: nodes report wants and has, a
// coordinator answers with what each node gets, as a lease with an expiry
// and a refresh interval, and never has more than the quota out.
//
//   - Coordinator is the per-namespace state on the node that coordinates
//     the namespace (the primary of shard xxhash64(namespace) mod S, see
//     CoordinatorShard): each node's wants, has and outstanding grant with
//     its expiry. It splits the quota with backpressure.FairShare, counting
//     every node's holding as max(grant, has). After a failover it learns
//     for one learning period (by default the lease length): it only
//     confirms what nodes report they hold.
//   - Client is a node's side: its grant per namespace with expiry and
//     refresh interval. It builds one batched Request per coordinator per
//     refresh, applies the Responses, and keeps a grant until it expires
//     when the coordinator cannot be reached; then the ceiling is 0. It
//     implements quota.Grants, so quota.Leased turns grants into ceilings.
//   - Request and Response are the wire messages of the node-to-node call
//     (one per node pair per refresh, whatever the number of namespaces),
//     with JSON encoding and validation bounded like the public API's.
//
// Nothing here does I/O: clocks are injected, the call itself is a
// Transport function the node supplies (an HTTP call to another node, or
// this node's own Coordinator.Handle), and who is primary of a shard is an
// input.
package lease
