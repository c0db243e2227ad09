package replication

import (
	"slices"
	"testing"
)

// urgentFirst puts first the shards with fewer than R copies elsewhere: a
// shard whose other member died (one synced copy left) before one this
// node joined on a rebalance (its old member still holds a leftover copy)
// or that is fully copied already.
func TestUrgentFirst(t *testing.T) {
	v := &View{Self: "me", Factor: 2, Addrs: map[string]string{"me": "m", "p": "p", "old": "o"}}
	states := map[string]StatesReply{
		"p": {Node: "p", Joined: true, States: []ShardState{
			{Shard: 1, Replica: true, Synced: true, Rows: 5},
			{Shard: 2, Replica: true, Synced: true, Rows: 5},
			{Shard: 3, Replica: true, Synced: false, Rows: 5},
			{Shard: 4, Replica: true, Synced: true, Rows: 5},
		}},
		"old": {Node: "old", Joined: true, States: []ShardState{
			{Shard: 2, Rows: 5}, // a leftover copy: a rebalance
			{Shard: 4, Replica: true, Synced: true, Rows: 5}, // two copies already
		}},
	}
	got := urgentFirst(v, []uint32{4, 2, 1, 3}, states)
	// 1: one copy (p); 3: none synced; 2 and 4: two copies elsewhere.
	if want := []uint32{1, 3, 4, 2}; !slices.Equal(got, want) {
		t.Fatalf("urgentFirst = %v, want %v (under-replicated first, order kept)", got, want)
	}
}
