package e2e

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/internal/testnode"
	"github.com/fairshard/fairshard/loadgen"
)

// Scenario 7: a node started with another --shards value and pointed at the
// cluster is refused. It never becomes a member of the others' view (no
// member lists it, and no member's log records an ownership snapshot with
// more than the three members, so it never owned a shard even briefly
// between two polls; a suspicion among the three on a loaded machine may
// bump their ownership_version, which is not sc-odd's doing, so the
// version is not compared), the members count and log the refusal, the refused node exits 1 saying its --shards differs
// (it must not serve a cluster of its own), and the cluster keeps
// delivering.
func TestShardCountMismatchRefused(t *testing.T) {
	c := newCluster(t, clusterOpts{Shards: 256})
	for i := range 3 {
		c.startNode(fmt.Sprintf("sc-%d", i))
	}
	c.waitConverged(20 * time.Second)
	before := c.clusterViews()

	odd := c.startNode("sc-odd", expectRefusal(), withFlags("--shards", "512"))
	// A refused node must not serve a cluster of its own: it exits non-zero
	// and says why.
	if code := odd.exitStatus(); code != 1 {
		t.Errorf("sc-odd exited with %d; want 1", code)
	}
	if log := testnode.TailFile(odd.logPath, 40); !strings.Contains(log, "--shards 512 differs") {
		t.Errorf("sc-odd's last words do not say its --shards differs:\n%s", log)
	}
	poll.Eventually(t, deadline(10*time.Second), "every member refuses sc-odd", func() (bool, string) {
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
			for _, m := range v.Members {
				if m.Name == "sc-odd" {
					return false, fmt.Sprintf("%s lists sc-odd as a member: %s", p.name, memberSet(v))
				}
			}
			if most := mostSnapshotMembers(p.logPath); most > 3 {
				return false, fmt.Sprintf("%s applied an ownership snapshot of %d members", p.name, most)
			}
		}
		return true, ""
	}
	poll.Consistently(t, 2*time.Second, "the cluster's view without sc-odd", unchanged)
	if !strings.Contains(testnode.TailFile(odd.logPath, 200), "shard_count") {
		t.Errorf("sc-odd's log does not say why it was refused (shard_count):\n%s", testnode.TailFile(odd.logPath, 20))
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
	// A suspicion among the three heals: each view is the one before.
	poll.Eventually(t, deadline(20*time.Second), "every member's view is the three before sc-odd", func() (bool, string) {
		for _, p := range c.members() {
			v, err := c.clusterView(p)
			if err != nil {
				return false, err.Error()
			}
			if memberSet(v) != memberSet(before[p.name]) {
				return false, fmt.Sprintf("%s: members %s, was %s", p.name, memberSet(v), memberSet(before[p.name]))
			}
		}
		return true, ""
	})
}

// snapshotMembers matches the member count of a node's "ownership
// snapshot" log record, text or JSON.
var snapshotMembers = regexp.MustCompile(`ownership snapshot.*?\bmembers"?[=:](\d+)`)

// mostSnapshotMembers is the largest member count of any ownership
// snapshot the node at path logged (0 when it logged none).
func mostSnapshotMembers(path string) int {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	most := 0
	for _, m := range snapshotMembers.FindAllSubmatch(b, -1) {
		if n, err := strconv.Atoi(string(m[1])); err == nil && n > most {
			most = n
		}
	}
	return most
}
