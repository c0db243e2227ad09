package node

import (
	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/httpapi"
	"github.com/fairshard/fairshard/replication"
)

// The public API's error codes (package api) and request limits (as
// package httpapi enforces them), under the names callers and tests have used
// since they lived here.
const (
	CodeInvalidJSON      = api.CodeInvalidJSON
	CodeInvalidField     = api.CodeInvalidField
	CodeTooLarge         = api.CodeTooLarge
	CodeUnauthorized     = api.CodeUnauthorized
	CodeNotFound         = api.CodeNotFound
	CodeMethodNotAllowed = api.CodeMethodNotAllowed
	CodeLimitExceeded    = api.CodeLimitExceeded
	CodeUnavailable      = api.CodeUnavailable
	CodeInternal         = api.CodeInternal
	// CodeInsufficientCopies: an append refused for want of replicas
	// (503 with Retry-After).
	CodeInsufficientCopies = api.CodeInsufficientCopies
	// CodeUnsupportedMediaType: a /v1 write without Content-Type
	// application/json (415).
	CodeUnsupportedMediaType = api.CodeUnsupportedMediaType
	// CodeCrossSite: a write a browser sent for another site (403).
	CodeCrossSite = api.CodeCrossSite
	// CodeMisdirected: a Host that is not this node's, without an API
	// token (421).
	CodeMisdirected = api.CodeMisdirected

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
