package shards

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"pgregory.net/rapid"
)

// TestAssignGolden pins the ownership function. Every node of a cluster must
// compute the same table, so a change here is a breaking change for
// mixed-version clusters: update these vectors only with a migration plan.
func TestAssignGolden(t *testing.T) {
	t.Run("three members, 12 shards", func(t *testing.T) {
		tab := Assign([]string{"node-c", "node-a", "node-b"}, 12)
		want := []string{"node-c", "node-b", "node-a", "node-c", "node-a", "node-a",
			"node-b", "node-a", "node-c", "node-b", "node-c", "node-b"}
		for s, w := range want {
			if got := tab.Owner(uint32(s)); got != w {
				t.Errorf("Owner(%d) = %q, want %q", s, got, w)
			}
		}
	})
	t.Run("five members, 1024 shards", func(t *testing.T) {
		tab := Assign([]string{"fs-1", "fs-2", "fs-3", "fs-4", "fs-5"}, 1024)
		var b strings.Builder
		for s := range uint32(1024) {
			b.WriteString(tab.Owner(s))
			b.WriteByte('\n')
		}
		if got, want := xxhash.Sum64String(b.String()), uint64(0xbb2e0208ba032c32); got != want {
			t.Errorf("digest of owners = %#x, want %#x", got, want)
		}
		wantCounts := map[string]int{"fs-1": 204, "fs-2": 205, "fs-3": 205, "fs-4": 205, "fs-5": 205}
		for m, w := range wantCounts {
			if got := tab.OwnedCount(m); got != w {
				t.Errorf("OwnedCount(%q) = %d, want %d", m, got, w)
			}
		}
		if got, want := tab.Owned("fs-5")[:5], []uint32{13, 19, 25, 29, 43}; !slices.Equal(got, want) {
			t.Errorf(`Owned("fs-5")[:5] = %v, want %v`, got, want)
		}
	})
}

func TestAssignEdgeCases(t *testing.T) {
	tests := []struct {
		name       string
		members    []string
		shardCount uint32
		wantShards uint32
		wantOwners map[string]int // member → owned count
	}{
		{name: "no members", members: nil, shardCount: 8, wantShards: 8, wantOwners: map[string]int{}},
		{name: "only empty names", members: []string{"", ""}, shardCount: 8, wantShards: 8, wantOwners: map[string]int{}},
		{name: "one member owns all", members: []string{"a"}, shardCount: 8, wantShards: 8, wantOwners: map[string]int{"a": 8}},
		{name: "duplicates count once", members: []string{"a", "b", "a", "", "b"}, shardCount: 8, wantShards: 8, wantOwners: map[string]int{"a": 4, "b": 4}},
		{name: "zero shard count is one shard", members: []string{"a", "b"}, shardCount: 0, wantShards: 1},
		{name: "more members than shards", members: []string{"a", "b", "c", "d", "e"}, shardCount: 3, wantShards: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tab := Assign(tc.members, tc.shardCount)
			if got := tab.ShardCount(); got != tc.wantShards {
				t.Fatalf("ShardCount() = %d, want %d", got, tc.wantShards)
			}
			for m, w := range tc.wantOwners {
				if got := tab.OwnedCount(m); got != w {
					t.Errorf("OwnedCount(%q) = %d, want %d", m, got, w)
				}
			}
			checkTable(t, tab)
			if tab.Len() == 0 {
				for s := range tab.ShardCount() {
					if o := tab.Owner(s); o != "" {
						t.Errorf("Owner(%d) = %q on an empty table, want \"\"", s, o)
					}
				}
			}
			if o := tab.Owner(tab.ShardCount()); o != "" {
				t.Errorf("Owner(out of range) = %q, want \"\"", o)
			}
			if got := tab.Owned("absent"); got != nil {
				t.Errorf("Owned(absent) = %v, want nil", got)
			}
			if f := tab.Fraction("absent"); f.Owned() != 1 || f.Total() != tab.ShardCount() {
				t.Errorf("Fraction(absent) = %d/%d, want the clamp 1/%d", f.Owned(), f.Total(), tab.ShardCount())
			}
		})
	}
}

func TestTableCopiesAreTheCallers(t *testing.T) {
	tab := Assign([]string{"a", "b", "c"}, 64)
	owned := tab.Owned("a")
	owned[0] = 999
	members := tab.Members()
	members[0] = "zzz"
	if tab.Owned("a")[0] == 999 || tab.Members()[0] == "zzz" {
		t.Fatal("mutating a returned slice changed the table")
	}
}

// checkTable asserts the table's internal consistency and its balance bound:
// Owner and Owned agree, every shard is owned once, and every member owns
// floor(S/N) or ceil(S/N) shards.
// tb is what checkTable needs of *testing.T and *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

func checkTable(t tb, tab *Table) {
	t.Helper()
	members := tab.Members()
	if !slices.IsSorted(members) || len(slices.Compact(slices.Clone(members))) != len(members) {
		t.Fatalf("Members() = %v, want sorted and unique", members)
	}
	if len(members) == 0 {
		return
	}
	s, n := int(tab.ShardCount()), len(members)
	lo, hi := s/n, (s+n-1)/n
	seen := make([]bool, s)
	total := 0
	for _, m := range members {
		owned := tab.Owned(m)
		if len(owned) < lo || len(owned) > hi {
			t.Fatalf("member %q owns %d shards, want %d..%d (S=%d, N=%d)", m, len(owned), lo, hi, s, n)
		}
		if !slices.IsSorted(owned) {
			t.Fatalf("Owned(%q) not ascending", m)
		}
		for _, sh := range owned {
			if seen[sh] {
				t.Fatalf("shard %d owned twice", sh)
			}
			seen[sh] = true
			if o := tab.Owner(sh); o != m {
				t.Fatalf("Owner(%d) = %q but Owned(%q) lists it", sh, o, m)
			}
		}
		total += len(owned)
	}
	if total != s {
		t.Fatalf("members own %d shards in total, want %d", total, s)
	}
}

// memberName draws node names shaped like real ones plus arbitrary strings.
func memberName() *rapid.Generator[string] {
	return rapid.OneOf(
		rapid.StringMatching(`[a-z][a-z0-9-]{0,20}`),
		rapid.StringMatching(`node-[0-9]{1,4}`),
		rapid.StringN(1, 40, -1),
	)
}

func TestAssignProperties(t *testing.T) {
	t.Run("deterministic over the member set", rapid.MakeCheck(func(t *rapid.T) {
		names := rapid.SliceOfN(memberName(), 1, 40).Draw(t, "names")
		shards := rapid.Uint32Range(1, 2048).Draw(t, "shards")
		shuffled := rapid.Permutation(names).Draw(t, "shuffled")
		dup := rapid.SampledFrom(names).Draw(t, "dup")
		a := Assign(names, shards)
		b := Assign(append(shuffled, dup, ""), shards)
		if !a.Equal(b) {
			t.Fatalf("same set in another order (with a duplicate and an empty name) gave another table: %d shards differ", len(a.Diff(b)))
		}
	}))

	// The balance bound: with S = 1024 and 1..64 members no member
	// owns more than ceil(S/N) (and, stronger, none fewer than floor(S/N)).
	t.Run("balanced for 1 to 64 members at 1024 shards", rapid.MakeCheck(func(t *rapid.T) {
		names := rapid.SliceOfNDistinct(memberName(), 1, 64, rapid.ID[string]).Draw(t, "names")
		checkTable(t, Assign(names, 1024))
	}))

	t.Run("balanced for any shard count", rapid.MakeCheck(func(t *rapid.T) {
		names := rapid.SliceOfNDistinct(memberName(), 1, 100, rapid.ID[string]).Draw(t, "names")
		checkTable(t, Assign(names, rapid.Uint32Range(1, 5000).Draw(t, "shards")))
	}))

	// Movement. ideal = S/(N+1) on a join and the leaver's shards on a leave.
	// Measured (docs/BENCHMARKS.md): moved ≤ ideal + c·sqrt(S) with c at most
	// 1.5 in 3000 random trials, whatever N; the test allows c = 2. A
	// movement bound of 1.25 × ideal therefore holds only for small clusters;
	// it is asserted where the measurement says it holds with margin.
	for _, tc := range []struct {
		shards   uint32
		maxN     int // before the join
		tightMax int // the 1.25 × ideal bound is asserted for N ≤ tightMax
	}{
		{shards: 1024, maxN: 64, tightMax: 4},
		{shards: 4096, maxN: 32, tightMax: 9},
	} {
		t.Run(fmt.Sprintf("movement on one join or leave at %d shards", tc.shards), rapid.MakeCheck(func(t *rapid.T) {
			names := rapid.SliceOfNDistinct(memberName(), 2, tc.maxN+1, rapid.ID[string]).Draw(t, "names")
			n := len(names) - 1
			joiner := names[n]
			before := Assign(names[:n], tc.shards)
			after := Assign(names, tc.shards)
			s := float64(tc.shards)
			moved := after.Diff(before)
			ideal := s / float64(n+1)
			checkMovement(t, "join", n, len(moved), ideal, s, n <= tc.tightMax)
			for _, sh := range after.Owned(joiner) {
				if _, ok := slices.BinarySearch(moved, sh); !ok {
					t.Fatalf("joiner owns shard %d but it is not counted as moved", sh)
				}
			}

			leaver := rapid.SampledFrom(names).Draw(t, "leaver")
			rest := slices.DeleteFunc(slices.Clone(names), func(m string) bool { return m == leaver })
			left := Assign(rest, tc.shards)
			movedLeave := after.Diff(left)
			checkMovement(t, "leave", n+1, len(movedLeave), float64(after.OwnedCount(leaver)), s, n <= tc.tightMax)
		}))
	}
}

func checkMovement(t *rapid.T, what string, n, moved int, ideal, shards float64, tight bool) {
	if limit := ideal + 2*math.Sqrt(shards); float64(moved) > limit {
		t.Fatalf("%s with %d members at S=%v moved %d shards, want ≤ ideal %.1f + 2·sqrt(S) = %.1f", what, n, shards, moved, ideal, limit)
	}
	if tight && float64(moved) > 1.25*ideal {
		t.Fatalf("%s with %d members at S=%v moved %d shards, want ≤ 1.25 × ideal %.1f = %.1f", what, n, shards, moved, ideal, 1.25*ideal)
	}
}

// TestAssignIsTheGreedyStableAssignment checks the documented definition
// against a brute-force reference: sort every (shard, member) pair by score
// and give each to the best pair whose shard is free and member below quota.
func TestAssignIsTheGreedyStableAssignment(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		names := rapid.SliceOfNDistinct(memberName(), 1, 12, rapid.ID[string]).Draw(t, "names")
		shards := rapid.Uint32Range(1, 300).Draw(t, "shards")
		got := Assign(names, shards)
		want := greedyReference(names, shards)
		for s := range shards {
			if got.Owner(s) != want[s] {
				t.Fatalf("Owner(%d) = %q, reference says %q", s, got.Owner(s), want[s])
			}
		}
	})
}

func greedyReference(members []string, shardCount uint32) []string {
	names := uniqueNames(members)
	keys := make([]uint64, len(names))
	for i, n := range names {
		keys[i] = xxhash.Sum64String(n)
	}
	quota := quotas(keys, shardCount)
	type pair struct {
		score uint64
		node  int
		shard uint32
	}
	var pairs []pair
	for s := range shardCount {
		k := fmix64(uint64(s) + shardSalt)
		for i, nk := range keys {
			pairs = append(pairs, pair{fmix64(nk ^ k), i, s})
		}
	}
	sort.Slice(pairs, func(a, b int) bool {
		if pairs[a].score != pairs[b].score {
			return pairs[a].score > pairs[b].score
		}
		if pairs[a].node != pairs[b].node {
			return pairs[a].node < pairs[b].node
		}
		return pairs[a].shard < pairs[b].shard
	})
	owner := make([]string, shardCount)
	for _, p := range pairs {
		if owner[p.shard] == "" && quota[p.node] > 0 {
			owner[p.shard] = names[p.node]
			quota[p.node]--
		}
	}
	return owner
}

// BenchmarkAssignMovementSurvey prints the movement figures recorded in
// docs/BENCHMARKS.md (a measurement, so a benchmark: go test -run '^$'
// -bench MovementSurvey -benchtime 1x -v ./shards) and reports the worst
// movement ratio it saw. Under -short it runs 5 trials instead of 300.
func BenchmarkAssignMovementSurvey(b *testing.B) {
	t := b
	trials := 300
	if testing.Short() {
		trials = 5
	}
	worst := 0.0
	defer func() { b.ReportMetric(worst, "worst-moved/ideal") }()
	for _, shards := range []uint32{1024, 4096} {
		for _, n := range []int{2, 3, 4, 5, 8, 16, 32, 64, 100} {
			var ratios, extras []float64
			for k := range trials {
				names := make([]string, n+1)
				for i := range names {
					names[i] = fmt.Sprintf("node-%d-%d", k, i)
				}
				before, after := Assign(names[:n], shards), Assign(names, shards)
				ideal := float64(shards) / float64(n+1)
				moved := float64(len(before.Diff(after)))
				ratios = append(ratios, moved/ideal)
				extras = append(extras, (moved-ideal)/math.Sqrt(float64(shards)))
				leaver := names[k%(n+1)]
				left := Assign(slices.Delete(slices.Clone(names), k%(n+1), k%(n+1)+1), shards)
				owned := float64(after.OwnedCount(leaver))
				movedL := float64(len(after.Diff(left)))
				ratios = append(ratios, movedL/owned)
				extras = append(extras, (movedL-owned)/math.Sqrt(float64(shards)))
			}
			slices.Sort(ratios)
			slices.Sort(extras)
			pct := func(v []float64, p float64) float64 { return v[int(p*float64(len(v)-1))] }
			t.Logf("| %d | %d→%d | %.2f | %.2f | %.2f | %.2f |", shards, n, n+1,
				pct(ratios, 0.5), pct(ratios, 0.99), ratios[len(ratios)-1], extras[len(extras)-1])
			worst = max(worst, ratios[len(ratios)-1])
		}
	}
}

func BenchmarkAssign(b *testing.B) {
	for _, shards := range []uint32{1024, 4096} {
		for _, n := range []int{3, 16, 100} {
			names := make([]string, n)
			for i := range names {
				names[i] = fmt.Sprintf("fairshard-node-%d.example.internal", i)
			}
			b.Run(fmt.Sprintf("N=%d/S=%d", n, shards), func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					Assign(names, shards)
				}
			})
		}
	}
}
