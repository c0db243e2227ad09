// Package loadgen drives a fairshard cluster over its public HTTP API and
// measures what comes out the other end. It is shared by `fairshard load`,
// `fairshard demo`, the e2e suite and the chaos soak, so there is one copy
// of load code.
//
//   - Generator appends rows through the Go API client (package client:
//     POST /v1/rows over one or more nodes, with its failover and
//     retries), open loop or at a target rate, over weighted namespaces;
//     or paced, each namespace at its own rate in bursts, through the
//     nodes there are now, every batch sent until it is acknowledged.
//   - Ledger records every row's fate: its attempts, their failures and
//     the answer that acknowledged it (shard, node, status).
//   - Receiver is an http.Handler delivery target: it records every
//     delivery by dispatch_key, counts duplicates, tracks concurrent
//     in-flight requests per namespace (current and max) and the
//     append-to-delivery latency carried in each payload.
//
// Both are safe for concurrent use. Neither imports fairshard internals:
// they speak only the documented HTTP API (through package client) and
// delivery headers.
package loadgen
