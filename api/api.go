// Package api holds the machine-readable description of fairshard's public
// HTTP API: api/openapi.yaml, an OpenAPI 3.1 document embedded in the
// binary and served by every node at GET /v1/openapi.yaml.
//
// The document is the reference for clients in other languages (generate
// one from it) and for the Go client (package client). Its test
// (openapi_test.go) keeps it honest: it loads the document with a
// maintained validator, checks that the node's routes and the document's
// operations match both ways, and validates docs/api.md's example requests,
// the Go client's requests and a real node's answers against it. A route
// added to the node without an entry here fails that test, saying what to
// add.
//
// It also holds the wire types the server and the Go client share (the
// error codes, Waiting and LeaveStatus in wire.go; rows, pages, cancels
// and appends in rows.go; the namespace view in namespaces.go; the
// cluster, shard, namespace-totals, target and bulk-call answers in
// views.go), so the client imports no server package and the two cannot
// drift apart. The package has no dependencies and no state.
package api

import _ "embed"

//go:embed openapi.yaml
var spec string

// OpenAPIYAML returns the OpenAPI 3.1 document (YAML) describing the /v1
// API, the health endpoints and /metrics. Node-to-node routes
// (/internal/v1/…) are not part of it.
func OpenAPIYAML() string { return spec }

// ContentType is the media type the document is served with (RFC 9512).
const ContentType = "application/yaml"
