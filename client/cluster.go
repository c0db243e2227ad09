package client

import (
	"context"
	"net/http"
	"strconv"

	"github.com/fairshard/fairshard/api"
)

// Cluster is GET /v1/cluster: the answering node's view of the
// membership, shard ownership, replication and security (package api's
// type, shared with the server).
type Cluster = api.Cluster

// Member is one cluster member as Cluster lists it.
type Member = api.Member

// Security is Cluster's "security": what protects the answering node.
type Security = api.Security

// Replication is a node's replication state (docs/operations.md
// "Replicated shards").
type Replication = api.ReplicationStatus

// Leave is a leaving node's hand-off progress.
type Leave = api.LeaveStatus

// ShardTable is GET /v1/shards: every shard's owner and replica set.
type ShardTable = api.ShardTable

// ShardOwner is one shard, its owner (primary) and its replica set.
type ShardOwner = api.ShardOwner

// ShardReplicas is GET /v1/shards/{shard}: one shard's replica set as the
// answering node asked each replica now.
type ShardReplicas = api.ShardStatus

// ShardReplica is one replica of a shard, as it answered.
type ShardReplica = api.ReplicaStatus

// Cluster returns the answering node's view of the cluster.
func (c *Client) Cluster(ctx context.Context) (*Cluster, error) {
	var out Cluster
	if err := c.do(ctx, call{method: http.MethodGet, path: "/v1/cluster", out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
}

// Shards returns the answering node's shard table.
func (c *Client) Shards(ctx context.Context) (*ShardTable, error) {
	var out ShardTable
	if err := c.do(ctx, call{method: http.MethodGet, path: "/v1/shards", out: &out}); err != nil {
		return nil, err
	}
	return &out, nil
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
