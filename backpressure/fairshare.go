package backpressure

import (
	"math"
	"slices"
)

// NodeDemand is one node's report for one namespace, as the namespace's
// lease coordinator sees it (DESIGN.md "Exact cluster-wide quota"; the
// model is Doorman's wants / has / gets).
type NodeDemand struct {
	// Wants is how many rows of the namespace the node could run at once
	// (claimed + visible pending, rows). Values above the quota count as
	// the quota.
	Wants uint32
	// Has is how many rows of the quota the node holds now and may keep
	// using whatever it is granted: the larger of its claimed rows and any
	// grant it may still be acting on (rows). Claimed rows are never
	// pre-empted, so a grant below Has only stops new claims.
	Has uint32
	// Rank orders the nodes for the rows left over when the quota does not
	// divide evenly (step 1 below): the larger Rank first, then the larger
	// Has, then the lower index. 0 for every node keeps the Has order. The
	// lease coordinator ranks by turn (lease.Coordinator), so a quota
	// smaller than the number of nodes with demand rotates between them
	// instead of staying with whoever holds it.
	Rank uint64
}

// FairShare splits a namespace's cluster-wide quota (rows) between nodes
// and returns each node's grant (rows), in the order of nodes. It appends
// to grants[:0] and returns the result, so a caller can reuse one slice;
// grants may be nil. It is pure and deterministic.
//
// Two steps:
//
//  1. Targets, max-min fair over wants (water-filling, in whole rows). With
//     w_i = min(Wants_i, quota): if Σ w_i ≤ quota every node's target is
//     w_i. Otherwise the level L is the largest integer with
//     Σ min(w_i, L) ≤ quota; every node's target is min(w_i, L), and the
//     r = quota − Σ min(w_i, L) rows left over (r is smaller than the
//     number of nodes with w_i > L) go one each to nodes with w_i > L,
//     the larger Rank first, then the larger Has (a node already using the
//     extra row keeps it, so it is not handed over idle every refresh),
//     ties to the lower index. So nothing is left on the table while a node wants
//     more, and no node's target exceeds its fair share
//     f_i = min(w_i, ⌈ℓ⌉), where ℓ is the real-valued water level
//     (Σ min(w_i, ℓ) = quota when Σ w_i > quota).
//  2. Capacity the others hold. A node's holding is max(grant, Has): a grant
//     below Has cannot take back claimed rows. Only
//     B = quota − Σ Has_i (0 if negative) rows may be added on top of what
//     nodes hold. If the targets need more than B above the holdings, B is
//     water-filled from the bottom: grant_i = min(target_i,
//     max(Has_i, λ)) for the largest level λ that fits, plus one row each
//     for the rows left over, to nodes lifted to λ and short of their
//     targets in step 1's order: the larger Rank first, then the larger
//     Has, ties to the lower index. So a row that comes free while several
//     nodes wait goes to the one the coordinator ranks first (the longest
//     waiter), whichever of them asks. The nodes holding least (the ones
//     starved so far) are lifted first. Nodes whose target is at or
//     below Has get their target: their grant shrinks, their claimed rows
//     drain, and the capacity comes free as they report lower Has.
//
// Guarantees (property-tested):
//   - grant_i ≤ target_i ≤ f_i ≤ min(Wants_i, quota);
//   - Σ max(grant_i, Has_i) ≤ quota whenever Σ Has_i ≤ quota (the quota is
//     never over-committed), and no grant exceeds Has when Σ Has_i ≥ quota;
//   - either every node gets its target, or the holdings use the whole
//     quota (Σ max(grant_i, Has_i) ≥ quota);
//   - Σ target_i = min(quota, Σ w_i) and, for any node i short of its
//     wants, no target exceeds target_i + 1 (max-min fairness).
//
// Used by a coordinator once per node refresh, with the other nodes'
// holdings as their Has, it also never lets a node with wants > 0 wait
// while another holds more than its fair share for longer than one
// refresh plus the time its claimed rows take to finish
// (TestFairShareRefreshRounds states this exactly, over refresh rounds).
//
// Cost: O(N·(log quota + log max Has)) and no allocation beyond the
// result; docs/BENCHMARKS.md has figures for 5, 50 and 500 nodes.
func FairShare(quota uint32, nodes []NodeDemand, grants []uint32) []uint32 {
	grants = slices.Grow(grants[:0], len(nodes))[:len(nodes)]
	q := uint64(quota)

	// Step 1: targets.
	var sumWants uint64
	for _, n := range nodes {
		sumWants += min(uint64(n.Wants), q)
	}
	if sumWants <= q {
		for i, n := range nodes {
			grants[i] = uint32(min(uint64(n.Wants), q))
		}
	} else {
		level := targetLevel(q, nodes)
		var used uint64
		for i, n := range nodes {
			t := min(uint64(n.Wants), q, level)
			grants[i] = uint32(t)
			used += t
		}
		if left := q - used; left > 0 {
			// left is smaller than the number of nodes that want more
			// than the level, or level+1 would have fitted.
			short := func(i int) bool { return min(uint64(nodes[i].Wants), q) > level }
			cut := newLeftoverCut(nodes, left, short)
			for i, n := range nodes {
				if short(i) && cut.take(n) {
					grants[i]++
				}
			}
		}
	}

	// Step 2: fit the targets into what the holdings leave free.
	var held, need uint64
	for i, n := range nodes {
		held += uint64(n.Has)
		if g := uint64(grants[i]); g > uint64(n.Has) {
			need += g - uint64(n.Has)
		}
	}
	budget := uint64(0)
	if held < q {
		budget = q - held
	}
	if need <= budget {
		return grants
	}
	lambda, used := fillLevel(budget, q, nodes, grants)
	// The nodes lifted exactly to λ and short of their targets share the
	// rows left over, in step 1's order. eligible reads the target, so each
	// node is tested before its grant is overwritten below.
	eligible := func(i int) bool { return uint64(grants[i]) > lambda && uint64(nodes[i].Has) <= lambda }
	left := budget - used
	var cut leftoverCut
	if left > 0 {
		// left is smaller than the number of eligible nodes: each adds
		// exactly one row at λ+1, which did not fit.
		cut = newLeftoverCut(nodes, left, eligible)
	}
	for i, n := range nodes {
		t, h := uint64(grants[i]), uint64(n.Has)
		if t <= h {
			continue // target at or below its holding: the grant shrinks to it
		}
		g := max(h, min(t, lambda))
		if left > 0 && eligible(i) && cut.take(n) {
			g++
		}
		grants[i] = uint32(g)
	}
	return grants
}

// targetLevel returns the largest level L in [0, q] with
// Σ min(Wants_i, q, L) ≤ q. Binary search: O(N log q).
func targetLevel(q uint64, nodes []NodeDemand) uint64 {
	lo, hi := uint64(0), q
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		var sum uint64
		for _, n := range nodes {
			if sum += min(uint64(n.Wants), q, mid); sum > q {
				break
			}
		}
		if sum <= q {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo
}

// leftoverCut chooses which of a set of eligible nodes get the rows left
// over at a water level: `left` of them, in the order of the key (Rank,
// Has), largest first, ties to the lower index. It finds the key threshold
// by two binary searches (Rank, then Has among the nodes at the threshold
// Rank) instead of sorting, so it allocates nothing: O(N·(64 + log max
// Has)). Build it with newLeftoverCut, then call take for every eligible
// node in index order.
type leftoverCut struct {
	rank, has uint64 // the threshold key
	ties      uint64 // rows left for the nodes exactly at the threshold key
}

// newLeftoverCut returns the cut giving left rows to the nodes for which
// eligible(i) holds. left must be smaller than the number of eligible
// nodes.
func newLeftoverCut(nodes []NodeDemand, left uint64, eligible func(i int) bool) leftoverCut {
	// rankAtLeast(r): how many eligible nodes have Rank ≥ r.
	rankAtLeast := func(r uint64) uint64 {
		var c uint64
		for i, n := range nodes {
			if eligible(i) && n.Rank >= r {
				c++
			}
		}
		return c
	}
	// The largest Rank threshold r with rankAtLeast(r) ≥ left (every
	// eligible node has Rank ≥ 0, and there are more of them than left).
	var lo, hi uint64
	for i, n := range nodes {
		if eligible(i) {
			hi = max(hi, n.Rank)
		}
	}
	for lo < hi {
		mid := lo + (hi-lo)/2 + (hi-lo)%2
		if rankAtLeast(mid) >= left {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	rank := lo
	var above uint64 // eligible nodes ranked above the threshold: each gets one
	if rank < math.MaxUint64 {
		above = rankAtLeast(rank + 1)
	}
	need := left - above // rows for the nodes exactly at the threshold Rank
	// hasAtLeast(h): how many eligible nodes at the threshold Rank have
	// Has ≥ h.
	hasAtLeast := func(h uint64) uint64 {
		var c uint64
		for i, n := range nodes {
			if eligible(i) && n.Rank == rank && uint64(n.Has) >= h {
				c++
			}
		}
		return c
	}
	var hlo, hhi uint64
	for i, n := range nodes {
		if eligible(i) && n.Rank == rank {
			hhi = max(hhi, uint64(n.Has))
		}
	}
	for hlo < hhi {
		mid := hlo + (hhi-hlo+1)/2
		if hasAtLeast(mid) >= need {
			hlo = mid
		} else {
			hhi = mid - 1
		}
	}
	return leftoverCut{rank: rank, has: hlo, ties: need - hasAtLeast(hlo+1)}
}

// take reports whether the eligible node n gets a row left over. Called
// once per eligible node, in index order.
func (c *leftoverCut) take(n NodeDemand) bool {
	switch h := uint64(n.Has); {
	case n.Rank > c.rank, n.Rank == c.rank && h > c.has:
		return true
	case n.Rank == c.rank && h == c.has && c.ties > 0:
		c.ties--
		return true
	}
	return false
}

// Level returns the water level L of FairShare's step 1 for these nodes:
// the largest whole number of rows every node can be given (up to its
// wants, capped at quota) with Σ min(Wants_i, L) ≤ quota, or quota when
// the wants all fit (then nothing is contended). A node whose capped wants
// exceed L competes for the rows left over; it holds one of them when its
// grant exceeds L. The lease coordinator uses it to track turns.
func Level(quota uint32, nodes []NodeDemand) uint32 {
	q := uint64(quota)
	var sumWants uint64
	for _, n := range nodes {
		sumWants += min(uint64(n.Wants), q)
	}
	if sumWants <= q {
		return quota
	}
	return uint32(targetLevel(q, nodes))
}

// fillLevel returns the largest level λ in [0, q] at which lifting every
// node with target_i > Has_i to min(target_i, max(Has_i, λ)) adds at most
// budget rows above the holdings, and the rows it adds. Binary search:
// O(N log q).
func fillLevel(budget, q uint64, nodes []NodeDemand, targets []uint32) (lambda, used uint64) {
	extra := func(l uint64) uint64 {
		var sum uint64
		for i, n := range nodes {
			if g, h := min(uint64(targets[i]), l), uint64(n.Has); g > h {
				if sum += g - h; sum > budget {
					return sum
				}
			}
		}
		return sum
	}
	lo, hi := uint64(0), q
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if extra(mid) <= budget {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	return lo, extra(lo)
}
