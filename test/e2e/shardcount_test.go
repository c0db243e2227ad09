package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/loadgen"
)

// Scenario 7: a node started with another --shards value and pointed at the
// cluster is refused. It never becomes a member of the others' view (their
// ownership_version and member sets do not change), the members count and
// log the refusal, the refused node exits 1 saying its --shards differs
// (it must not serve a cluster of its own), and the cluster keeps
// delivering.
func TestShardCountMismatchRefused(t *testing.T) {
	c := newCluster(t, clusterOpts{Shards: 256})
	for i := range 3 {
		c.startNode(fmt.Sprintf("sc-%d", i))
	}
	c.waitConverged(20 * time.Second)
	before := map[string]clusterView{}
	for _, p := range c.members() {
		v, err := c.clusterView(p)
		if err != nil {
			t.Fatal(err)
		}
		before[p.name] = v
	}

	odd := c.startNode("sc-odd", expectRefusal(), withFlags("--shards", "512"))
	// A refused node must not serve a cluster of its own: it exits non-zero
	// and says why.
	if code := odd.exitStatus(); code != 1 {
		t.Errorf("sc-odd exited with %d; want 1", code)
	}
	if log := tailFile(odd.logPath, 40); !strings.Contains(log, "--shards 512 differs") {
		t.Errorf("sc-odd's last words do not say its --shards differs:\n%s", log)
	}
	eventually(t, 10*time.Second, "every member refuses sc-odd", func() (bool, string) {
		for _, p := range c.members() {
			n, err := c.metric(p, "fairshard_cluster_refused_members_total", map[string]string{"reason": "shard_count"})
			if err != nil {
				return false, err.Error()
			}
			if n == 0 {
				return false, p.name + " has not refused anyone yet"
			}
		}
		return true, ""
	})
	// It keeps re-joining its seeds; the refusal must hold, not just once.
	unchanged := func() (bool, string) {
		for _, p := range c.members() {
			v, err := c.clusterView(p)
			if err != nil {
				return false, err.Error()
			}
			b := before[p.name]
			if v.OwnershipVersion != b.OwnershipVersion || v.memberSet() != b.memberSet() {
				return false, fmt.Sprintf("%s: ownership_version %d → %d, members %s → %s",
					p.name, b.OwnershipVersion, v.OwnershipVersion, b.memberSet(), v.memberSet())
			}
		}
		return true, ""
	}
	consistently(t, 2*time.Second, "the cluster's view without sc-odd", unchanged)
	if !strings.Contains(tailFile(odd.logPath, 200), "shard_count") {
		t.Errorf("sc-odd's log does not say why it was refused (shard_count):\n%s", tailFile(odd.logPath, 20))
	}

	// The cluster still delivers, exactly once.
	l := newLedger()
	recv := c.receiver()
	rep := runLoad(t, c.generator(l, loadgen.Config{Rows: 2_000, BatchSize: 100, KeyPrefix: "sc-",
		Namespaces: []loadgen.Namespace{{Name: "sc", Weight: 1}}}))
	if rep.Appended != 2_000 || rep.GaveUp != 0 {
		t.Fatalf("appended %d of 2000 (%d given up)", rep.Appended, rep.GaveUp)
	}
	c.waitDelivered(l, recv, 30*time.Second)
	if dups := checkNoStrays(t, l, recv); len(dups) != 0 || recv.Distinct() != 2_000 {
		t.Errorf("target saw %d distinct keys, %d duplicated; want 2000 exactly once", recv.Distinct(), len(dups))
	}
	if ok, why := unchanged(); !ok {
		t.Error(why)
	}
}
