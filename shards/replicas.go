package shards

import (
	"slices"

	"github.com/cespare/xxhash/v2"
)

// The replica-set contract adds these constants to Assign's: like them they
// are pinned by the golden vectors in replicas_test.go, and changing one (or
// the algorithm in ReplicaSets) is a breaking change for mixed-version
// clusters.
const (
	// replicaCapNum/replicaCapDen is the most replica-set positions (any
	// position) one member may hold, as a multiple of the ideal
	// copies·S/N: 5/4, the 1.25 × balance bound (see ReplicaSets).
	replicaCapNum = 5
	replicaCapDen = 4
	// fillTargetNum/fillTargetDen is the load, as a multiple of the ideal,
	// up to which members take the positions left after the primary and
	// the failover backup: 9/8. Filling to an even load moves more copies
	// on a join, filling to the cap loads some members to 1.25 ×; see
	// docs/adr/0005-replica-set-construction.md.
	fillTargetNum = 9
	fillTargetDen = 8
)

// ReplicaTable maps every shard in [0, ShardCount) to its replica set: an
// ordered list [primary, backup 1, …] of Copies() distinct members. A
// ReplicaTable is immutable once ReplicaSets returns it and safe for
// concurrent use; every method that returns a slice returns the caller's own
// copy.
//
// Build one with [ReplicaSets]. The zero value is an empty table of zero
// shards.
type ReplicaTable struct {
	owners *Table  // the primaries: exactly Assign(members, shardCount)
	factor int     // requested replication factor, ≥ 1
	copies int     // min(factor, members); 0 with no members
	sets   []int32 // shard·copies + position → index into owners.members
	held   [][]uint32
}

// ReplicaSets computes every shard's replica set for a member set and a
// replication factor (DESIGN.md "Replicated shards"). It is a pure,
// deterministic function of the *set* of names, shardCount and factor, with
// the same input rules as [Assign]: member order does not matter, duplicate
// names count once, empty names are ignored, a shardCount of 0 is 1.
//
// # How to call it
//
// Pass the same live member set and shard count the ownership table is
// computed from, and the cluster-wide replication factor R, on every change
// of that set; every node then computes the same sets from the same view,
// with no history. Owners() of the result is Assign's table for the same
// inputs, so one call gives both. It is CPU work of tens of milliseconds for
// large clusters (see Cost): run it off the gossip callback, once per change,
// and share the result; never per request.
//
// After a change, a node must sync the shards it holds in the new table and
// did not in the old one (Held(self) of the new minus the old); it may drop
// its copy of a shard only once the new set holds enough synced copies
// (DESIGN.md "Shard sync"). [ReplicaTable.Diff] lists the shards whose set
// changed at all.
//
// # Shape
//
// Every shard gets Copies() = min(R, members) distinct members, in order:
//
//   - position 0, the primary: always exactly Assign(members,
//     shardCount).Owner(shard), so primaries keep Assign's exact balance
//     ([ReplicaTable.Owners] is that table);
//   - position 1, backup 1: the shard's failover owner when the load cap
//     allows (see Failover), otherwise the next backup;
//   - the other backups by descending rendezvous score (Assign's score).
//
// An R below 1 counts as 1 (primaries only). An R larger than the member
// count is capped, never an error: with 2 members and R = 3 every shard has
// 2 copies, each member holds every shard, Copies() is 2, Factor() 3 and
// UnderReplicated() true; with 1 member every set is that member alone; with
// no members every set is empty (Replicas returns nil).
//
// # Failover
//
// The failover owner of a shard is the member Assign gives it when its
// primary is removed from the set: the new primary after that member dies
// or leaves. Putting it at position 1 means the new primary of each of the
// lost member's shards already holds a copy. Only the load cap (below) can
// keep a failover owner out of a set, and only when that member is at the
// cap. Measured (docs/BENCHMARKS.md), every lost member's shards all fail
// over to a holder for R = 2 up to 6 members at S = 1024 and 10 at
// S = 4096, and for R = 3 up to 24 members at S = 1024 and 32 at S = 4096;
// beyond, the worst member's share falls to 87.5 % (R = 2, 32 members,
// S = 1024). A miss costs failover time, never a copy: the new primary must
// sync that shard from a surviving replica before it claims. Only one
// failure at a time is planned for: after two, a new primary may hold no
// copy.
//
// # Balance
//
// No member holds more than max(ceil(c·S/N), floor(1.25·c·S/N)) shard
// copies in all positions (c = Copies(), N members, S shards): the 1.25 ×
// balance bound. A member whose failover demand would exceed the cap takes
// failover backups up to it; the misses are spread so that each primary
// loses as small a share of its shards as possible. The remaining positions
// go to members below a fill target of 1.125 × the ideal (or the lowest
// level that has room for them), by shard-proposing deferred acceptance in
// rendezvous-score order, as in Assign. A shard left short (its members
// below the target already in its set) is completed by moving backups along
// an augmenting path under the cap, a failover backup only if nothing else
// works; only if no path existed at all would it take a member over the
// cap, which no test has produced (the cap is property-tested for any
// member set of up to 24, any S ≤ 1024 and R ≤ 5).
//
// # Cost
//
// One Assign-sized deferred acceptance for the member set and one per
// member removed, over preference lists sorted once: O(S·N·log N + N·DA)
// time and O(S·N) memory. Measured at 100 members as about 15 Assign calls
// of the same size (roughly 30 ms and 2.7 MB at S = 4096 on an idle
// machine, 4–5 ms for 16 members; docs/BENCHMARKS.md).
func ReplicaSets(members []string, shardCount uint32, factor int) *ReplicaTable {
	owners := Assign(members, shardCount)
	n := len(owners.members)
	factor = max(factor, 1)
	t := &ReplicaTable{owners: owners, factor: factor, copies: min(factor, n)}
	if n == 0 {
		return t
	}
	sc := owners.shardCount
	c := t.copies
	t.sets = make([]int32, int(sc)*c)
	for i := range t.sets {
		t.sets[i] = -1
	}
	for s, o := range owners.owner {
		t.sets[s*c] = int32(o)
	}
	if c > 1 {
		nodeKey := make([]uint64, n)
		for i, name := range owners.members {
			nodeKey[i] = xxhash.Sum64String(name)
		}
		b := newReplicaBuilder(t, nodeKey)
		prefs := b.preferences()
		b.failoverBackups(prefs)
		b.fill(prefs)
		b.order()
	}
	t.held = make([][]uint32, n)
	for s := range sc {
		for _, m := range t.sets[int(s)*c : int(s+1)*c] {
			t.held[m] = append(t.held[m], s)
		}
	}
	return t
}

// replicaBuilder holds the working state of one ReplicaSets call.
type replicaBuilder struct {
	t        *ReplicaTable
	nodeKey  []uint64
	n, c     int
	sc       uint32
	load     []int    // member → positions held so far
	filled   []int    // shard → positions filled so far (a prefix of its set)
	fixed    []int    // shard → positions fixed before the fill (primary, failover backup)
	cap      int      // most positions per member
	target   int      // fill target load per member
	shardKey []uint64 // shard → fmix64(shard + shardSalt)
}

func newReplicaBuilder(t *ReplicaTable, nodeKey []uint64) *replicaBuilder {
	n, c, sc := len(nodeKey), t.copies, t.owners.shardCount
	b := &replicaBuilder{
		t: t, nodeKey: nodeKey, n: n, c: c, sc: sc,
		load:     make([]int, n),
		filled:   make([]int, sc),
		shardKey: make([]uint64, sc),
	}
	for s := range sc {
		b.shardKey[s] = fmix64(uint64(s) + shardSalt)
		b.filled[s] = 1
	}
	for i, owned := range t.owners.owned {
		b.load[i] = len(owned)
	}
	ideal := uint64(c) * uint64(sc)
	b.cap = int(max((ideal+uint64(n)-1)/uint64(n), ideal*replicaCapNum/(replicaCapDen*uint64(n))))
	b.target = int(ideal * fillTargetNum / (fillTargetDen * uint64(n)))
	return b
}

func (b *replicaBuilder) score(member int, shard uint32) uint64 {
	return fmix64(b.nodeKey[member] ^ b.shardKey[shard])
}

// failoverBackups puts each shard's failover owner (its owner under Assign
// of the members minus its primary) at position 1, within the load cap.
func (b *replicaBuilder) failoverBackups(prefs []int32) {
	// demand[m]: the shards that fail over to m, with m's score for each.
	demand := make([][]held, b.n)
	rest := make([]uint64, 0, b.n-1)
	quota := make([]uint32, b.n)
	da := newPrefDA(b.n, b.sc)
	for x := range b.n {
		mine := b.t.owners.owned[x]
		if len(mine) == 0 {
			continue
		}
		// Assign's quotas for the members minus x, back in member indices.
		rest = append(append(rest[:0], b.nodeKey[:x]...), b.nodeKey[x+1:]...)
		for j, q := range quotas(rest, b.sc) {
			quota[j+boolInt(j >= x)] = q
		}
		quota[x] = 0
		owner := da.run(b, prefs, quota, x)
		for _, s := range mine {
			m := int(owner[s])
			demand[m] = append(demand[m], held{score: b.score(m, s), shard: s})
		}
	}
	b.keepWithinCap(demand)
}

func boolInt(v bool) int {
	if v {
		return 1
	}
	return 0
}

// preferences returns every shard's members in the order a shard proposes to
// them in Assign (score descending, ties to the lower index), flattened:
// shard s's list is prefs[s·n : (s+1)·n].
func (b *replicaBuilder) preferences() []int32 {
	prefs := make([]int32, int(b.sc)*b.n)
	scores := make([]uint64, b.n)
	for s := range b.sc {
		list := prefs[int(s)*b.n : int(s+1)*b.n]
		for i := range b.n {
			list[i] = int32(i)
			scores[i] = b.score(i, s)
		}
		slices.SortFunc(list, func(x, y int32) int {
			switch sx, sy := scores[x], scores[y]; {
			case sx > sy:
				return -1
			case sx < sy:
				return 1
			}
			return int(x - y)
		})
	}
	return prefs
}

// prefDA is Assign's deferred acceptance (deferredAcceptance) over
// precomputed preference lists, with one member left out: the same unique
// stable assignment as Assign of the members minus that one, without
// re-scanning every member per proposal. Its buffers are reused across runs.
type prefDA struct {
	owner   []int32
	next    []int32 // shard → position in its list of its next proposal
	free    []uint32
	backing []held
	heaps   [][]held
}

func newPrefDA(n int, sc uint32) *prefDA {
	return &prefDA{
		owner:   make([]int32, sc),
		next:    make([]int32, sc),
		free:    make([]uint32, 0, sc),
		backing: make([]held, sc),
		heaps:   make([][]held, n),
	}
}

// run returns shard → member index under quota (which sums to the shard
// count and gives skip nothing); skip is never proposed to.
func (d *prefDA) run(b *replicaBuilder, prefs []int32, quota []uint32, skip int) []int32 {
	off := uint32(0)
	for i, q := range quota {
		d.heaps[i] = d.backing[off : off : off+q]
		off += q
	}
	d.free = d.free[:0]
	for s := int(b.sc) - 1; s >= 0; s-- {
		d.next[s] = 0
		d.free = append(d.free, uint32(s))
	}
	for len(d.free) > 0 {
		s := d.free[len(d.free)-1]
		d.free = d.free[:len(d.free)-1]
		list := prefs[int(s)*b.n : int(s+1)*b.n]
		for {
			i := list[d.next[s]]
			d.next[s]++
			if int(i) == skip {
				continue
			}
			h := d.heaps[i]
			cand := held{score: b.score(int(i), s), shard: s}
			if len(h) < cap(h) {
				d.heaps[i] = heapPush(h, cand)
				d.owner[s] = i
				break
			}
			if len(h) > 0 && worse(h[0], cand) {
				evicted := h[0].shard
				h[0] = cand
				heapFix(h)
				d.owner[s] = i
				d.free = append(d.free, evicted)
				break
			}
		}
	}
	return d.owner
}

// keepWithinCap puts each member's failover demand at position 1 up to its
// room under the cap. Members over it drop shards one at a time, round-robin
// over those members in index order; each drop takes, among the member's
// remaining demand, a shard of the primary that has lost the smallest share
// of its shards so far (ties: the shard the member scores lowest, then the
// higher shard), so that the misses spread evenly over the primaries.
func (b *replicaBuilder) keepWithinCap(demand [][]held) {
	lost := make([]int, b.n) // primary → its shards dropped so far
	owned := func(p int) int { return len(b.t.owners.owned[p]) }
	excess := make([]int, b.n)
	for m, d := range demand {
		excess[m] = max(0, len(d)-(b.cap-b.load[m]))
	}
	for more := true; more; {
		more = false
		for m, d := range demand {
			if excess[m] == 0 {
				continue
			}
			pick := -1
			for j, h := range d {
				p := int(b.t.owners.owner[h.shard])
				if pick < 0 {
					pick = j
					continue
				}
				q := int(b.t.owners.owner[d[pick].shard])
				// Compare lost[p]/owned(p) with lost[q]/owned(q).
				l, r := lost[p]*owned(q), lost[q]*owned(p)
				if l < r || (l == r && worse(h, d[pick])) {
					pick = j
				}
			}
			lost[b.t.owners.owner[d[pick].shard]]++
			demand[m] = slices.Delete(d, pick, pick+1)
			excess[m]--
			more = more || excess[m] > 0
		}
	}
	for m, d := range demand {
		for _, h := range d {
			b.t.sets[int(h.shard)*b.c+1] = int32(m)
			b.filled[h.shard] = 2
		}
		b.load[m] += len(d)
	}
}

// fill completes every set to c members. All members are topped up towards
// one water level: shard-proposing deferred acceptance in rendezvous-score
// order, each member holding at most (level − load) shards, the best-scoring
// ones. A shard left short (every member below the level already in its set)
// is completed by an augmenting path under the cap; only if none exists does
// it take its best member outside the set whatever that member's load.
func (b *replicaBuilder) fill(prefs []int32) {
	b.fixed = slices.Clone(b.filled)
	need := 0
	for _, f := range b.filled {
		need += b.c - f
	}
	if need == 0 {
		return
	}
	// Lowest level L with Σ max(0, L − load) ≥ need; L ≤ cap always (the
	// cap is at least ceil(c·S/N) and no load exceeds it).
	lo, hi := 0, b.cap
	for lo < hi {
		mid := (lo + hi) / 2
		room := 0
		for _, l := range b.load {
			room += max(0, mid-l)
		}
		if room >= need {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	// Fill up to the target load, or higher when that is short of room.
	level := min(b.cap, max(lo, b.target))
	heaps := make([][]held, b.n)
	for m, l := range b.load {
		heaps[m] = make([]held, 0, max(0, level-l))
	}
	next := make([]int, b.sc) // shard → position in its list of its next proposal
	free := make([]uint32, 0, b.sc)
	for s := int(b.sc) - 1; s >= 0; s-- {
		if b.filled[s] < b.c {
			free = append(free, uint32(s))
		}
	}
	for len(free) > 0 {
		s := free[len(free)-1]
		free = free[:len(free)-1]
		list := prefs[int(s)*b.n : int(s+1)*b.n]
		for b.filled[s] < b.c && next[s] < b.n {
			i := int(list[next[s]])
			next[s]++
			if b.inFixed(s, i) {
				continue
			}
			h := heaps[i]
			cand := held{score: b.score(i, s), shard: s}
			if len(h) < cap(h) {
				heaps[i] = heapPush(h, cand)
				b.filled[s]++
				continue
			}
			if len(h) > 0 && worse(h[0], cand) {
				ev := h[0].shard
				h[0] = cand
				heapFix(h)
				b.filled[s]++
				b.filled[ev]--
				free = append(free, ev)
			}
		}
	}
	// Write the accepted backups after each shard's fixed prefix; fills[m]
	// lists the shards member m fills, ascending.
	fills := make([][]uint32, b.n)
	for m, h := range heaps {
		for _, x := range h {
			fills[m] = append(fills[m], x.shard)
		}
		slices.Sort(fills[m])
		for _, s := range fills[m] {
			b.t.sets[int(s)*b.c+b.slotFree(s)] = int32(m)
		}
		b.load[m] += len(h)
	}
	var backups [][]uint32 // member → shards it is the failover backup of, ascending
	for s := range b.sc {
		for b.slotFree(s) < b.c {
			if b.augment(s, fills, nil) {
				continue
			}
			if backups == nil {
				backups = make([][]uint32, b.n)
				for s := range b.sc {
					if b.fixed[s] == 2 {
						m := b.t.sets[int(s)*b.c+1]
						backups[m] = append(backups[m], s)
					}
				}
			}
			if !b.augment(s, fills, backups) {
				b.overfill(s)
			}
		}
	}
}

// slotFree returns the first empty position of shard s's set (c when full).
func (b *replicaBuilder) slotFree(s uint32) int {
	set := b.t.sets[int(s)*b.c : int(s+1)*b.c]
	if i := slices.Index(set, -1); i >= 0 {
		return i
	}
	return b.c
}

func (b *replicaBuilder) inSet(s uint32, member int) bool {
	return slices.Contains(b.t.sets[int(s)*b.c:int(s+1)*b.c], int32(member))
}

// augment gives shard s0 one more member along the shortest augmenting path
// (breadth first, members in index order, their filled shards ascending):
// s0 takes a member m1 outside its set; if m1 is at the cap, one of m1's
// filled shards moves to a member m2 outside that shard's set, and so on
// until a member below the cap. Loads change only at the path's end, which
// gains one copy. When backups is not nil, failover backups (position 1)
// may move too, after the filled shards: the cap outranks a failover hit.
// It reports false when no such path exists.
func (b *replicaBuilder) augment(s0 uint32, fills, backups [][]uint32) bool {
	type step struct {
		prev  int    // member before this one on the path, -1 for the first
		shard uint32 // the shard this member takes
	}
	via := make([]step, b.n)
	seen := make([]bool, b.n)
	queue := make([]int, 0, b.n)
	for m := range b.n {
		if !b.inSet(s0, m) {
			seen[m], via[m] = true, step{prev: -1, shard: s0}
			queue = append(queue, m)
		}
	}
	for len(queue) > 0 {
		m := queue[0]
		queue = queue[1:]
		if b.load[m] < b.cap {
			// Walk back: each member takes its shard; the one before it
			// gives that shard up.
			for x := m; x >= 0; x = via[x].prev {
				s := via[x].shard
				if p := via[x].prev; p >= 0 {
					set := b.t.sets[int(s)*b.c : int(s+1)*b.c]
					set[slices.Index(set, int32(p))] = int32(x)
					if i, ok := slices.BinarySearch(fills[p], s); ok {
						fills[p] = slices.Delete(fills[p], i, i+1)
					} else {
						// p was s's failover backup: x fills in for it,
						// and the set is reordered by score.
						i, _ := slices.BinarySearch(backups[p], s)
						backups[p] = slices.Delete(backups[p], i, i+1)
						b.fixed[s] = 1
					}
				} else {
					b.t.sets[int(s)*b.c+b.slotFree(s)] = int32(x)
				}
				i, _ := slices.BinarySearch(fills[x], s)
				fills[x] = slices.Insert(fills[x], i, s)
			}
			b.load[m]++
			return true
		}
		movable := fills[m]
		if backups != nil {
			movable = append(slices.Clone(movable), backups[m]...)
		}
		for _, s := range movable {
			for y := range b.n {
				if !seen[y] && !b.inSet(s, y) {
					seen[y], via[y] = true, step{prev: m, shard: s}
					queue = append(queue, y)
				}
			}
		}
	}
	return false
}

// overfill gives shard s its best-scoring member outside its set, whatever
// that member's load: the last resort when no augmenting path exists.
func (b *replicaBuilder) overfill(s uint32) {
	best, bestScore := -1, uint64(0)
	for i := range b.n {
		if b.inSet(s, i) {
			continue
		}
		if sc := b.score(i, s); best < 0 || sc > bestScore {
			best, bestScore = i, sc
		}
	}
	b.t.sets[int(s)*b.c+b.slotFree(s)] = int32(best)
	b.load[best]++
}

func (b *replicaBuilder) inFixed(s uint32, member int) bool {
	return slices.Contains(b.t.sets[int(s)*b.c:int(s)*b.c+b.fixed[s]], int32(member))
}

// order sorts each shard's filled backups (after the fixed prefix) by
// descending score, ties to the lower member index.
func (b *replicaBuilder) order() {
	for s := range b.sc {
		tail := b.t.sets[int(s)*b.c+b.fixed[s] : int(s+1)*b.c]
		if len(tail) < 2 {
			continue
		}
		slices.SortFunc(tail, func(x, y int32) int {
			sx, sy := b.score(int(x), s), b.score(int(y), s)
			switch {
			case sx > sy:
				return -1
			case sx < sy:
				return 1
			}
			return int(x - y)
		})
	}
}

// ShardCount returns the number of shards the table covers (≥ 1 for a table
// built by ReplicaSets).
func (t *ReplicaTable) ShardCount() uint32 {
	if t.owners == nil {
		return 0
	}
	return t.owners.shardCount
}

// Members returns the table's members, sorted and unique.
func (t *ReplicaTable) Members() []string {
	if t.owners == nil {
		return nil
	}
	return t.owners.Members()
}

// Len returns the number of members.
func (t *ReplicaTable) Len() int {
	if t.owners == nil {
		return 0
	}
	return t.owners.Len()
}

// Factor returns the requested replication factor (≥ 1; the factor passed to
// ReplicaSets, raised to 1 if it was lower).
func (t *ReplicaTable) Factor() int { return max(t.factor, 1) }

// Copies returns how many members every replica set holds: min(Factor(),
// Len()), so 0 for an empty table.
func (t *ReplicaTable) Copies() int { return t.copies }

// UnderReplicated reports whether the member set is too small for the
// requested factor (Copies() < Factor()): every shard then has fewer copies
// than asked, e.g. a one-node cluster with factor 2.
func (t *ReplicaTable) UnderReplicated() bool { return t.copies < t.Factor() }

// Owners returns the primaries' ownership table, the same table as
// Assign(members, shardCount).
func (t *ReplicaTable) Owners() *Table {
	if t.owners == nil {
		return &Table{}
	}
	return t.owners
}

// Primary returns shard's primary (position 0 of its replica set, the owner
// under Assign), or "" when the table has no members or shard ≥
// ShardCount().
func (t *ReplicaTable) Primary(shard uint32) string { return t.Owners().Owner(shard) }

// Replicas returns shard's replica set: Copies() distinct members, primary
// first, then backup 1 (the failover owner, unless the load cap moved it),
// then the others by descending rendezvous score. It is nil when the table
// has no members or shard ≥ ShardCount().
func (t *ReplicaTable) Replicas(shard uint32) []string {
	if t.copies == 0 || shard >= t.ShardCount() {
		return nil
	}
	out := make([]string, t.copies)
	for p, m := range t.sets[int(shard)*t.copies : int(shard+1)*t.copies] {
		out[p] = t.owners.members[m]
	}
	return out
}

// Position returns member's position in shard's replica set (0 for the
// primary, 1 for backup 1, …), or -1 when member does not hold shard or
// shard ≥ ShardCount().
func (t *ReplicaTable) Position(member string, shard uint32) int {
	i, ok := t.index(member)
	if !ok || shard >= t.ShardCount() {
		return -1
	}
	return slices.Index(t.sets[int(shard)*t.copies:int(shard+1)*t.copies], int32(i))
}

// Holds reports whether member is in shard's replica set (any position).
func (t *ReplicaTable) Holds(member string, shard uint32) bool {
	return t.Position(member, shard) >= 0
}

// Held returns, ascending, every shard whose replica set includes member (any
// position); nil when member is not in the table.
func (t *ReplicaTable) Held(member string) []uint32 {
	i, ok := t.index(member)
	if !ok {
		return nil
	}
	return slices.Clone(t.held[i])
}

// HeldCount returns how many replica sets include member (0 when it is not
// in the table): its load in shard copies.
func (t *ReplicaTable) HeldCount(member string) int {
	i, ok := t.index(member)
	if !ok {
		return 0
	}
	return len(t.held[i])
}

// Equal reports whether two tables have the same shard count, members,
// factor and replica sets (order within a set included).
func (t *ReplicaTable) Equal(o *ReplicaTable) bool {
	return t.ShardCount() == o.ShardCount() && t.Factor() == o.Factor() &&
		slices.Equal(t.Members(), o.Members()) && t.Diff(o) == nil
}

// Diff returns, ascending, the shards whose replica set differs between t
// and o as an ordered list (shards covered by only one of the tables count
// as differing). A member must sync shard s when it is in s's set in the new
// table but not in the old one: compare Held or Holds for that.
func (t *ReplicaTable) Diff(o *ReplicaTable) []uint32 {
	var out []uint32
	for s := uint32(0); s < max(t.ShardCount(), o.ShardCount()); s++ {
		if !slices.Equal(t.Replicas(s), o.Replicas(s)) {
			out = append(out, s)
		}
	}
	return out
}

func (t *ReplicaTable) index(member string) (int, bool) {
	if t.owners == nil {
		return 0, false
	}
	return t.owners.index(member)
}
