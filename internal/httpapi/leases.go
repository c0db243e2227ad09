package httpapi

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/httperr"
	"github.com/fairshard/fairshard/internal/peer"
	"github.com/fairshard/fairshard/lease"
)

// Leases is the node's lease service as the API serves and shows it
// (exact quota mode).
type Leases interface {
	// HandleLease answers one batched lease call from another node
	// (lease.Coordinator.Handle); a *lease.FieldError is a bad request.
	HandleLease(req lease.Request) (lease.Response, error)
	// HandleHandoff keeps a coordinator's records shipped to this node as
	// the successor of their namespaces (lease.Coordinator.Inherit); it
	// returns how many namespaces it kept.
	HandleHandoff(h lease.Handoff) int
	// CoordinatorStatus is this node's coordinator state of ns, if any.
	CoordinatorStatus(ns string) (lease.NamespaceStatus, bool)
	// NodeLease is this node's side of ns's lease.
	NodeLease(ns string) lease.NodeLease
	// Learning reports whether this node coordinates a shard whose
	// coordinator term is still in its learning period (it grants nothing
	// new for those namespaces yet): GET /v1/cluster's leases_learning.
	Learning() bool
}

// leaseView is the "lease" object of an exact-mode namespace's view:
// this node's side, and the coordinator's (every node's wants, has and
// grant, and the sum of holdings) when it could be read.
type leaseView struct {
	lease.NodeLease
	// Cluster is the coordinator's state of the namespace: Outstanding is
	// Σ max(grant, has) over the nodes, an upper bound of what the cluster
	// runs at once; Nodes has each node's wants, has and grant.
	Cluster *lease.NamespaceStatus `json:"cluster,omitempty"`
	// ClusterError says why Cluster is missing (coordinator unreachable,
	// or ownership moving).
	ClusterError string `json:"cluster_error,omitempty"`
}

// leaseStatusTimeout bounds the namespace view's read of the coordinator.
const leaseStatusTimeout = 2 * time.Second

// leaseView builds ns's lease view; with cluster it also reads the
// coordinator's state (locally, or from the coordinator node).
func (a *API) leaseView(ctx context.Context, ns string, cluster bool) *leaseView {
	if a.cfg.Leases == nil {
		return nil
	}
	v := &leaseView{NodeLease: a.cfg.Leases.NodeLease(ns)}
	if !cluster {
		return v
	}
	switch {
	case v.Coordinator == "":
		v.ClusterError = "no coordinator: no live member owns the namespace's coordinator shard"
	case v.Coordinator == a.cfg.Self:
		if st, ok := a.cfg.Leases.CoordinatorStatus(ns); ok {
			v.Cluster = &st
		} else {
			v.ClusterError = "this node does not coordinate the namespace under its applied view yet"
		}
	default:
		addr := ""
		for _, m := range a.cfg.Ownership().Members {
			if m.Name == v.Coordinator {
				addr = m.APIAddr
			}
		}
		cctx, cancel := context.WithTimeout(ctx, leaseStatusTimeout)
		defer cancel()
		st, err := a.cfg.Peers.LeaseStatus(cctx, addr, ns)
		switch {
		case errors.Is(err, peer.ErrNotFound):
			v.ClusterError = "coordinator " + v.Coordinator + " does not coordinate the namespace under its view (ownership is moving)"
		case err != nil:
			v.ClusterError = "coordinator " + v.Coordinator + " unreachable: " + err.Error()
		default:
			v.Cluster = &st
		}
	}
	return v
}

// handleInternalLease is POST /internal/v1/leases: one node's batched
// lease call. A malformed body is a 400 naming the field (lease.FieldError)
// and changes nothing.
func (a *API) handleInternalLease(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Leases == nil {
		writeError(w, &httperr.Error{Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable, Message: "this node serves no leases"})
		return
	}
	req, err := lease.DecodeRequest(http.MaxBytesReader(w, r.Body, lease.MaxRequestBytes+1))
	if err == nil {
		var resp lease.Response
		if resp, err = a.cfg.Leases.HandleLease(req); err == nil {
			body, eerr := lease.EncodeResponse(resp)
			if eerr != nil {
				writeError(w, eerr)
				return
			}
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(body)
			return
		}
	}
	writeLeaseError(w, err)
}

// writeLeaseError answers a lease message the node refused: a
// *lease.FieldError is a 400 naming the field (413 for an oversized
// body), anything else as writeError does.
func writeLeaseError(w http.ResponseWriter, err error) {
	var fe *lease.FieldError
	switch {
	case errors.As(err, &fe) && fe.Field == "body" && strings.HasPrefix(fe.Reason, "exceeds"):
		writeError(w, httperr.TooLarge("body", "%s", fe.Reason))
	case errors.As(err, &fe):
		writeError(w, httperr.Field(fe.Field, "%s", fe.Reason))
	default:
		writeError(w, err)
	}
}

// handleInternalLeaseHandoff is POST /internal/v1/lease-handoff: a
// coordinator's records for the namespaces this node would coordinate
// should it fail (lease/handoff.go). A malformed body is a 400 naming the
// field and changes nothing; the answer is {"kept": n}.
func (a *API) handleInternalLeaseHandoff(w http.ResponseWriter, r *http.Request) {
	if a.cfg.Leases == nil {
		writeError(w, &httperr.Error{Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable, Message: "this node serves no leases"})
		return
	}
	h, err := lease.DecodeHandoff(http.MaxBytesReader(w, r.Body, lease.MaxHandoffBytes+1))
	if err != nil {
		writeLeaseError(w, err)
		return
	}
	httperr.WriteJSON(w, http.StatusOK, map[string]int{"kept": a.cfg.Leases.HandleHandoff(h)})
}

// handleInternalLeaseStatus is GET /internal/v1/leases/{ns}: this node's
// coordinator state of ns (404 when it does not coordinate ns).
func (a *API) handleInternalLeaseStatus(w http.ResponseWriter, r *http.Request) {
	ns, err := pathName(r, "ns")
	if err != nil {
		writeError(w, err)
		return
	}
	if a.cfg.Leases != nil {
		if st, ok := a.cfg.Leases.CoordinatorStatus(ns); ok {
			httperr.WriteJSON(w, http.StatusOK, st)
			return
		}
	}
	writeError(w, &httperr.Error{Status: http.StatusNotFound, Code: api.CodeNotFound, Field: "namespace",
		Message: "namespace: this node holds no lease state for " + ns})
}
