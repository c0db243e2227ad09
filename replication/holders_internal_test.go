package replication

import (
	"fmt"
	"maps"
	"slices"
	"testing"
	"time"
)

// The leftover holder marks: a member a view change takes out of a
// shard's set is marked (unless it turned leaving), a member back in the
// set is not, a "holds none" answer clears only a mark made before its
// question, and a shard keeps maxLeftoverHolders marks at most, the one
// confirmed longest ago given up first.
func TestLeftoverHolderMarks(t *testing.T) {
	s := &shipper{holders: map[uint32]map[string]time.Time{}}
	addrs := map[string]string{"me": "m", "b": "b", "c": "c", "d": "d"}
	prev := &View{Self: "me", ShardCount: 3, Sets: [][]string{{"me", "b"}, {"me", "d"}, {"b", "d"}}, Addrs: addrs}
	// c joins: shard 0 moves from [me b] to [me c], b stays in shard 2's
	// set; d turns leaving (in no set, still live), so shard 1 moves to
	// [me c] too.
	v := &View{Self: "me", ShardCount: 3, Sets: [][]string{{"me", "c"}, {"me", "c"}, {"b", "c"}}, Addrs: addrs}
	s.active = activeMembers(v)
	t0 := time.Now()
	s.retargetHoldersLocked(prev, v, t0)
	if got := slices.Sorted(maps.Keys(s.holders[0])); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("holders of shard 0 after the join: %v, want [b]", got)
	}
	for _, sh := range []uint32{1, 2} {
		if len(s.holders[sh]) != 0 {
			t.Fatalf("holders of shard %d: %v, want none (d is leaving: its drain hands its copy over)", sh, s.holders[sh])
		}
	}
	// A "holds none" answer to a question sent before the mark was made
	// (or last confirmed) does not clear it; one sent after does.
	s.releasedLocked(0, "b", t0.Add(-time.Second))
	if _, ok := s.holders[0]["b"]; !ok {
		t.Fatal("a stale answer cleared b's mark")
	}
	s.releasedLocked(0, "b", t0.Add(time.Second))
	if len(s.holders) != 0 {
		t.Fatalf("holders after b answered holding none: %v, want none", s.holders)
	}
	// Back in the set: a replica again, no mark.
	s.holdLocked(0, "b", t0)
	back := &View{Self: "me", ShardCount: 3, Sets: [][]string{{"me", "b"}, {"me", "c"}, {"b", "c"}}, Addrs: addrs}
	s.active = activeMembers(back)
	s.retargetHoldersLocked(v, back, t0.Add(time.Second))
	if _, ok := s.holders[0]["b"]; ok {
		t.Fatal("b still marked a leftover holder of shard 0 once back in its set")
	}
	// Bounded per shard: the mark confirmed longest ago goes first.
	for i := range maxLeftoverHolders + 2 {
		s.holdLocked(1, fmt.Sprintf("m%d", i), t0.Add(time.Duration(i)*time.Millisecond))
	}
	if n := len(s.holders[1]); n != maxLeftoverHolders {
		t.Fatalf("%d marks on shard 1, want %d at most", n, maxLeftoverHolders)
	}
	for _, gone := range []string{"m0", "m1"} {
		if _, ok := s.holders[1][gone]; ok {
			t.Fatalf("%s, confirmed longest ago, was kept over newer marks", gone)
		}
	}
	// Unconfirmed for lostMarkTTL: forgotten.
	s.retargetHoldersLocked(back, back, t0.Add(lostMarkTTL+time.Minute))
	if len(s.holders) != 0 {
		t.Fatalf("holders past lostMarkTTL: %v, want none", s.holders)
	}
}
