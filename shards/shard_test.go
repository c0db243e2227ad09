package shards

import (
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
)

// goldenShards pins ShardOf under shard counts 1, 64, 1024 and 4096. If this
// test fails, an upgrade has changed the shard function and would silently
// move every stored row to another shard: do not "fix" the vectors.
var goldenShards = []struct {
	key  string
	want [4]uint32 // shard counts 1, 64, 1024, 4096
}{
	{"", [4]uint32{0, 25, 409, 2457}},
	{"a", [4]uint32{0, 27, 603, 3675}},
	{"b", [4]uint32{0, 27, 923, 3995}},
	{"wf-1:0", [4]uint32{0, 47, 431, 1455}},
	{"wf-1:1", [4]uint32{0, 20, 404, 1428}},
	{"order-42:7", [4]uint32{0, 59, 763, 1787}},
	{"tenant/acme:invoice:9001", [4]uint32{0, 21, 981, 4053}},
	{"ÄÖÜ", [4]uint32{0, 21, 661, 3733}},
	{"日本語のキー", [4]uint32{0, 53, 885, 885}},
	{"emoji-🚀", [4]uint32{0, 60, 572, 572}},
	{" ", [4]uint32{0, 13, 909, 909}},
	{"\x00", [4]uint32{0, 40, 872, 1896}},
	{"dispatch_key", [4]uint32{0, 21, 981, 981}},
	{"00000000-0000-0000-0000-000000000000:0", [4]uint32{0, 62, 958, 958}},
	{"1", [4]uint32{0, 20, 212, 1236}},
	{"12345678901234567890", [4]uint32{0, 34, 546, 1570}},
	{strings.Repeat("x", 4096), [4]uint32{0, 15, 591, 591}},
	{strings.Repeat("αβγ", 1000), [4]uint32{0, 41, 297, 297}},
	{"Key-With-MixedCase", [4]uint32{0, 19, 275, 3347}},
	{"trailing-space ", [4]uint32{0, 60, 316, 1340}},
}

func TestShardOfGoldenVectors(t *testing.T) {
	counts := [4]uint32{1, 64, 1024, 4096}
	for _, g := range goldenShards {
		for i, n := range counts {
			if got := ShardOf(g.key, n); got != g.want[i] {
				name := g.key
				if len(name) > 24 {
					name = name[:24] + "…"
				}
				t.Errorf("ShardOf(%q, %d) = %d, want %d", name, n, got, g.want[i])
			}
		}
	}
}

// TestShardOfIsXXH64Seed0 ties the vectors above to the published XXH64
// reference values, so they are not merely self-consistent.
func TestShardOfIsXXH64Seed0(t *testing.T) {
	for key, want := range map[string]uint64{
		"":  0xef46db3751d8e999, // XXH64 spec test vector, seed 0
		"a": 0xd24ec4f1a98c6e5b,
	} {
		if got := xxhash.Sum64String(key); got != want {
			t.Fatalf("xxhash.Sum64String(%q) = %#x, want %#x", key, got, want)
		}
		if got := ShardOf(key, 4096); uint64(got) != want%4096 {
			t.Fatalf("ShardOf(%q, 4096) = %d, want %d", key, got, want%4096)
		}
	}
}

func TestShardOfZeroShardCount(t *testing.T) {
	if got := ShardOf("anything", 0); got != 0 {
		t.Fatalf("ShardOf with shardCount 0 = %d, want 0", got)
	}
}

func FuzzShardOfInRange(f *testing.F) {
	f.Add("wf:1", uint32(1024))
	f.Fuzz(func(t *testing.T, key string, n uint32) {
		got := ShardOf(key, n)
		if n > 0 && got >= n {
			t.Fatalf("ShardOf(%q, %d) = %d out of range", key, n, got)
		}
	})
}
