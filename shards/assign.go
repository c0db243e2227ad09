package shards

import (
	"slices"
	"sort"

	"github.com/cespare/xxhash/v2"
)

// The constants below are part of the ownership contract: every node of a
// cluster must compute the same table, so changing any of them (or the
// algorithm in Assign) is a breaking change for mixed-version clusters. The
// golden vectors in assign_test.go pin them.
const (
	// shardSalt is added to a shard number before it is mixed into a shard
	// key (the 64-bit golden ratio, as in SplitMix64).
	shardSalt = 0x9E3779B97F4A7C15
	// quotaSalt derives a member's quota priority from its name hash, so
	// that priority is independent of the member's rendezvous scores.
	quotaSalt = 0xC2B2AE3D27D4EB4F
)

// Table is an ownership table: every shard in [0, ShardCount) has exactly
// one owner among Members, or none when the member set is empty. A Table is
// immutable once Assign returns it and safe for concurrent use; every method
// that returns a slice returns the caller's own copy.
//
// Build one with [Assign]. The zero value is an empty table of zero shards.
type Table struct {
	shardCount uint32
	members    []string   // sorted, unique, non-empty
	owner      []uint32   // shard → index into members; nil when no members
	owned      [][]uint32 // member index → its shards, ascending
}

// Assign computes the shard → owner table for a member set. It is a pure,
// deterministic function of the *set* of names and shardCount (DESIGN.md
// "Ownership"): the order of members does not matter, duplicate names count
// once, and empty names are ignored. A shardCount of 0 is treated as 1, as in
// [ShardOf].
//
// # Balance
//
// With N members and S shards, every member owns floor(S/N) or ceil(S/N)
// shards; the S mod N members with the highest quota priority (a hash of the
// name) own the extra one. So no member owns more than ceil(S/N). With more
// members than shards, S members own one shard each and the rest own none.
//
// # Placement
//
// Every (member, shard) pair has a rendezvous score
// fmix64(xxh64(name) ^ fmix64(shard + shardSalt)), where fmix64 is the
// MurmurHash3 64-bit finaliser and xxh64 is XXH64 with seed 0. The table is
// the unique stable assignment under those scores and the quotas: there is no
// shard s and member m such that s is not on m, m scores s above one of its
// own shards (or m has room), and s scores m above its current owner.
// Equivalently: repeatedly give the highest-scoring (shard, member) pair
// whose shard is unowned and whose member is below quota. It is computed by
// shard-proposing deferred acceptance (Gale–Shapley), whose result does not
// depend on the order of proposals. Ties in score (only on a 64-bit hash
// collision) break towards the lower member name and the lower shard number.
//
// # Movement
//
// With unlimited quotas the table is plain rendezvous hashing, which moves
// only the shards a joining member takes or a leaving member held. The
// quotas cost some extra movement: measured, one join or leave moves at
// most about ideal + 1.5·sqrt(S) shards, whatever N (ideal = S/(N+1) on a
// join, the leaver's shards on a leave), so the ratio to ideal grows like
// 1 + N/sqrt(S). It stays within 1.25 × ideal for N ≤ sqrt(S)/6 (5 members
// at S = 1024, 10 at S = 4096) and grows past it for larger clusters
// (about 3.5× at 64 members and S = 1024); see docs/BENCHMARKS.md.
//
// # Cost
//
// O(S·N) score evaluations plus one more O(N) scan per rejected proposal;
// about 1 ms for N = 100, S = 4096 (docs/BENCHMARKS.md).
func Assign(members []string, shardCount uint32) *Table {
	shardCount = max(shardCount, 1)
	names := uniqueNames(members)
	t := &Table{shardCount: shardCount, members: names}
	n := len(names)
	if n == 0 {
		return t
	}

	nodeKey := make([]uint64, n)
	for i, name := range names {
		nodeKey[i] = xxhash.Sum64String(name)
	}
	quota := quotas(nodeKey, shardCount)
	t.owner = deferredAcceptance(nodeKey, quota, shardCount)

	counts := make([]int, n)
	for _, o := range t.owner {
		counts[o]++
	}
	t.owned = make([][]uint32, n)
	backing := make([]uint32, 0, shardCount)
	for i, c := range counts {
		t.owned[i] = backing[len(backing) : len(backing) : len(backing)+c]
		backing = backing[:len(backing)+c]
	}
	for s, o := range t.owner {
		t.owned[o] = append(t.owned[o], uint32(s))
	}
	return t
}

// uniqueNames returns the sorted, de-duplicated, non-empty names.
func uniqueNames(members []string) []string {
	names := make([]string, 0, len(members))
	for _, m := range members {
		if m != "" {
			names = append(names, m)
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// quotas returns each member's shard quota: floor(S/N), plus one for the
// S mod N members of highest priority fmix64(nodeKey ^ quotaSalt), ties to
// the lower index (= lower name, as names are sorted).
func quotas(nodeKey []uint64, shardCount uint32) []uint32 {
	n := uint32(len(nodeKey))
	base, extra := shardCount/n, shardCount%n
	quota := make([]uint32, n)
	for i := range quota {
		quota[i] = base
	}
	if extra == 0 {
		return quota
	}
	order := make([]int, n)
	prio := make([]uint64, n)
	for i := range order {
		order[i] = i
		prio[i] = fmix64(nodeKey[i] ^ quotaSalt)
	}
	sort.Slice(order, func(a, b int) bool {
		pa, pb := prio[order[a]], prio[order[b]]
		if pa != pb {
			return pa > pb
		}
		return order[a] < order[b]
	})
	for _, i := range order[:extra] {
		quota[i]++
	}
	return quota
}

// held is one shard held by a member during deferred acceptance.
type held struct {
	score uint64
	shard uint32
}

// worse reports whether a member prefers b to a: lower score, then higher
// shard number, is worse.
func worse(a, b held) bool {
	if a.score != b.score {
		return a.score < b.score
	}
	return a.shard > b.shard
}

// deferredAcceptance returns shard → member index. Each member's holdings are
// a min-heap (worst shard on top) of at most quota[i] entries, carved out of
// one backing array: the quotas sum to shardCount, so everything fits.
func deferredAcceptance(nodeKey []uint64, quota []uint32, shardCount uint32) []uint32 {
	n := len(nodeKey)
	backing := make([]held, shardCount)
	heaps := make([][]held, n)
	off := uint32(0)
	for i, q := range quota {
		heaps[i] = backing[off : off : off+q]
		off += q
	}

	owner := make([]uint32, shardCount)
	// Per shard: the (score, member) it last proposed to; the next proposal
	// goes to the best member strictly worse than that. noneYet marks a
	// shard that has not proposed.
	const noneYet = -1
	lastScore := make([]uint64, shardCount)
	lastNode := make([]int32, shardCount)
	for s := range lastNode {
		lastNode[s] = noneYet
	}

	free := make([]uint32, 0, shardCount)
	for s := int(shardCount) - 1; s >= 0; s-- {
		free = append(free, uint32(s))
	}
	for len(free) > 0 {
		s := free[len(free)-1]
		free = free[:len(free)-1]
		key := fmix64(uint64(s) + shardSalt)
		for {
			i, score := nextChoice(nodeKey, key, lastScore[s], int(lastNode[s]))
			lastScore[s], lastNode[s] = score, int32(i)
			h := heaps[i]
			cand := held{score: score, shard: s}
			if len(h) < cap(h) {
				heaps[i] = heapPush(h, cand)
				owner[s] = uint32(i)
				break
			}
			if len(h) > 0 && worse(h[0], cand) {
				evicted := h[0].shard
				h[0] = cand
				heapFix(h)
				owner[s] = uint32(i)
				free = append(free, evicted)
				break
			}
		}
	}
	return owner
}

// nextChoice returns the member a shard proposes to next: the best by
// (score desc, index asc) strictly after (lastScore, lastNode) in that order,
// or the best overall when lastNode < 0. A shard never runs out of choices,
// because the quotas sum to the shard count and a member rejects a shard
// only when it is full of better ones.
func nextChoice(nodeKey []uint64, key, lastScore uint64, lastNode int) (int, uint64) {
	best, bestScore := -1, uint64(0)
	first := lastNode < 0
	for i, nk := range nodeKey {
		sc := fmix64(nk ^ key)
		if !first && (sc > lastScore || (sc == lastScore && i <= lastNode)) {
			continue // already proposed to
		}
		if best < 0 || sc > bestScore {
			best, bestScore = i, sc
		}
	}
	return best, bestScore
}

// heapPush adds x to the min-heap h (ordered by worse) within its capacity.
func heapPush(h []held, x held) []held {
	h = append(h, x)
	for j := len(h) - 1; j > 0; {
		p := (j - 1) / 2
		if !worse(h[j], h[p]) {
			break
		}
		h[j], h[p] = h[p], h[j]
		j = p
	}
	return h
}

// heapFix restores the heap after h[0] was replaced.
func heapFix(h []held) {
	for j := 0; ; {
		l := 2*j + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && worse(h[r], h[l]) {
			m = r
		}
		if !worse(h[m], h[j]) {
			return
		}
		h[j], h[m] = h[m], h[j]
		j = m
	}
}

// fmix64 is the MurmurHash3 64-bit finaliser: a bijection with full
// avalanche, used to turn (member, shard) into a rendezvous score cheaply.
func fmix64(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

// ShardCount returns the number of shards the table covers (≥ 1 for a table
// built by Assign).
func (t *Table) ShardCount() uint32 { return t.shardCount }

// Members returns the table's members, sorted and unique.
func (t *Table) Members() []string { return slices.Clone(t.members) }

// Len returns the number of members.
func (t *Table) Len() int { return len(t.members) }

// Owner returns the member that owns shard, or "" when the table has no
// members or shard ≥ ShardCount.
func (t *Table) Owner(shard uint32) string {
	if shard >= uint32(len(t.owner)) {
		return ""
	}
	return t.members[t.owner[shard]]
}

// Owned returns the shards member owns, ascending; nil when member is not in
// the table.
func (t *Table) Owned(member string) []uint32 {
	i, ok := t.index(member)
	if !ok {
		return nil
	}
	return slices.Clone(t.owned[i])
}

// OwnedCount returns how many shards member owns (0 when it is not in the
// table).
func (t *Table) OwnedCount(member string) int {
	i, ok := t.index(member)
	if !ok {
		return 0
	}
	return len(t.owned[i])
}

// Fraction returns member's [OwnedShardFraction], owned/ShardCount. Note the
// clamp of NewOwnedShardFraction: a member owning no shard (or absent)
// reports 1/ShardCount, never 0.
func (t *Table) Fraction(member string) OwnedShardFraction {
	return NewOwnedShardFraction(uint32(t.OwnedCount(member)), t.shardCount)
}

// Equal reports whether two tables have the same shard count, members and
// owners.
func (t *Table) Equal(o *Table) bool {
	return t.shardCount == o.shardCount &&
		slices.Equal(t.members, o.members) &&
		t.Diff(o) == nil
}

// Diff returns, ascending, the shards whose owner differs between t and o
// (shards covered by only one of the tables count as differing). It is the
// set of shards a membership change hands off.
func (t *Table) Diff(o *Table) []uint32 {
	var out []uint32
	for s := uint32(0); s < max(t.shardCount, o.shardCount); s++ {
		if t.Owner(s) != o.Owner(s) {
			out = append(out, s)
		}
	}
	return out
}

func (t *Table) index(member string) (int, bool) {
	return slices.BinarySearch(t.members, member)
}
