package cluster

import (
	"fmt"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// delegate is the memberlist.Delegate (node meta, and the kv store's
// gossip and push/pull state), AliveDelegate and MergeDelegate (peer admission) and
// ConflictDelegate of a Cluster. memberlist calls these from its own
// goroutines, some while holding its node lock (PITFALLS, memberlist#237):
// none of them calls back into memberlist or blocks.
type delegate struct{ c *Cluster }

var (
	_ memberlist.Delegate         = (*delegate)(nil)
	_ memberlist.AliveDelegate    = (*delegate)(nil)
	_ memberlist.MergeDelegate    = (*delegate)(nil)
	_ memberlist.ConflictDelegate = (*delegate)(nil)
)

// NodeMeta returns this node's encoded meta. Its size was checked against
// memberlist.MetaMaxSize in New and a state change does not change it.
func (d *delegate) NodeMeta(limit int) []byte {
	m := *d.c.meta.Load()
	if len(m) > limit { // unreachable: checked in New; memberlist would panic
		return nil
	}
	return m
}

// NotifyMsg receives a gossiped config entry, or a member query or answer
// of the acceptance check (accept.go). buf is reused by memberlist after
// the call; the decoders copy what they keep. The store counts and logs
// what it cannot decode.
func (d *delegate) NotifyMsg(buf []byte) {
	if len(buf) > 0 && (buf[0] == msgMemberQuery || buf[0] == msgMemberAnswer) {
		d.c.handleMemberMsg(buf)
		return
	}
	_ = d.c.kv.MergeMessage(buf)
}

// GetBroadcasts hands queued config entries to memberlist's gossip.
func (d *delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.c.broadcasts.GetBroadcasts(overhead, limit)
}

// LocalState is the config half of a TCP push/pull: the kv store's full
// state, tombstones included, bounded by its caps.
func (d *delegate) LocalState(join bool) []byte { return d.c.kv.LocalState() }

// MergeRemoteState merges a peer's full config state.
func (d *delegate) MergeRemoteState(buf []byte, join bool) { _ = d.c.kv.MergeRemoteState(buf) }

// NotifyAlive admits or refuses a node announced alive (by gossip or a
// push/pull). A non-nil error keeps the node out of memberlist's view.
func (d *delegate) NotifyAlive(peer *memberlist.Node) error {
	return d.c.admit(peer)
}

// NotifyMerge admits or refuses a whole cluster on a join: it refuses the
// merge if any live node of the other side is incompatible. memberlist
// calls it only for joins; regular push/pull goes through NotifyAlive.
func (d *delegate) NotifyMerge(peers []*memberlist.Node) error {
	for _, p := range peers {
		if p.State != memberlist.StateAlive && p.State != memberlist.StateSuspect {
			continue
		}
		if err := d.c.admit(p); err != nil {
			return err
		}
	}
	return nil
}

// NotifyConflict reports two nodes claiming one name from different
// addresses; memberlist keeps the first (see Config.DeadNodeReclaimTime).
// When the name is this node's and this node is not accepted yet, the
// other address is where the cluster holds it: the accept loop pings it
// (a live duplicate refuses this node; a dead earlier run is waited out).
func (d *delegate) NotifyConflict(existing, other *memberlist.Node) {
	c := d.c
	if existing.Name == c.name && !c.acceptance.accepted.Load() {
		c.noteConflict(other.Address())
		return
	}
	c.metrics.refused.WithLabelValues("name_conflict").Inc()
	c.log.Error("two nodes claim one node name; keeping the known address",
		"node", existing.Name, "known_addr", existing.Address(), "other_addr", other.Address())
}

// admit checks a peer's meta against this node: readable, same protocol
// version, same shard count (DESIGN.md "Membership"). It runs under
// memberlist's node lock: decode, compare, count, log; nothing more.
func (c *Cluster) admit(n *memberlist.Node) error {
	m, err := decodeMeta(n.Meta)
	switch {
	case err != nil:
		return c.refuse(n, "bad_meta", fmt.Errorf("%w: node %q at %s: %v", ErrBadMeta, n.Name, n.Address(), err))
	case m.Name != n.Name:
		return c.refuse(n, "bad_meta", fmt.Errorf("%w: node %q at %s carries the name %q in its meta", ErrBadMeta, n.Name, n.Address(), m.Name))
	case m.Protocol != c.protocol:
		return c.refuse(n, "protocol_version", fmt.Errorf("%w: node %q at %s speaks protocol %d, this node %d",
			ErrProtocolMismatch, n.Name, n.Address(), m.Protocol, c.protocol))
	case m.ShardCount != c.cfg.ShardCount:
		return c.refuse(n, "shard_count", fmt.Errorf("%w: node %q at %s has shard_count %d, this node %d",
			ErrShardCountMismatch, n.Name, n.Address(), m.ShardCount, c.cfg.ShardCount))
	}
	return nil
}

// refusalLogEvery rate-limits the log line for a peer that keeps being
// refused (gossip repeats its alive messages; a misconfigured node keeps
// re-joining). The metric counts every refusal.
const refusalLogEvery = time.Minute

// refusal records the latest refusal, so Join can report why it failed.
type refusal struct {
	seq uint64
	err error
}

func (c *Cluster) refuse(n *memberlist.Node, reason string, err error) error {
	c.metrics.refused.WithLabelValues(reason).Inc()
	c.admission.mu.Lock()
	c.admission.seq++
	c.admission.last = refusal{seq: c.admission.seq, err: err}
	key := n.Name + "\x00" + reason
	now := time.Now()
	last, seen := c.admission.logged[key]
	logIt := !seen || now.Sub(last) >= refusalLogEvery
	if logIt {
		if len(c.admission.logged) >= 1024 { // bound the map against name floods
			clear(c.admission.logged)
		}
		c.admission.logged[key] = now
	}
	c.admission.mu.Unlock()
	if logIt {
		c.log.Warn("refusing peer", "peer", n.Name, "peer_addr", n.Address(), "reason", reason, "error", err)
	}
	return err
}

// admission records the peers this node refused (delegate.go): logged
// rate-limits the refusal log line per peer; seq counts the refusals and
// last is the latest. mu guards them.
type admission struct {
	mu     sync.Mutex
	logged map[string]time.Time
	seq    uint64
	last   refusal
}
