package backpressure_test

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/fairshard/fairshard/backpressure"
)

type nd = backpressure.NodeDemand

func TestFairShareTable(t *testing.T) {
	cases := []struct {
		name  string
		quota uint32
		nodes []nd
		want  []uint32
	}{
		{"no nodes", 5, nil, []uint32{}},
		{"quota 0 grants nothing", 0, []nd{{Wants: 3}, {Wants: 1, Has: 1}}, []uint32{0, 0}},
		{"everyone fits: each gets its wants", 10, []nd{{Wants: 3}, {Wants: 4}}, []uint32{3, 4}},
		{"wants above the quota count as the quota", 5, []nd{{Wants: 100}}, []uint32{5}},
		{"equal split", 9, []nd{{Wants: 10}, {Wants: 10}, {Wants: 10}}, []uint32{3, 3, 3}},
		{"leftovers of a small want are redistributed", 10, []nd{{Wants: 2}, {Wants: 10}, {Wants: 10}}, []uint32{2, 4, 4}},
		{"rows left over go to the larger holder", 4, []nd{{Wants: 4, Has: 1}, {Wants: 4, Has: 2}, {Wants: 4, Has: 1}}, []uint32{1, 2, 1}},
		{"rows left over: ties to the lower index", 1, []nd{{Wants: 1}, {Wants: 1}}, []uint32{1, 0}},
		{"quota 3 over 5 nodes: three get one", 3, []nd{{Wants: 9}, {Wants: 9}, {Wants: 9}, {Wants: 9}, {Wants: 9}}, []uint32{1, 1, 1, 0, 0}},
		// A held the whole quota; B now wants half. A's grant is cut to its
		// share, but its 8 claimed rows are not pre-empted: B waits for them.
		{"claimed rows are not pre-empted", 8, []nd{{Wants: 8, Has: 8}, {Wants: 8}}, []uint32{4, 0}},
		{"a draining holder frees capacity row by row", 8, []nd{{Wants: 8, Has: 7}, {Wants: 8}}, []uint32{4, 1}},
		// C no longer wants but still holds 7 of 9: the 2 free rows are split
		// evenly between A and B rather than going to one of them.
		{"free rows are water-filled", 9, []nd{{Wants: 9}, {Wants: 9}, {Has: 7}}, []uint32{1, 1, 0}},
		// A holds 3 already, B nothing: the 2 free rows go to B first.
		{"free rows lift the lowest holder first", 9, []nd{{Wants: 9, Has: 3}, {Wants: 9}, {Has: 4}}, []uint32{3, 2, 0}},
		// The quota was lowered to 3 while A holds 5: nobody gets new rows
		// until A drains below its target.
		{"quota lowered below what is held", 3, []nd{{Wants: 3, Has: 5}, {Wants: 3}}, []uint32{2, 0}},
		// A holds the one row it no longer gets; the row free beside it
		// goes to C, ranked first (the longest waiter), not to B for its
		// lower index.
		{"a free row goes to the highest rank, not the lowest index", 2, []nd{{Wants: 1, Has: 1}, {Wants: 1, Rank: 5}, {Wants: 1, Rank: 9}}, []uint32{0, 0, 1}},
		// X drains 3 rows; 2 are free. A, B and C are lifted to 1 and the
		// row left over goes by (Rank, Has) like step 1's: to B, which
		// holds a row and whose target got the row left over there.
		{"a row left over after lifting follows step 1's order", 7, []nd{{Has: 3}, {Wants: 9}, {Wants: 9, Has: 1}, {Wants: 9, Has: 1}}, []uint32{0, 1, 2, 1}},
		{"a node that no longer wants releases its grant", 4, []nd{{Has: 2}, {Wants: 4}}, []uint32{0, 2}},
		{"largest quota does not overflow", math.MaxUint32, []nd{{Wants: math.MaxUint32}, {Wants: math.MaxUint32}}, []uint32{1 << 31, 1<<31 - 1}},
		{"largest quota, one node", math.MaxUint32, []nd{{Wants: math.MaxUint32, Has: math.MaxUint32}}, []uint32{math.MaxUint32}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.nodes)
			got := backpressure.FairShare(tc.quota, tc.nodes, nil)
			if !slices.Equal(got, tc.want) {
				t.Fatalf("FairShare(%d, %+v) = %v, want %v", tc.quota, tc.nodes, got, tc.want)
			}
			if !slices.Equal(in, tc.nodes) {
				t.Fatalf("FairShare changed its input: %+v → %+v", in, tc.nodes)
			}
		})
	}
}

func TestFairShareReusesTheGrantsSlice(t *testing.T) {
	buf := make([]uint32, 0, 8)
	out := backpressure.FairShare(6, []nd{{Wants: 6}, {Wants: 6}}, buf)
	if &out[0] != &buf[:1][0] || !slices.Equal(out, []uint32{3, 3}) {
		t.Fatalf("got %v, not in the caller's slice", out)
	}
	out = backpressure.FairShare(6, []nd{{Wants: 1}}, out)
	if !slices.Equal(out, []uint32{1}) {
		t.Fatalf("second call: got %v", out)
	}
}

// fairShares is the test's own oracle for each node's fair share
// f_i = min(w_i, ⌈ℓ⌉), where w_i = min(wants_i, quota) and ℓ is the real
// water level with Σ min(w_i, ℓ) = quota (∞ when everyone fits). It also
// returns ⌊ℓ⌋. Computed by sorting, not by FairShare's binary search.
func fairShares(quota uint32, nodes []nd) (f []uint64, floorLevel uint64) {
	q := uint64(quota)
	w := make([]uint64, len(nodes))
	var sum uint64
	for i, n := range nodes {
		w[i] = min(uint64(n.Wants), q)
		sum += w[i]
	}
	f = slices.Clone(w)
	if sum <= q {
		return f, math.MaxUint64
	}
	sorted := slices.Clone(w)
	slices.Sort(sorted)
	remaining, k := q, uint64(len(sorted))
	var ceilLevel uint64
	for _, x := range sorted {
		if x*k <= remaining {
			remaining -= x
			k--
			continue
		}
		floorLevel, ceilLevel = remaining/k, (remaining+k-1)/k
		break
	}
	for i := range f {
		f[i] = min(w[i], ceilLevel)
	}
	return f, floorLevel
}

func drawDemands(t *rapid.T, quota uint32) []nd {
	n := rapid.IntRange(0, 12).Draw(t, "nodes")
	nodes := make([]nd, n)
	for i := range nodes {
		nodes[i] = nd{
			Wants: rapid.Uint32Range(0, quota+3).Draw(t, "wants"),
			Has:   rapid.Uint32Range(0, quota/2+2).Draw(t, "has"),
			Rank:  rapid.SampledFrom([]uint64{0, 0, 1, 2, 7, math.MaxUint64 - 1, math.MaxUint64}).Draw(t, "rank"),
		}
	}
	return nodes
}

// TestFairShareLeftoversFollowRank: with nothing held (step 2 changes
// nothing), the rows left over by the water level go to the short nodes
// with the largest (Rank, Has), ties to the lower index; the lease
// coordinator's turns rely on it.
func TestFairShareLeftoversFollowRank(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		quota := rapid.Uint32Range(1, 40).Draw(t, "quota")
		nodes := drawDemands(t, quota)
		for i := range nodes {
			nodes[i].Has = 0
		}
		got := backpressure.FairShare(quota, nodes, nil)
		level := uint64(backpressure.Level(quota, nodes))
		if level >= uint64(quota) {
			return // no contention: everyone gets their wants
		}
		var short []int
		var given uint64
		for i, n := range nodes {
			g := uint64(got[i])
			if g != min(uint64(n.Wants), uint64(quota), level) && g != level+1 {
				t.Fatalf("node %d got %d; level %d", i, g, level)
			}
			if min(uint64(n.Wants), uint64(quota)) > level {
				short = append(short, i)
				if g == level+1 {
					given++
				}
			}
		}
		slices.SortStableFunc(short, func(a, b int) int {
			if c := cmp.Compare(nodes[b].Rank, nodes[a].Rank); c != 0 {
				return c
			}
			return cmp.Compare(nodes[b].Has, nodes[a].Has)
		})
		for k, i := range short {
			if want := uint64(k) < given; (uint64(got[i]) == level+1) != want {
				t.Fatalf("leftover order: node %d (rank %d) got %d, level %d; short nodes by rank %v, grants %v",
					i, nodes[i].Rank, got[i], level, short, got)
			}
		}
	})
}

// Properties of one call, for random quotas, wants and holdings.
func TestFairShareProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		quota := rapid.Uint32Range(0, 40).Draw(t, "quota")
		nodes := drawDemands(t, quota)
		g := backpressure.FairShare(quota, nodes, nil)
		if len(g) != len(nodes) {
			t.Fatalf("%d grants for %d nodes", len(g), len(nodes))
		}
		f, floorLevel := fairShares(quota, nodes)
		var held, committed, granted, wanted uint64
		for i, n := range nodes {
			// No grant above the node's fair share (nor its wants, nor q).
			if uint64(g[i]) > f[i] {
				t.Fatalf("node %d: grant %d > fair share %d (quota %d, nodes %+v, grants %v)", i, g[i], f[i], quota, nodes, g)
			}
			held += uint64(n.Has)
			committed += uint64(max(g[i], n.Has))
			granted += uint64(g[i])
			wanted += min(uint64(n.Wants), uint64(quota))
		}
		// Safety: grants plus the excess held above them never exceed the
		// quota; when the holdings alone already do, nobody gets new rows.
		if held <= uint64(quota) && committed > uint64(quota) {
			t.Fatalf("Σ max(grant, has) = %d > quota %d (nodes %+v, grants %v)", committed, quota, nodes, g)
		}
		if held >= uint64(quota) {
			for i, n := range nodes {
				if g[i] > n.Has {
					t.Fatalf("over-committed (held %d ≥ quota %d) but node %d gets %d > has %d", held, quota, i, g[i], n.Has)
				}
			}
		}
		// Work conservation: capacity is left idle only when every node
		// already got its whole max-min fair target: then the grants sum to
		// min(quota, Σ wants), everyone gets at least min(wants, ⌊ℓ⌋), and
		// no node short of its wants sees another more than one row above.
		if committed < uint64(quota) {
			if granted != min(uint64(quota), wanted) {
				t.Fatalf("quota %d not used (committed %d) yet grants sum to %d, want min(quota, Σ wants %d) (nodes %+v, grants %v)", quota, committed, granted, wanted, nodes, g)
			}
			for i, n := range nodes {
				w := min(uint64(n.Wants), uint64(quota))
				if uint64(g[i]) < min(w, floorLevel) {
					t.Fatalf("node %d: grant %d < min(wants %d, level %d)", i, g[i], w, floorLevel)
				}
				if uint64(g[i]) < w {
					for j := range nodes {
						if g[j] > g[i]+1 {
							t.Fatalf("node %d short (%d of %d) while node %d gets %d (nodes %+v, grants %v)", i, g[i], w, j, g[j], nodes, g)
						}
					}
				}
			}
		}
		// Pure and deterministic.
		if again := backpressure.FairShare(quota, nodes, make([]uint32, 3)); !slices.Equal(again, g) {
			t.Fatalf("second call %v != first %v", again, g)
		}
	})
}

// With nothing held, every node gets at least min(wants, ⌊quota/N⌋): the
// equal share is a floor, whatever the others want.
func TestFairShareEqualShareFloor(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		quota := rapid.Uint32Range(0, 1000).Draw(t, "quota")
		n := rapid.IntRange(1, 20).Draw(t, "nodes")
		nodes := make([]nd, n)
		for i := range nodes {
			nodes[i].Wants = rapid.Uint32Range(0, 2000).Draw(t, "wants")
		}
		g := backpressure.FairShare(quota, nodes, nil)
		for i, x := range nodes {
			if floor := min(x.Wants, quota/uint32(n)); g[i] < floor {
				t.Fatalf("node %d: %d < min(wants %d, quota/N %d)", i, g[i], x.Wants, quota/uint32(n))
			}
		}
	})
}

// simNode is one node in the multi-step model below.
type simNode struct {
	demand uint32 // rows it could run at once in this phase
	grant  uint32 // the grant it acts on
	rows   []int  // rounds left for each claimed row
	// The coordinator's record of this node.
	recWants, recHas, recGrant uint32
}

func (n *simNode) holding() uint32 { return max(n.grant, uint32(len(n.rows))) }

// TestFairShareRefreshRounds is the multi-step property of the lease
// protocol built on FairShare, checked over refresh rounds.
//
// Model: one coordinator, N nodes, quota q. Time runs in rounds; in each
// round every node, in a random order, (1) finishes its claimed rows whose
// time is up (a row runs 1..D rounds), (2) claims rows up to
// min(grant, demand) — never more, and nothing it holds is taken back —
// (3) refreshes: it reports wants = min(demand, q) and
// has = max(grant, claimed), the coordinator computes
// FairShare(q, others' (wants, max(recorded grant, recorded has)) and this
// node's (wants, has)) and records the result, and (4) the node applies
// the new grant unless the response is lost. Demand changes in phases; in
// some phases responses get lost.
//
// Safety, after every step: Σ_nodes max(grant, claimed) ≤ q — the rows the
// nodes run or may start never exceed the quota.
//
// Fairness, at every refresh: no grant exceeds the node's fair share of
// the wants the coordinator knows (those last reported).
//
// Liveness ("no node with wants > 0 gets 0 while another holds more than
// its fair share for longer than one refresh"), stated exactly. f_j is
// node j's fair share of the phase's wants. In a phase without lost
// responses, from the phase's round D+3 on, whenever a node with wants > 0
// is granted 0, (a) no other node holds more than its fair share
// (max(grant, claimed) ≤ f_j), and (b) the others hold the whole quota
// between them. The D+3 rounds are: one for every node to report its new
// wants, one for every node to refresh under them (a grant above the fair
// share is cut at that refresh), D for the rows claimed before the cut to
// finish (they are never pre-empted), and one for the freed rows to be
// granted at the waiting nodes' next refresh. So a node is left without
// rows only when the quota is in use by nodes that each hold no more than
// their share: with an integer quota smaller than the number of nodes that
// want rows, someone must wait.
//
// Stability: in such a phase, from round D+4 on, no refresh changes a
// grant (no flapping between nodes).
func TestFairShareRefreshRounds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		quota := rapid.Uint32Range(0, 12).Draw(t, "quota")
		nodes := make([]simNode, rapid.IntRange(1, 6).Draw(t, "nodes"))
		maxRun := rapid.IntRange(1, 3).Draw(t, "maxRowRounds")
		phases := rapid.IntRange(1, 4).Draw(t, "phases")
		var demands []nd
		var grants []uint32
		for phase := range phases {
			lossy := rapid.Bool().Draw(t, fmt.Sprintf("phase%dLossy", phase))
			for i := range nodes {
				nodes[i].demand = rapid.Uint32Range(0, quota+2).Draw(t, "demand")
			}
			wants := make([]nd, len(nodes))
			for i := range nodes {
				wants[i].Wants = min(nodes[i].demand, quota)
			}
			fair, _ := fairShares(quota, wants)
			rounds := maxRun + 4 + rapid.IntRange(1, 6).Draw(t, "extraRounds")
			for round := range rounds {
				order := rapid.Permutation(indexes(len(nodes))).Draw(t, "order")
				for _, i := range order {
					n := &nodes[i]
					// (1) rows whose time is up finish.
					n.rows = slices.DeleteFunc(n.rows, func(left int) bool { return left <= 1 })
					for k := range n.rows {
						n.rows[k]--
					}
					// (2) claim up to min(grant, demand).
					for uint32(len(n.rows)) < min(n.grant, n.demand) {
						n.rows = append(n.rows, rapid.IntRange(1, maxRun).Draw(t, "rowRounds"))
					}
					// (3) refresh.
					w, has := min(n.demand, quota), n.holding()
					demands = demands[:0]
					for j := range nodes {
						if j == i {
							demands = append(demands, nd{Wants: w, Has: has})
						} else {
							demands = append(demands, nd{Wants: nodes[j].recWants, Has: max(nodes[j].recGrant, nodes[j].recHas)})
						}
					}
					grants = backpressure.FairShare(quota, demands, grants)
					g := grants[i]
					n.recWants, n.recHas, n.recGrant = w, has, g
					// The coordinator knows only the wants nodes reported, so
					// the bound at a refresh is the fair share of those.
					if known, _ := fairShares(quota, demands); uint64(g) > known[i] {
						t.Fatalf("phase %d round %d: node %d granted %d > fair share %d of %+v", phase, round, i, g, known[i], demands)
					}
					// Stability: once settled, a refresh confirms the grant.
					if !lossy && round >= maxRun+4 && g != n.grant {
						t.Fatalf("phase %d round %d: node %d's grant moves from %d to %d after the phase settled", phase, round, i, n.grant, g)
					}
					// (4) apply, unless the response is lost.
					if !lossy || !rapid.Bool().Draw(t, "lost") {
						n.grant = g
					}
					var total uint32
					for j := range nodes {
						total += nodes[j].holding()
					}
					if total > quota {
						t.Fatalf("phase %d round %d after node %d: nodes hold %d > quota %d", phase, round, i, total, quota)
					}
					if lossy || round < maxRun+3 || w == 0 || g > 0 {
						continue
					}
					var others uint32
					for j := range nodes {
						if j == i {
							continue
						}
						h := nodes[j].holding()
						others += h
						if uint64(h) > fair[j] {
							t.Fatalf("phase %d round %d: node %d (wants %d) gets 0 while node %d holds %d > its fair share %d",
								phase, round, i, w, j, h, fair[j])
						}
					}
					if others < quota {
						t.Fatalf("phase %d round %d: node %d (wants %d) gets 0 while the others hold only %d of %d",
							phase, round, i, w, others, quota)
					}
				}
			}
		}
	})
}

func indexes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// BenchmarkFairShare measures one FairShare over N nodes, the coordinator's
// work per namespace per refresh. Quota 1,000 rows; every node wants
// between 0 and 400 and holds between 0 and 2,000/N, so both steps run
// (the water level, the rows left over and the fit into what is held).
func BenchmarkFairShare(b *testing.B) {
	for _, n := range []int{5, 50, 500} {
		b.Run(fmt.Sprintf("nodes=%d", n), func(b *testing.B) {
			const quota = 1000
			nodes := make([]nd, n)
			seed := uint32(1)
			next := func(bound uint32) uint32 { // xorshift: fixed, cheap inputs
				seed ^= seed << 13
				seed ^= seed >> 17
				seed ^= seed << 5
				return seed % bound
			}
			for i := range nodes {
				nodes[i] = nd{Wants: next(401), Has: next(uint32(2000/n) + 1)}
			}
			var held uint64
			for _, x := range nodes {
				held += uint64(x.Has)
			}
			grants := make([]uint32, 0, n)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				grants = backpressure.FairShare(quota, nodes, grants)
			}
			b.StopTimer()
			var committed uint64
			for i, g := range grants {
				committed += uint64(max(g, nodes[i].Has))
			}
			if held <= quota && committed > quota {
				b.Fatalf("committed %d > quota %d", committed, quota)
			}
		})
	}
}
