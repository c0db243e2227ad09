package cluster_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/cluster/clustertest"
	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/internal/testmetrics"
)

// ownerWatch polls the snapshots of a set of nodes every 2 ms and
// records, per shard, the longest stretch during which two of them listed
// it as owned at once. The test goroutine swaps the set (set) after it
// kills or starts a node; the harness itself is not safe to read
// concurrently.
type ownerWatch struct {
	mu       sync.Mutex
	nodes    map[string]*cluster.Cluster // label → node
	worst    time.Duration
	worstAt  string
	overlaps int
	stop     chan struct{}
	done     chan struct{}
}

func watchOwners(h *clustertest.Harness, shardCount uint32) *ownerWatch {
	w := &ownerWatch{stop: make(chan struct{}), done: make(chan struct{})}
	w.set(h)
	since := make([]time.Time, shardCount) // start of the current overlap, zero if none
	go func() {
		defer close(w.done)
		owners := make([]int, shardCount)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			clear(owners)
			names := make([][]string, shardCount)
			w.mu.Lock()
			for label, c := range w.nodes {
				for _, sh := range c.Snapshot().Owned {
					owners[sh]++
					names[sh] = append(names[sh], label)
				}
			}
			now := time.Now()
			for sh, n := range owners {
				switch {
				case n > 1 && since[sh].IsZero():
					since[sh] = now
					w.overlaps++
				case n > 1:
					if d := now.Sub(since[sh]); d > w.worst {
						w.worst, w.worstAt = d, fmt.Sprintf("shard %d owned by %v", sh, names[sh])
					}
				default:
					since[sh] = time.Time{}
				}
			}
			w.mu.Unlock()
		}
	}()
	return w
}

// set makes the watch follow h's running nodes.
func (w *ownerWatch) set(h *clustertest.Harness) {
	nodes := map[string]*cluster.Cluster{}
	for _, nd := range h.Running() {
		nodes[nd.Name+"@"+nd.Addr()] = nd.Cluster
	}
	w.mu.Lock()
	w.nodes = nodes
	w.mu.Unlock()
}

func (w *ownerWatch) finish() (time.Duration, string, int) {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.worst, w.worstAt, w.overlaps
}

// A node SIGKILLed and started again with the same name on another IP. Its
// peers refuse it ("conflicting address") until they have declared the old
// address dead and DeadNodeReclaimTime (4 s here, so the window is well
// longer than failure detection) has passed; before the fix it owned a
// third of the shards on a table of its own meanwhile, while the survivors
// owned them too. Now it owns nothing until every peer holds it at its new
// address: at no time do two nodes own one shard for longer than failure
// detection (measured: the kill until both survivors dropped the old
// address), and the cluster converges with the node on its new address.
func TestRestartOnAnotherAddressOwnsNothingUntilAccepted(t *testing.T) {
	const reclaim = 4 * time.Second
	h := clustertest.Start(t, 3, clustertest.Options{Configure: func(_ int, cfg *cluster.Config) {
		cfg.DeadNodeReclaimTime = reclaim
		cfg.GossipToTheDeadTime = reclaim // or the dead entry is forgotten first
	}})
	h.WaitConverged(convergeTimeout)
	nd := h.Node(2)
	oldAddr := nd.Addr()
	w := watchOwners(h, cluster.DefaultShardCount)

	killed := time.Now()
	h.Kill(2)
	newAddr := h.RestartOnNewAddress(2)
	w.set(h)
	restarted := time.Since(killed)
	if newAddr == oldAddr {
		t.Fatalf("restarted on the old address %s", oldAddr)
	}
	// Failure detection: both survivors stop listing the old address.
	detection := poll.Eventually(t, 20*time.Second, "survivors declare the old address dead", func() (bool, string) {
		for _, s := range h.Nodes()[:2] {
			if m, ok := s.Cluster.Snapshot().Member(nd.Name); ok && m.GossipAddr == oldAddr {
				return false, s.Name + " still holds " + nd.Name + " at " + oldAddr
			}
		}
		return true, ""
	}) + restarted
	if nd.Cluster.Accepted() {
		t.Errorf("%s accepted %v after its restart on %s, while its peers had only just released %s", nd.Name, time.Since(killed), newAddr, oldAddr)
	} else if s := nd.Cluster.Snapshot(); len(s.Owned) != 0 {
		t.Errorf("%s owns %d shards before the cluster accepted it", nd.Name, len(s.Owned))
	}
	accepted := poll.Eventually(t, 30*time.Second, "the restarted node is accepted on its new address", func() (bool, string) {
		return nd.Cluster.Accepted(), fmt.Sprintf("%s not accepted yet", nd.Name)
	})
	after := h.WaitConverged(convergeTimeout)
	worst, where, overlaps := w.finish()
	t.Logf("failure detection %v; %s accepted %v after the kill; %d overlaps, the longest %v (%s)",
		detection.Round(time.Millisecond), nd.Name, (accepted + detection).Round(time.Millisecond), overlaps, worst.Round(time.Millisecond), where)

	if worst >= detection {
		t.Errorf("two nodes owned one shard for %v (%s), longer than failure detection (%v)", worst.Round(time.Millisecond), where, detection.Round(time.Millisecond))
	}
	if m, ok := after.Member(nd.Name); !ok || m.GossipAddr != newAddr {
		t.Errorf("after convergence %s is %+v, want it at %s", nd.Name, m, newAddr)
	}
	if got := len(nd.Cluster.Snapshot().Owned); got == 0 {
		t.Errorf("%s owns nothing after it was accepted", nd.Name)
	}
	h.CheckOwnership()
}

// Two nodes with the same name (the default name is the hostname). The
// newcomer's join reports ErrNameConflict naming both addresses, it is
// refused for good (Refused closed, never accepted, owns nothing), and the
// member that had the name keeps it, its address and its shards in every
// view.
func TestDuplicateNodeNameIsRefusedAtJoin(t *testing.T) {
	h := clustertest.Start(t, 3)
	before := h.WaitConverged(convergeTimeout)
	orig := h.Node(1)

	dup := h.Add(func(cfg *cluster.Config) { cfg.Name = orig.Name })
	_, err := dup.Cluster.Join(ctxT(t), h.Node(0).Addr())
	switch {
	case errors.Is(err, cluster.ErrNameConflict):
		t.Logf("the newcomer's error: %v", err)
		select {
		case <-dup.Cluster.Refused():
		default:
			t.Fatal("Join returned ErrNameConflict but Refused() is not closed")
		}
	case err != nil:
		t.Fatalf("Join of a second %q: err = %v, want ErrNameConflict or nil", orig.Name, err)
	default:
		// The Join pings the holder of the name once, within memberlist's
		// probe timeout; a holder not scheduled in time (a loaded host)
		// leaves the refusal to the accept loop, which must still refuse.
		t.Logf("Join returned nil: the holder of %q did not answer its ping in time; waiting for the accept loop", orig.Name)
		select {
		case <-dup.Cluster.Refused():
		case <-time.After(15 * time.Second):
			t.Fatal("Refused() not closed 15 s after the join")
		}
	}
	if !errors.Is(dup.Cluster.RefusedErr(), cluster.ErrNameConflict) {
		t.Errorf("RefusedErr() = %v", dup.Cluster.RefusedErr())
	}
	consistently := time.Now().Add(time.Second)
	for time.Now().Before(consistently) {
		if dup.Cluster.Accepted() || len(dup.Cluster.Snapshot().Owned) != 0 {
			t.Fatalf("the refused newcomer is accepted (%v) or owns %d shards", dup.Cluster.Accepted(), len(dup.Cluster.Snapshot().Owned))
		}
		for _, nd := range h.Nodes()[:3] {
			s := nd.Cluster.Snapshot()
			if m, ok := s.Member(orig.Name); !ok || m.GossipAddr != orig.Addr() {
				t.Fatalf("%s holds %s as %+v, want it at %s", nd.Name, orig.Name, m, orig.Addr())
			}
			if !s.Table.Equal(before.Table) {
				t.Fatalf("%s's table changed in %d shards", nd.Name, len(s.Table.Diff(before.Table)))
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := testmetrics.Sum(t, dup.Registry, "fairshard_cluster_refused_members_total", "reason=name_conflict"); n < 1 {
		t.Errorf("the newcomer counted %v name_conflict refusals", n)
	}
	if n := testmetrics.Sum(t, dup.Registry, "fairshard_cluster_accepted"); n != 0 {
		t.Errorf("the newcomer's fairshard_cluster_accepted = %v", n)
	}
	h.Kill(dup.Index) // it must stop without a leave, which would carry the name
	for _, nd := range h.Nodes()[:3] {
		if m, ok := nd.Cluster.Snapshot().Member(orig.Name); !ok || m.GossipAddr != orig.Addr() {
			t.Fatalf("after the newcomer stopped, %s holds %s as %+v", nd.Name, orig.Name, m)
		}
	}
}

// A node's peers confirm it within a few probe intervals of a plain join
// (nobody else holds its name), and a node without seeds is accepted from
// New on.
func TestNewNodeIsAcceptedPromptly(t *testing.T) {
	h := clustertest.Start(t, 1)
	if !h.Node(0).Cluster.Accepted() {
		t.Fatal("a node without seeds is not accepted")
	}
	start := time.Now()
	nd := h.Add(nil)
	took := poll.Eventually(t, convergeTimeout, "the new node is accepted", func() (bool, string) { return nd.Cluster.Accepted(), "" })
	t.Logf("accepted %v after New", time.Since(start).Round(time.Millisecond))
	if took > 2*time.Second {
		t.Errorf("a plain join took %v to be accepted", took)
	}
	h.WaitConverged(convergeTimeout)
	h.CheckOwnership()
}
