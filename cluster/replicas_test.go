package cluster_test

import (
	"slices"
	"testing"

	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/cluster/clustertest"
	"github.com/fairshard/fairshard/shards"
)

// The snapshots carry shards.ReplicaSets' lists for the replication
// factor, and SetReplicationFactor recomputes them on every node.
func TestSnapshotsCarryReplicaSetsOfTheFactor(t *testing.T) {
	h := clustertest.Start(t, 3)
	snap := h.WaitConverged(convergeTimeout)
	if snap.Factor != 1 || snap.Copies != 1 || snap.UnderReplicated() {
		t.Fatalf("default: factor %d, copies %d", snap.Factor, snap.Copies)
	}
	if rs := snap.ReplicaSet(7); len(rs.Replicas) != 1 || rs.Replicas[0] != snap.Table.Owner(7) {
		t.Fatalf("R = 1: set of shard 7 = %v", rs.Replicas)
	}
	for _, nd := range h.Running() {
		if err := nd.Cluster.SetReplicationFactor(2); err != nil {
			t.Fatal(err)
		}
	}
	want := shards.ReplicaSets(names(h.Nodes()), cluster.DefaultShardCount, 2)
	for _, nd := range h.Running() {
		s := nd.Cluster.Snapshot()
		if s.Factor != 2 || s.Copies != 2 || s.UnderReplicated() {
			t.Fatalf("%s: factor %d copies %d", nd.Name, s.Factor, s.Copies)
		}
		sets := s.ReplicaSets()
		for sh := range cluster.DefaultShardCount {
			if !slices.Equal(sets[sh], want.Replicas(sh)) || !slices.Equal(s.ReplicaSet(sh).Replicas, sets[sh]) {
				t.Fatalf("%s: shard %d set %v, want %v", nd.Name, sh, sets[sh], want.Replicas(sh))
			}
			if sets[sh][0] != s.Table.Owner(sh) {
				t.Fatalf("%s: shard %d primary %s, owner %s", nd.Name, sh, sets[sh][0], s.Table.Owner(sh))
			}
		}
	}
	if err := h.Node(0).Cluster.SetReplicationFactor(6); err == nil {
		t.Fatal("SetReplicationFactor(6) accepted")
	}
	// R above the member count is capped, and reported.
	if err := h.Node(0).Cluster.SetReplicationFactor(5); err != nil {
		t.Fatal(err)
	}
	if s := h.Node(0).Cluster.Snapshot(); s.Copies != 3 || !s.UnderReplicated() {
		t.Fatalf("R = 5 over 3 members: copies %d, under-replicated %v", s.Copies, s.UnderReplicated())
	}
}
