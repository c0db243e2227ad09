package api

import "time"

// The answers of the read and bulk calls, as the server writes them and
// the Go client reads them: GET /v1/cluster, /v1/shards and
// /v1/shards/{shard}, the namespace totals, targets read back, and the
// cluster-wide redrive and purge counts.

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
	Replication ReplicationStatus `json:"replication"`
	Handoff     Handoff           `json:"handoff"`
	// Security says what protects the answering node.
	Security Security `json:"security"`
}

// Handoff is /v1/cluster's "handoff": ShardsPending counts the shards
// whose rows the answering node holds though it is not one of their
// replicas (a rebalance, a drain): rows it hands to their sets, then
// deletes.
type Handoff struct {
	ShardsPending int `json:"shards_pending"`
}

// Member is one cluster member as /v1/cluster lists it.
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
	Reachable bool `json:"reachable"`
	// OwnedShards is how many shards it owns (primary); OwnedShardFraction
	// that over the shard count, in [0,1].
	OwnedShards        int     `json:"owned_shards"`
	OwnedShardFraction float64 `json:"owned_shard_fraction"`
}

// Security is /v1/cluster's "security": what protects the answering node.
type Security struct {
	// Insecure: node-to-node calls are unauthenticated or gossip is in
	// clear (!NodeAuth || !GossipEncrypted): the same fact as the
	// fairshard_insecure metric and the INSECURE warning.
	Insecure bool `json:"insecure"`
	// InsecureFlag: started with --insecure, which allows that beyond
	// loopback.
	InsecureFlag bool `json:"insecure_flag"`
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

// ReplicationStatus is a node's replication state, /v1/cluster's
// "replication" (docs/operations.md "Replicated shards").
type ReplicationStatus struct {
	// Factor is the cluster's replication factor R; Copies what every
	// replica set gets now, min(R, active members).
	Factor int `json:"replication_factor"`
	Copies int `json:"copies"`
	// WriteCopies is the write-copies minimum the node applies.
	WriteCopies int `json:"write_copies"`
	// UnderReplicated: Copies < Factor (too few members), or some shard
	// the node is primary of lacks a synced copy.
	UnderReplicated bool `json:"under_replicated"`
	// UnderReplicatedShards and UnderReplicatedRows count the node's
	// primary shards with fewer than R synced copies, and their rows on
	// it (as of the last poll, PolledAt).
	UnderReplicatedShards int       `json:"under_replicated_shards"`
	UnderReplicatedRows   int64     `json:"under_replicated_rows"`
	PolledAt              time.Time `json:"polled_at,omitzero"`
	// ReplicaShards counts the shards the node is a replica of;
	// SyncingShards those it has not synced yet.
	ReplicaShards int `json:"replica_shards"`
	SyncingShards int `json:"syncing_shards"`
	// PendingChanges counts (row, backup) state changes not yet shipped.
	PendingChanges int `json:"pending_changes"`
	// HandoverShards counts the shards the node became primary of and
	// does not claim from yet: another live member still delivers rows of
	// them or ships their settles (bounded by the handover timeout).
	HandoverShards int `json:"handover_shards"`
	// Leave is the hand-off progress of a leaving node (absent otherwise).
	Leave *LeaveStatus `json:"leave,omitempty"`
}

// ShardTable is GET /v1/shards: every shard's owner and replicas.
type ShardTable struct {
	ShardCount       uint32 `json:"shard_count"`
	OwnershipVersion uint64 `json:"ownership_version"`
	// ReplicationFactor is the R the replica sets were computed with.
	ReplicationFactor int `json:"replication_factor"`
	// Shards is indexed by shard number.
	Shards []ShardOwner `json:"shards"`
}

// ShardOwner is one shard, the member owning it (its primary) and its
// replica set, primary first (empty while no member is active).
type ShardOwner struct {
	Shard    uint32   `json:"shard"`
	Owner    string   `json:"owner"`
	Replicas []string `json:"replicas"`
}

// ShardStatus is GET /v1/shards/{shard}: one shard's replica set as the
// answering node asked each replica now.
type ShardStatus struct {
	Shard uint32 `json:"shard"`
	// Replicas lists the primary first, then the backups in failover
	// order.
	Replicas []ReplicaStatus `json:"replicas"`
	// InSync: every replica answered, is synced and has the same digest.
	InSync bool `json:"in_sync"`
	// HeldHere counts the rows of the shard the answering node holds (a
	// copy it is handing over when it is not a replica).
	HeldHere int64 `json:"held_here"`
}

// ReplicaStatus is one replica of a shard, as it answered.
type ReplicaStatus struct {
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

// NamespaceTotals are a namespace's counts summed over the members that
// answered, with each member's (the "cluster" of a namespace view).
type NamespaceTotals struct {
	Pending     int `json:"pending"`
	Claimed     int `json:"claimed"`
	DeadLetters int `json:"dead_letters"`
	// DeliveredTotal counts rows delivered since each node started; a
	// rate is its change over time.
	DeliveredTotal uint64               `json:"delivered_total"`
	Nodes          []NodeNamespaceStats `json:"nodes"`
	// UnreachableNodes did not answer: their counts are missing.
	UnreachableNodes []string `json:"unreachable_nodes"`
}

// NodeNamespaceStats is one member's counts of a namespace (rows).
type NodeNamespaceStats struct {
	Node        string `json:"node"`
	Pending     int    `json:"pending"`
	Claimed     int    `json:"claimed"`
	DeadLetters int    `json:"dead_letters"`
	// DeliveredTotal is fairshard_rows_delivered_total of the namespace
	// on the node since it started.
	DeliveredTotal uint64 `json:"delivered_total"`
	// DeliveryP99Seconds estimates the 99th percentile of one delivery
	// attempt on the node since it started (seconds: the upper bound of
	// its fairshard_delivery_duration_seconds bucket), 0 with no attempt.
	DeliveryP99Seconds float64 `json:"delivery_p99_seconds"`
}

// TargetView is a route's target as read back: secrets in the URL (a
// password, query values named like token, key, secret, sig, password,
// auth, credential, code) read "REDACTED".
type TargetView struct {
	Namespace string `json:"namespace"`
	TaskQueue string `json:"task_queue"`
	URL       string `json:"url"`
	// TimeoutMS is the route's delivery timeout (ms; absent: the node's).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// SigningSecretFingerprints and HeaderNames are the route's signing
	// secrets by fingerprint and static headers by name (never their
	// values); empty for the default target or a route without them.
	SigningSecretFingerprints []string `json:"signing_secret_fingerprints,omitempty"`
	HeaderNames               []string `json:"header_names,omitempty"`
	// Source is "route" (the route's own) or "default" (--default-target).
	Source string `json:"source"`
}

// TargetList is GET /v1/targets: every route's own target and the nodes'
// default (redacted like a TargetView's URL; "" when none).
type TargetList struct {
	Targets       []TargetView `json:"targets"`
	DefaultTarget string       `json:"default_target"`
}

// RedriveResult is a redrive's answer: Redriven counts the dead letters
// moved back to pending, cluster-wide; UnreachableNodes did not answer, so
// their dead letters were not redriven (call again once they are back).
type RedriveResult struct {
	Redriven         int      `json:"redriven"`
	UnreachableNodes []string `json:"unreachable_nodes"`
}

// PurgeResult is a purge's answer: Purged counts the dead letters purged
// cluster-wide; UnreachableNodes did not answer, so their dead letters
// were not purged.
type PurgeResult struct {
	Purged           int      `json:"purged"`
	UnreachableNodes []string `json:"unreachable_nodes"`
}
