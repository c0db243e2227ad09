//go:build linux

package chaos

import (
	"os"
	"slices"
	"testing"
	"time"
)

// TestReplicationPartition: 3 nodes (R = 2,
// write-copies 2), the load appending through every node; one node is cut
// from the other two for 60 s by nftables rules in the nodes' network
// namespaces, then healed. The run's checkers apply as in TestChaos:
// every acknowledged row is delivered, every repeat delivery is explained
// (here: by the partition, each side delivering what it holds), and after
// the drain every shard's replicas agree (replicas-agree). The isolated
// node refuses appends with 503 (it cannot meet write-copies); the load
// retries them on the other side. The figures (duplicates by cause,
// append failures by kind) are logged. A long scenario: it runs where
// FAIRSHARD_LONG=1 (make test-long), about 2.5 minutes.
func TestReplicationPartition(t *testing.T) {
	if testing.Short() || os.Getenv("FAIRSHARD_LONG") != "1" {
		t.Skip("a long scenario: runs with FAIRSHARD_LONG=1 (make test-long)")
	}
	if why := labPrerequisites(); why != "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("partition: %s; CI must provide it", why)
		}
		t.Skipf("partition: %s", why)
	}
	const hold = 60 * time.Second
	members := []string{"n1", "n2", "n3"}
	step := planStep{Lane: laneNetwork, Kind: faultIsolate, Gap: 3 * time.Second, Hold: hold}
	for step.Pick = 1; ; step.Pick++ { // the pick that isolates n3
		if a, _ := resolveNetwork(step, members); slices.Equal(a, []string{"n3"}) {
			break
		}
	}
	rs := runSettings{Duration: step.Gap + hold + time.Second, Seed: 14, Nodes: 3, Rate: 1}
	p := plan{Seed: rs.Seed, Opts: planOpts{Duration: rs.Duration, Nodes: 3, MinNodes: 3, MaxNodes: 3},
		Initial: members, Witness: "n1", Network: []planStep{step}}
	t.Logf("partition: %s", p)
	r := newRun(t, rs, p)
	r.execute()
	r.report()
}
