// Package httpapi is a node's HTTP API: the public /v1 routes (appends,
// row lookups, namespace settings, targets, holds, dead letters, cluster
// and shard views; bearer token when configured), and the open /metrics,
// /healthz and /readyz. It mounts the node-to-node /internal/v1 routes
// (cluster secret) without serving them itself: package peer's Server
// answers the fan-outs' routes from this package's local reads (local.go,
// peer.Local), and package replication's handler its own, behind this
// package's intake gate and its checks of rows from other nodes
// (internal.go). api/openapi.yaml describes every public route;
// the api package's test checks the routes (Routes) against it.
//
// It decodes and validates (a bad request is answered 4xx with a JSON
// error naming the field, and changes nothing), calls the node's parts
// through the interfaces declared here (Store, Appender, Dispatcher) and
// answers JSON. Where rows go is package router's business; the runtime
// config is package settings'; peers are reached through package peer.
//
// # Stopping
//
// RefuseAppends turns public appends away (503) and readiness false;
// CloseIntake then refuses every write from peers too and waits for the
// writes admitted, so a stopping node's final handoff sees every row it
// acknowledged.
//
// An API is safe for concurrent use.
package httpapi
