package replication

import (
	"slices"
	"time"
)

// View is one membership view as replication needs it: who is live, where
// to reach them, and every shard's replica set. The node builds one from
// each applied cluster.OwnershipSnapshot (the one ownership view) and
// hands it to Replicator.Apply. A View must not be changed once applied.
type View struct {
	// Version orders views (the snapshot's version; local to this node).
	Version uint64
	// Self is this node's name.
	Self string
	// ShardCount is the cluster's shard count.
	ShardCount uint32
	// Factor is the cluster's replication factor R (≥ 1).
	Factor int
	// Sets[s] is shard s's replica set, primary first (len = min(R, active
	// members); empty when no member is active). Sets may share backing
	// arrays with the snapshot: never modified.
	Sets [][]string
	// Addrs maps every live member (active or leaving) to its API address.
	Addrs map[string]string
	// Leaving is true while this node drains: it is in no set.
	Leaving bool
	// PeerFailedAt is when this node last saw a member fail (declared
	// dead, not a graceful leave) that has not returned since; zero when
	// none has. A leaving node whose sets name no other member waits
	// Config.FailedPeerWait from then before it stops as the last node: a
	// member declared dead by mistake (a stalled process, lost probes on a
	// loaded host) refutes it and takes the hand-off.
	PeerFailedAt time.Time
}

// set returns shard's replica set.
func (v *View) set(shard uint32) []string {
	if v == nil || int(shard) >= len(v.Sets) {
		return nil
	}
	return v.Sets[shard]
}

// inSet reports whether member is in shard's replica set.
func (v *View) inSet(member string, shard uint32) bool {
	return slices.Contains(v.set(shard), member)
}

// primary returns shard's primary, "" without one.
func (v *View) primary(shard uint32) string {
	if s := v.set(shard); len(s) > 0 {
		return s[0]
	}
	return ""
}

// copies is the size of a full replica set in this view: min(R, active
// members), the largest set size.
func (v *View) copies() int {
	n := 0
	for _, s := range v.Sets {
		n = max(n, len(s))
	}
	return n
}

// peers returns the live members other than Self, sorted.
func (v *View) peers() []string {
	out := make([]string, 0, len(v.Addrs))
	for name := range v.Addrs {
		if name != v.Self {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}
