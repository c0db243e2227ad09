package node

import (
	"github.com/fairshard/fairshard/internal/httpapi"
	"github.com/fairshard/fairshard/replication"
)

// The public API's error codes and request limits, as package httpapi
// defines and enforces them, under the names callers and tests have used
// since they lived here.
const (
	CodeInvalidJSON      = httpapi.CodeInvalidJSON
	CodeInvalidField     = httpapi.CodeInvalidField
	CodeTooLarge         = httpapi.CodeTooLarge
	CodeUnauthorized     = httpapi.CodeUnauthorized
	CodeNotFound         = httpapi.CodeNotFound
	CodeMethodNotAllowed = httpapi.CodeMethodNotAllowed
	CodeLimitExceeded    = httpapi.CodeLimitExceeded
	CodeUnavailable      = httpapi.CodeUnavailable
	CodeInternal         = httpapi.CodeInternal
	// CodeInsufficientCopies: an append refused for want of replicas
	// (503 with Retry-After).
	CodeInsufficientCopies = httpapi.CodeInsufficientCopies
	// CodeUnsupportedMediaType: a /v1 write without Content-Type
	// application/json (415).
	CodeUnsupportedMediaType = httpapi.CodeUnsupportedMediaType
	// CodeCrossSite: a write a browser sent for another site (403).
	CodeCrossSite = httpapi.CodeCrossSite
	// CodeMisdirected: a Host that is not this node's, without an API
	// token (421).
	CodeMisdirected = httpapi.CodeMisdirected

	MaxBatchRows       = httpapi.MaxBatchRows
	MaxRequestBytes    = httpapi.MaxRequestBytes
	MaxPayloadBytes    = httpapi.MaxPayloadBytes
	MaxKeyBytes        = httpapi.MaxKeyBytes
	MaxLabelBytes      = httpapi.MaxLabelBytes
	MaxWorkflowIDBytes = httpapi.MaxWorkflowIDBytes
	MaxDelay           = httpapi.MaxDelay
	MaxQuota           = httpapi.MaxQuota
	MaxTargetTimeout   = httpapi.MaxTargetTimeout
	MaxTargetURLBytes  = httpapi.MaxTargetURLBytes

	// MaxHandoffBodyBytes bounds a node-to-node batch (replication's
	// routes).
	MaxHandoffBodyBytes = replication.MaxBodyBytes
)

// ValidName reports whether s is a valid namespace or task_queue name
// (httpapi.ValidName).
func ValidName(s string) bool { return httpapi.ValidName(s) }

// Routes returns the patterns of every route the node serves, in
// net/http.ServeMux syntax ("GET /v1/rows/{key...}"), node-to-node routes
// included, sorted. Every public one must be described in api/openapi.yaml.
func (n *Node) Routes() []string { return n.api.Routes() }
