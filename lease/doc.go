// Package lease is exact cluster-wide quotas (docs/architecture.md "Exact
// quotas"; docs/adr/0019-capacity-leases.md): the protocol's core and the
// node's service that runs it.
// The model is YouTube's Doorman: nodes report wants and has, a
// coordinator answers with what each node gets, as a lease with an expiry
// and a refresh interval, and never has more than the quota out.
//
//   - Coordinator is the per-namespace state on the node that coordinates
//     the namespace (the primary of shard xxhash64(namespace) mod S, see
//     CoordinatorShard): each node's wants, has and outstanding grant with
//     its expiry. It splits the quota with backpressure.FairShare, counting
//     every node's holding as max(grant, has). After a failover it learns
//     for one learning period (by default the lease length), or until
//     every member has reported in the term: it only confirms what nodes
//     report they hold.
//
//   - Client is a node's side: its grant per namespace with expiry and
//     refresh interval. It builds one batched Request per coordinator per
//     refresh, applies the Responses, and keeps a grant until it expires
//     when the coordinator cannot be reached; then the ceiling is 0. It
//     implements quota.Grants, so quota.Leased turns grants into ceilings.
//
//   - Request and Response are the wire messages of the node-to-node call
//     (one per node pair per refresh, whatever the number of namespaces),
//     with JSON encoding and validation bounded like the public API's.
//
//   - Service is a node's part: the Coordinator of every namespace whose
//     coordinator shard this node is primary of in its applied ownership
//     view, and the Client, refreshed once per refresh interval (sooner
//     for a namespace new here: AfterSweep) with the demand it measures
//     (DemandStore, the claim rule quota.Claims), one batched call per
//     coordinator node through ServiceConfig.Call. A graceful stop gives
//     its grants back (Release).
//
// The core (Coordinator, Client, the wire) does no I/O: clocks are
// injected, the call itself is a Transport function (an HTTP call to
// another node, or this node's own Coordinator.Handle), and who is primary
// of a shard is an input. Service does the I/O through the functions its
// config gives it.
package lease
