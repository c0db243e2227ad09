package e2e

import (
	"fmt"
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
