package node

import (
	"github.com/fairshard/fairshard/internal/httpapi"
	"github.com/fairshard/fairshard/replication"
)

// The public API's request limits, as package httpapi enforces them (the
// error codes are package api's).
const (
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
