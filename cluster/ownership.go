package cluster

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/fairshard/fairshard/shards"
)

// Member is one live member of the cluster as this node sees it.
type Member struct {
	// Name is the member's node name.
	Name string
	// APIAddr is its HTTP API address (host:port), from its node meta; ""
	// when it serves no API.
	APIAddr string
	// GossipAddr is its memberlist address (ip:port).
	GossipAddr string
	// State is its declared state: active (owns shards) or leaving.
	State MemberState
	// GossipKeys are the fingerprints (KeyFingerprint) of its gossip keys,
	// comma-separated, primary first, as its node meta announces them;
	// empty without encryption. A rotation step has reached every member
	// when each lists the step's keys (keyring.go). A string keeps Member
	// comparable.
	GossipKeys string
}

// OwnershipSnapshot is one immutable view of membership and shard
// ownership, published by a Cluster after every membership change. It is
// safe for concurrent use and must not be modified; hold the pointer, not a
// copy of its parts.
//
// It is the one ownership view every consumer reads: the node applies it
// (claim scope) and then hands the same applied snapshot to the planner's
// ceilings, append routing and handoff. Per shard it carries a replica set
// (ReplicaSet): the ordered replica list [primary, backups…] and an epoch,
// from the pure replica-set function shards.ReplicaSets(active members,
// shard count, Factor), computed in one place: replicaLists in Recompute.
//
// Who owns shards: members that memberlist holds alive or suspect (it
// reports only a death or a leave) and whose meta says active; this node
// only once the cluster has accepted it (Accepted). A suspect member keeps its shards until it is
// declared dead, so a slow probe does not move shards back and forth; a
// leaving member owns none (it is draining, DESIGN.md "handoff"). With no
// active member (a lone node that is leaving) the table is empty and
// Table.Owner returns "".
type OwnershipSnapshot struct {
	// Version numbers this node's snapshots: 1 for the first, +1 for each
	// change. It is local to this node: compare Tables, not Versions,
	// across nodes.
	Version uint64
	// Self is this node's name.
	Self string
	// ShardCount is the cluster's shard count.
	ShardCount uint32
	// Members lists every live member (active and leaving), sorted by name.
	Members []Member
	// Table maps every shard to its owner among the active members.
	Table *shards.Table
	// Owned lists the shards this node owns, ascending; empty while it is
	// leaving or not yet a member.
	Owned []uint32
	// Accepted tells whether the cluster had accepted this node when the
	// snapshot was taken (Cluster.Accepted). An unaccepted node lists
	// itself in Members but owns nothing: Table is computed without it,
	// as its peers compute theirs, and Owned is empty.
	Accepted bool
	// Fraction is this node's OwnedShardFraction, len(Owned)/ShardCount
	// with NewOwnedShardFraction's clamp: a node owning nothing reports
	// 1/ShardCount (it has no rows to claim anyway).
	Fraction shards.OwnedShardFraction

	// PeerFailedAt is when the most recent peer that failed (memberlist
	// declared it dead; a graceful leave does not count) and has not
	// returned since failed; zero when none has. A leaving node that has
	// no one else to hand off to waits a while from then for it to return
	// (replication.View.PeerFailedAt).
	PeerFailedAt time.Time

	// Factor is the replication factor R the replica sets were computed
	// for; Copies is what every set holds, min(R, active members) (0 with
	// no active member).
	Factor, Copies int

	// replicas[s] is shard s's ordered replica list; nil while every list
	// is the primary alone (Table.Owner, R = 1).
	replicas [][]string
	// epochs[s] is the Version of the snapshot in which shard s's replica
	// list last changed on this node.
	epochs []uint64
}

// ReplicaSet is one shard's replicas as an OwnershipSnapshot sees them.
type ReplicaSet struct {
	// Shard is the shard number.
	Shard uint32
	// Replicas lists the members holding the shard, primary first, then
	// the backups in failover order: min(R, active members) of them; empty
	// when no active member owns the shard (a lone node that is leaving).
	Replicas []string
	// Epoch is the Version of this node's snapshot in which Replicas last
	// changed: it grows whenever the list changes and stays put otherwise.
	// Like Version it is local to this node; compare lists, not epochs,
	// across nodes.
	Epoch uint64
}

// Primary returns the shard's primary ("" when it has none).
func (r ReplicaSet) Primary() string {
	if len(r.Replicas) == 0 {
		return ""
	}
	return r.Replicas[0]
}

// ReplicaSet returns shard's replica set; the zero ReplicaSet (with Shard
// set) for a shard ≥ ShardCount.
func (s *OwnershipSnapshot) ReplicaSet(shard uint32) ReplicaSet {
	rs := ReplicaSet{Shard: shard}
	if shard >= s.ShardCount {
		return rs
	}
	if s.epochs != nil {
		rs.Epoch = s.epochs[shard]
	}
	if s.replicas != nil {
		rs.Replicas = s.replicas[shard]
	} else if o := s.Table.Owner(shard); o != "" {
		rs.Replicas = []string{o}
	}
	return rs
}

// OwningNothing returns a copy of s in which this node owns no shard
// (Owned empty, Fraction clamped to 1/ShardCount), everything else alike:
// the view a node applies while it may not claim yet (before it has
// joined the cluster). Rows it routes to itself by the table are stored
// and kept, not claimed.
func (s *OwnershipSnapshot) OwningNothing() *OwnershipSnapshot {
	cp := *s
	cp.Owned = []uint32{}
	cp.Fraction = shards.NewOwnedShardFraction(0, s.ShardCount)
	return &cp
}

// Owns reports whether this node owns shard.
func (s *OwnershipSnapshot) Owns(shard uint32) bool {
	_, ok := slices.BinarySearch(s.Owned, shard)
	return ok
}

// Owner returns the member owning shard; ok is false when no member owns it
// (empty table, or shard ≥ ShardCount).
func (s *OwnershipSnapshot) Owner(shard uint32) (Member, bool) {
	name := s.Table.Owner(shard)
	if name == "" {
		return Member{}, false
	}
	return s.Member(name)
}

// Member returns the live member called name.
func (s *OwnershipSnapshot) Member(name string) (Member, bool) {
	i, ok := slices.BinarySearchFunc(s.Members, name, func(m Member, n string) int { return strings.Compare(m.Name, n) })
	if !ok {
		return Member{}, false
	}
	return s.Members[i], true
}

// Snapshot returns the current ownership snapshot; never nil after New.
func (c *Cluster) Snapshot() *OwnershipSnapshot { return c.snap.Load() }

// Recompute reads memberlist's view now, recomputes ownership and publishes
// a new snapshot if members or their states changed; it returns the
// current snapshot. Membership events call it through a debounced channel;
// tests and SetLeaving call it directly to avoid waiting on that goroutine
// (STYLE §6 "wait on events"). Safe for concurrent use; never call it from a
// memberlist callback.
func (c *Cluster) Recompute() *OwnershipSnapshot {
	c.recomputeMu.Lock()
	defer c.recomputeMu.Unlock()

	nodes := c.livePeers()
	accepted := c.acceptance.accepted.Load()
	members := make([]Member, 0, len(nodes))
	active := make([]string, 0, len(nodes))
	for _, n := range nodes {
		m, err := decodeMeta(n.meta)
		if err != nil || m.ShardCount != c.cfg.ShardCount || m.Protocol != c.protocol {
			continue // never admitted; defensive
		}
		members = append(members, Member{Name: n.name, APIAddr: m.APIAddr, GossipAddr: n.addr, State: m.State, GossipKeys: strings.Join(m.GossipKeys, ",")})
		if m.State == MemberActive && (accepted || n.name != c.name) {
			active = append(active, n.name) // not this node until it is accepted
		}
	}
	slices.SortFunc(members, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	c.numMembers.Store(int64(len(members)))
	names := make([]string, len(members))
	for i, m := range members {
		names[i] = m.Name
	}
	c.kv.SetMembers(names) // who must see a config tombstone before it is collected

	factor := max(int(c.factor.Load()), 1)
	failedAt := c.lastFailure()
	prev := c.snap.Load()
	if prev != nil && prev.Accepted == accepted && slices.Equal(prev.Members, members) && prev.Factor == factor && prev.PeerFailedAt.Equal(failedAt) {
		return prev // same members, states, acceptance and factor: same tables
	}
	table := shards.Assign(active, c.cfg.ShardCount)
	owned := table.Owned(c.name)
	if owned == nil {
		owned = []uint32{}
	}
	snap := &OwnershipSnapshot{
		Version:      1,
		Self:         c.name,
		ShardCount:   c.cfg.ShardCount,
		Members:      members,
		Table:        table,
		Accepted:     accepted,
		Owned:        owned,
		Fraction:     shards.NewOwnedShardFraction(uint32(len(owned)), c.cfg.ShardCount),
		PeerFailedAt: failedAt,
	}
	moved := 0
	if prev != nil {
		snap.Version = prev.Version + 1
		moved = len(prev.Table.Diff(table))
	}
	snap.Factor = factor
	snap.replicas, snap.Copies = replicaLists(active, c.cfg.ShardCount, factor)
	snap.epochs = epochsOf(prev, snap)
	c.snap.Store(snap)

	c.metrics.ownedShards.Set(float64(len(owned)))
	c.metrics.ownedFraction.Set(float64(len(owned)) / float64(c.cfg.ShardCount))
	if moved > 0 {
		c.metrics.ownershipChanges.Inc()
		c.metrics.shardsMoved.Add(float64(moved))
	}
	c.log.Info("ownership snapshot",
		"version", snap.Version, "members", len(members), "active_members", len(active),
		"owned_shards", len(owned), "shards_moved", moved)
	c.publish(snap)
	return snap
}

// subscriber is one Subscribe channel: 1-buffered, latest value wins.
type subscriber struct {
	name string
	ch   chan *OwnershipSnapshot
}

// Subscribe returns a channel that receives the current snapshot at once
// and then every new one, and a func that unsubscribes and closes the
// channel (idempotent). Latest-value semantics: the channel holds at most
// one snapshot, a newer one replaces an unread older one, and the publisher
// never blocks. name labels the subscriber (e.g. "dispatcher"). Shutdown
// closes every subscription channel.
func (c *Cluster) Subscribe(name string) (<-chan *OwnershipSnapshot, func()) {
	s := &subscriber{name: name, ch: make(chan *OwnershipSnapshot, 1)}
	c.subs.mu.Lock()
	if c.subs.set == nil { // shut down
		c.subs.mu.Unlock()
		close(s.ch)
		return s.ch, func() {}
	}
	c.subs.set[s] = struct{}{}
	s.ch <- c.snap.Load()
	c.subs.mu.Unlock()
	return s.ch, func() {
		c.subs.mu.Lock()
		defer c.subs.mu.Unlock()
		if _, ok := c.subs.set[s]; ok {
			delete(c.subs.set, s)
			close(s.ch)
		}
	}
}

// publish offers snap to every subscriber without blocking: if a
// subscriber has not read the previous snapshot, it is replaced.
func (c *Cluster) publish(snap *OwnershipSnapshot) {
	c.subs.mu.Lock()
	defer c.subs.mu.Unlock()
	for s := range c.subs.set {
		select {
		case s.ch <- snap:
			continue
		default:
		}
		select { // drop the stale one; only this goroutine sends
		case <-s.ch:
		default:
		}
		s.ch <- snap
	}
}

// replicaLists returns every shard's ordered replica list from the pure
// replica-set function shards.ReplicaSets(active, shardCount, factor),
// whose primaries are Assign's owners (the snapshot's Table), and the
// copies each set holds; the lists are nil for factor 1 (each is the
// primary alone: ReplicaSet reads Table).
func replicaLists(active []string, shardCount uint32, factor int) ([][]string, int) {
	if factor <= 1 {
		return nil, min(len(active), 1)
	}
	t := shards.ReplicaSets(active, shardCount, factor)
	out := make([][]string, shardCount)
	for s := range shardCount {
		out[s] = t.Replicas(s)
	}
	return out, t.Copies()
}

// SetReplicationFactor sets the replication factor R (1–MaxReplicationFactor)
// the replica sets are computed for, and recomputes the snapshot when it
// changed. The node calls it with the cluster-wide value of the gossiped
// config. Errors: ErrInvalidConfig for a factor out of range.
func (c *Cluster) SetReplicationFactor(factor int) error {
	if factor < 1 || factor > MaxReplicationFactor {
		return fmt.Errorf("%w: replication factor %d is outside 1..%d", ErrInvalidConfig, factor, MaxReplicationFactor)
	}
	if c.factor.Swap(int64(factor)) != int64(factor) {
		c.Recompute()
	}
	return nil
}

// ReplicaSets returns every shard's replica list (the caller's to read,
// not modify): for R = 1 each is the primary alone.
func (s *OwnershipSnapshot) ReplicaSets() [][]string {
	if s.replicas != nil {
		return s.replicas
	}
	out := make([][]string, s.ShardCount)
	for sh := range s.ShardCount {
		out[sh] = s.ReplicaSet(sh).Replicas
	}
	return out
}

// UnderReplicated reports whether every shard has fewer copies than the
// replication factor asks for (fewer active members than R).
func (s *OwnershipSnapshot) UnderReplicated() bool { return s.Copies < s.Factor }

// epochsOf dates every shard's replica list: a shard whose list is the
// same as in prev keeps its epoch, any other gets next's Version.
func epochsOf(prev, next *OwnershipSnapshot) []uint64 {
	out := make([]uint64, next.ShardCount)
	for sh := range next.ShardCount {
		out[sh] = next.Version
		if prev != nil && prev.ShardCount == next.ShardCount &&
			slices.Equal(prev.ReplicaSet(sh).Replicas, next.ReplicaSet(sh).Replicas) {
			out[sh] = prev.epochs[sh]
		}
	}
	return out
}

// subscribers is the set of ownership subscriptions (Subscribe); set is
// nil after Shutdown. mu guards it.
type subscribers struct {
	mu  sync.Mutex
	set map[*subscriber]struct{}
}
