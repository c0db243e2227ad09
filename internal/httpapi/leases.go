package httpapi

import (
	"context"
	"errors"
	"time"

	"github.com/fairshard/fairshard/internal/peer"
	"github.com/fairshard/fairshard/lease"
)

// Leases is the node's lease service as the API serves and shows it
// (exact quota mode).
type Leases interface {
	// peer.Leases answers the coordinator's node-to-node routes; its
	// CoordinatorStatus also feeds this node's namespace view.
	peer.Leases
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
