package lease_test

import (
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/fairshard/fairshard/lease"
	"github.com/fairshard/fairshard/node"
)

// The wire's namespace rule is the public API's, byte for byte: a
// namespace the API accepts can always be leased, and nothing else can.
func TestValidNamespaceIsThePublicAPIRule(t *testing.T) {
	alphabet := []rune("azAZ09._-/ :\x00\x7fé∑")
	rapid.Check(t, func(t *rapid.T) {
		var s string
		if rapid.Bool().Draw(t, "anyString") {
			s = rapid.String().Draw(t, "s")
		} else {
			s = rapid.StringOfN(rapid.SampledFrom(alphabet), 0, 70, -1).Draw(t, "s")
		}
		if got, want := lease.ValidNamespace(s), node.ValidName(s); got != want {
			t.Fatalf("ValidNamespace(%q) = %v, node.ValidName = %v", s, got, want)
		}
	})
	for _, s := range []string{"", "a", strings.Repeat("a", 64), strings.Repeat("a", 65), "a.b-c_D9", "a/b", "a b", "nämespace"} {
		if got, want := lease.ValidNamespace(s), node.ValidName(s); got != want {
			t.Errorf("ValidNamespace(%q) = %v, node.ValidName = %v", s, got, want)
		}
	}
}

func TestValidNodeName(t *testing.T) {
	for s, want := range map[string]bool{
		"node-1":                 true,
		"ip-10-0-0-1.ec2":        true,
		"nœud":                   true,
		strings.Repeat("n", 128): true,
		"":                       false,
		strings.Repeat("n", 129): false,
		"node\n1":                false,
		"node\x00":               false,
		"bad\xffutf8":            false,
	} {
		if got := lease.ValidNodeName(s); got != want {
			t.Errorf("ValidNodeName(%q) = %v, want %v", s, got, want)
		}
	}
}

func TestCoordinatorShardIsTheRowShardFunction(t *testing.T) {
	primary := func(shard uint32) (string, bool) {
		if shard == 3 {
			return "", false
		}
		return "node-" + string(rune('a'+shard%26)), true
	}
	for _, ns := range []string{"a", "tenant-1", "small", "big.co"} {
		for _, s := range []uint32{0, 1, 7, 1024} {
			// The shard function is pinned by golden vectors in shards;
			// here it must be the same function on the namespace.
			if got, want := lease.CoordinatorShard(ns, s), shardOf(ns, s); got != want {
				t.Fatalf("CoordinatorShard(%q, %d) = %d, want %d", ns, s, got, want)
			}
			node, ok := lease.CoordinatorOf(ns, s, primary)
			wantNode, wantOK := primary(shardOf(ns, s))
			if node != wantNode || ok != wantOK {
				t.Fatalf("CoordinatorOf(%q, %d) = %q %v, want %q %v", ns, s, node, ok, wantNode, wantOK)
			}
		}
	}
}
