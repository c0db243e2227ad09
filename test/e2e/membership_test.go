package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fairshard/fairshard/loadgen"
)

// Issue #16 item 6: a whole cluster stopped at once (SIGTERM to every node,
// as `docker compose down` does). Before the fix two of three nodes waited
// the whole shutdown grace (20 s here) for a leave broadcast nobody could
// receive and exited 1. Every node must exit 0, each well inside the grace
// (a third of it), having delivered what it was given.
func TestWholeClusterStopsTogether(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	var nodes []*proc
	for i := range 3 {
		nodes = append(nodes, c.startNode(fmt.Sprintf("stop-%d", i)))
	}
	c.waitConverged(20 * time.Second)
	l := newLedger()
	recv := c.receiver()
	rep := runLoad(t, c.generator(l, loadgen.Config{Rows: 600, BatchSize: 50, KeyPrefix: "stop-",
		Namespaces: []loadgen.Namespace{{Name: "stop", Weight: 1}}}))
	if rep.Appended != 600 || rep.GaveUp != 0 {
		t.Fatalf("appended %d of 600 (%d given up)", rep.Appended, rep.GaveUp)
	}
	c.waitDelivered(l, recv, 30*time.Second)

	const grace = 20 * time.Second // baseNodeFlags' --shutdown-grace
	type result struct {
		name string
		code int
		took time.Duration
	}
	results := make([]result, len(nodes))
	var wg sync.WaitGroup
	start := time.Now()
	for i, p := range nodes {
		done, ok := p.signal(syscall.SIGTERM)
		if !ok {
			t.Fatalf("%s is not running", p.name)
		}
		wg.Go(func() {
			select {
			case <-done:
				results[i] = result{p.name, p.exitStatus(), time.Since(start)}
			case <-time.After(grace + 10*time.Second):
				results[i] = result{p.name, -3, time.Since(start)}
				p.kill()
			}
		})
	}
	wg.Wait()
	for _, r := range results {
		t.Logf("%s exited %d after %v", r.name, r.code, r.took.Round(time.Millisecond))
		if r.code != 0 || r.took > grace/3 {
			t.Errorf("%s exited %d after %v; want 0 within %v (a third of the %v grace)", r.name, r.code, r.took.Round(time.Millisecond), grace/3, grace)
		}
	}
	for _, p := range nodes {
		if log := tailFile(p.logPath, 400); strings.Contains(log, "graceful shutdown incomplete") {
			t.Errorf("%s logged an incomplete shutdown:\n%s", p.name, tailFile(p.logPath, 30))
		}
	}
}

// Issue #13 item 2: two nodes started with one --node-name (the default is
// the hostname, so two containers or VMs cloned from one image collide).
// Before the fix both became ready and each owned every shard. The
// newcomer is refused at join: it exits 1 saying the name is used by a
// live member and pointing at --node-name, and the cluster's view (members,
// their addresses, ownership) does not change.
func TestDuplicateNodeNameRefused(t *testing.T) {
	c := newCluster(t, clusterOpts{Shards: 256})
	for i := range 3 {
		c.startNode(fmt.Sprintf("dup-%d", i))
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

	// Same name as dup-1, its own address, data dir and log.
	twin := c.startNode("dup-1", expectRefusal(), func(p *proc) {
		p.dataDir = filepath.Join(p.c.dir, "dup-1-twin", "data")
		p.logPath = filepath.Join(p.c.dir, "dup-1-twin.log")
	})
	t.Logf("the twin's last words:\n%s", tailFile(twin.logPath, 4))
	if code := twin.exitStatus(); code != 1 {
		t.Errorf("the second dup-1 exited with %d; want 1", code)
	}
	log := tailFile(twin.logPath, 60)
	for _, want := range []string{`node name "dup-1" is already used by a live member`, "--node-name"} {
		if !strings.Contains(log, want) {
			t.Errorf("the second dup-1's last words lack %q:\n%s", want, log)
		}
	}
	consistently(t, 2*time.Second, "the cluster's view with the first dup-1 only", func() (bool, string) {
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
			for _, m := range v.Members {
				if m.Name == "dup-1" && m.GossipAddr != c.members()[1].gossipAddr {
					return false, fmt.Sprintf("%s holds dup-1 at %s", p.name, m.GossipAddr)
				}
			}
		}
		return true, ""
	})
}
