package client

import (
	"context"
	"net/http"
	"strconv"

	"github.com/fairshard/fairshard/api"
)

// Cluster is GET /v1/cluster: the answering node's view of the membership
// and shard ownership.
type Cluster struct {
	// Node is the answering node's name.
	Node string `json:"node"`
	// Accepted reports whether the cluster accepted the answering node
	// (same shard count and protocol, unique name); until then it owns
	// no shards and claims nothing.
	Accepted   bool   `json:"accepted"`
	ShardCount uint32 `json:"shard_count"`
	// OwnershipVersion increases with every ownership change the node
	// applied.
	OwnershipVersion uint64 `json:"ownership_version"`
	// LeasesLearning (exact quota mode): the answering node became the
	// coordinator of some namespaces less than a lease length ago and only
	// confirms what nodes hold for them; new demand waits.
	LeasesLearning bool     `json:"leases_learning"`
	Members        []Member `json:"members"`
	// Replication is the answering node's replication state.
	Replication Replication `json:"replication"`
	Handoff     struct {
		// ShardsPending counts shards this node still holds rows of for
		// another owner (rows to hand off).
		ShardsPending int `json:"shards_pending"`
	} `json:"handoff"`
	// Security says what protects the answering node.
	Security Security `json:"security"`
}

// Security is /v1/cluster's "security": what protects the answering node.
type Security struct {
	// Insecure: started with --insecure.
	Insecure bool `json:"insecure"`
	// NodeAuth: node-to-node calls are signed both ways (--cluster-secret).
	NodeAuth bool `json:"node_auth"`
	// InternalRoutes says who its node-to-node routes answer:
	// "cluster_secret" (members holding it), "this_node_only" (an API
	// token without a cluster secret: nobody else) or "open" (no
	// credentials at all).
	InternalRoutes string `json:"internal_routes"`
	// GossipEncrypted: gossip is encrypted (--gossip-key).
	GossipEncrypted bool `json:"gossip_encrypted"`
	// Exposed lists its listen and advertised addresses beyond loopback,
	// the profiling listener's (--pprof-addr) included.
	Exposed []string `json:"exposed"`
}

// Replication is a node's replication state (docs/operations.md
// "Replicated shards").
type Replication struct {
	// Factor is the cluster's replication factor R; Copies what every
	// replica set gets now, min(R, active members); WriteCopies the
	// write-copies minimum this node applies.
	Factor      int `json:"replication_factor"`
	Copies      int `json:"copies"`
	WriteCopies int `json:"write_copies"`
	// UnderReplicated: fewer members than R, or a shard this node is
	// primary of lacks a synced copy (UnderReplicatedShards of them,
	// holding UnderReplicatedRows rows here, as of the last poll).
	UnderReplicated       bool  `json:"under_replicated"`
	UnderReplicatedShards int   `json:"under_replicated_shards"`
	UnderReplicatedRows   int64 `json:"under_replicated_rows"`
	// ReplicaShards counts the shards this node is a replica of;
	// SyncingShards those it has not synced yet.
	ReplicaShards int `json:"replica_shards"`
	SyncingShards int `json:"syncing_shards"`
	// PendingChanges counts (row, backup) state changes not yet shipped.
	PendingChanges int `json:"pending_changes"`
	// HandoverShards counts shards this node became primary of and does
	// not claim from yet: another live member still delivers rows of them.
	HandoverShards int `json:"handover_shards"`
	// Leave is a leaving node's hand-off progress; nil unless it is
	// leaving.
	Leave *Leave `json:"leave,omitempty"`
}

// Leave is a leaving node's hand-off progress (package api's type).
type Leave = api.LeaveStatus

// Member is one cluster member.
type Member struct {
	Name string `json:"name"`
	// APIAddr is the host:port peers and clients use for its API.
	APIAddr string `json:"api_addr"`
	// GossipAddr is the host:port the member advertises for gossip.
	GossipAddr string `json:"gossip_addr"`
	// GossipKeys are the fingerprints of the gossip keys the member holds
	// (empty without encryption), for checking a key rotation.
	GossipKeys []string `json:"gossip_keys"`
	// State is "active" or "leaving" (draining: it owns no shards).
	State string `json:"state"`
	// Reachable reports whether its API answers the answering node's
	// health checks (false: rows for its shards are held elsewhere).
	Reachable          bool    `json:"reachable"`
	OwnedShards        int     `json:"owned_shards"`
	OwnedShardFraction float64 `json:"owned_shard_fraction"`
}

// Cluster returns the answering node's view of the cluster.
func (c *Client) Cluster(ctx context.Context) (*Cluster, error) {
	var out Cluster
	if err := c.do(ctx, call{method: http.MethodGet, path: "/v1/cluster", out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// ShardTable is GET /v1/shards: every shard's owner.
type ShardTable struct {
	ShardCount       uint32 `json:"shard_count"`
	OwnershipVersion uint64 `json:"ownership_version"`
	// Shards is indexed by shard number.
	Shards []ShardOwner `json:"shards"`
}

// ShardOwner is one shard and the member owning it.
type ShardOwner struct {
	Shard uint32 `json:"shard"`
	Owner string `json:"owner"`
}

// Shards returns the answering node's shard table.
func (c *Client) Shards(ctx context.Context) (*ShardTable, error) {
	var out ShardTable
	if err := c.do(ctx, call{method: http.MethodGet, path: "/v1/shards", out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// ShardReplicas is GET /v1/shards/{shard}: one shard's replica set as the
// answering node asked each replica now.
type ShardReplicas struct {
	Shard uint32 `json:"shard"`
	// InSync: every replica answered, is synced and has the same digest.
	InSync bool `json:"in_sync"`
	// HeldHere counts the rows of the shard the answering node holds (a
	// copy it is handing over when it is not a replica).
	HeldHere int64 `json:"held_here"`
	// Replicas lists the primary first, then the backups in failover order.
	Replicas []ShardReplica `json:"replicas"`
}

// ShardReplica is one replica of a shard, as it answered.
type ShardReplica struct {
	Node string `json:"node"`
	// Role is "primary" or "backup".
	Role string `json:"role"`
	// Reachable: the replica answered (the fields below are its answer).
	Reachable bool `json:"reachable"`
	// Synced: it counts as a synced copy.
	Synced bool `json:"synced"`
	// Rows is how many rows of the shard it holds; Digest the
	// order-independent 64-bit hash of their keys and versions: replicas
	// that agree hold the same rows in the same states.
	Rows   int64  `json:"rows"`
	Digest uint64 `json:"digest"`
}

// Shard returns one shard's replicas and their sync state; shard must be
// below the cluster's shard count (else an *Error, 400).
func (c *Client) Shard(ctx context.Context, shard uint32) (*ShardReplicas, error) {
	var out ShardReplicas
	if err := c.do(ctx, call{method: http.MethodGet, path: "/v1/shards/" + strconv.FormatUint(uint64(shard), 10), out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}
