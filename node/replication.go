package node

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/kv"
	"github.com/fairshard/fairshard/replication"
)

// KeyReplicationFactor is the gossiped config key holding the cluster's
// replication factor R (a decimal 1–5). --replication-factor seeds it when
// the cluster has none; PUT /v1/cluster changes it; every node applies the
// value it holds (cluster.SetReplicationFactor), so every node computes
// the same replica sets once the write has spread.
const KeyReplicationFactor = "cluster/replication_factor"

// viewOf is the replication view of an applied ownership snapshot.
func viewOf(s *cluster.OwnershipSnapshot) *replication.View {
	addrs := make(map[string]string, len(s.Members))
	leaving := false
	for _, m := range s.Members {
		if m.APIAddr != "" {
			addrs[m.Name] = m.APIAddr
		}
		if m.Name == s.Self && m.State == cluster.MemberLeaving {
			leaving = true
		}
	}
	return &replication.View{Version: s.Version, Self: s.Self, ShardCount: s.ShardCount, Factor: s.Factor,
		Sets: s.ReplicaSets(), Addrs: addrs, Leaving: leaving, PeerFailedAt: s.PeerFailedAt}
}

// setClaimScope is the replicator's Config.Scope: the shards this node is
// primary of and holds a synced copy of become the store's claim scope.
func (n *Node) setClaimScope(owned []uint32) {
	n.store.SetOwnedShards(owned)
	if n.disp != nil {
		n.disp.Wake()
	}
}

// parseFactor reads a replication factor value of the gossiped config.
func parseFactor(v []byte) (int, error) {
	r, err := strconv.Atoi(strings.TrimSpace(string(v)))
	if err != nil || r < 1 || r > replication.MaxFactor {
		return 0, fmt.Errorf("replication factor %q is not an integer from 1 to %d", v, replication.MaxFactor)
	}
	return r, nil
}

// applyReplicationFactor applies the cluster's replication factor from the
// gossiped config, if it holds one; it reports whether it did.
func (n *Node) applyReplicationFactor() bool {
	e, ok := n.cl.KV().Get(KeyReplicationFactor)
	if !ok || e.Deleted {
		return false
	}
	r, err := parseFactor(e.Value)
	if err != nil {
		n.log.Error("ignoring the gossiped replication factor", "err", err)
		return false
	}
	if r != n.cfg.ReplicationFactor {
		n.log.Warn("--replication-factor differs from the cluster's; following the cluster (PUT /v1/cluster changes it)",
			"flag", n.cfg.ReplicationFactor, "cluster", r)
	}
	if err := n.cl.SetReplicationFactor(r); err != nil {
		n.log.Error("apply replication factor", "err", err)
		return false
	}
	return true
}

// seedReplicationFactor, once the node has joined (it holds the cluster's
// config), applies the cluster's replication factor, or writes this node's
// --replication-factor as the cluster's when there is none yet (a new
// cluster). Two first nodes writing at once converge on one value (last
// writer wins).
func (n *Node) seedReplicationFactor(ctx context.Context) error {
	if n.applyReplicationFactor() {
		return nil
	}
	if err := n.setReplicationFactor(ctx, n.cfg.ReplicationFactor); err != nil {
		return fmt.Errorf("seed the cluster's replication factor: %w", err)
	}
	return nil
}

// setReplicationFactor writes the cluster's replication factor to the
// gossiped config and applies it here at once (peers apply it when the
// write reaches them).
func (n *Node) setReplicationFactor(ctx context.Context, r int) error {
	if r < 1 || r > replication.MaxFactor {
		return fmt.Errorf("replication factor %d is not between 1 and %d", r, replication.MaxFactor)
	}
	if _, err := n.cl.KV().Put(ctx, KeyReplicationFactor, []byte(strconv.Itoa(r))); err != nil {
		return err
	}
	n.applyReplicationFactor()
	return nil
}

// replicationFactorChanged reports whether a batch of config changes
// touches the replication factor.
func replicationFactorChanged(changes []kv.Entry) bool {
	for _, e := range changes {
		if e.Key == KeyReplicationFactor {
			return true
		}
	}
	return false
}
