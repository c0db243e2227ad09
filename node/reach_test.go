package node_test

import (
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/node"
)

// TestUnreachableMember: a member whose advertised API address does not
// answer (here a port that accepts connections and closes them at once) is
// shown unreachable in /v1/cluster, counted in
// fairshard_unreachable_members and logged, and probed with a backoff:
// over 3 s the dead address sees only the backed-off probes. Once its API
// answers it is reachable again. (Rows are no longer held by the node that
// took them for an unreachable owner: with replicated shards an append goes
// to the shard's replica set or is refused with 503.)
func TestUnreachableMember(t *testing.T) {
	t.Parallel()
	deadAddr := reserveAddr(t)
	var conns atomic.Int64
	dead, err := net.Listen("tcp", deadAddr)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := dead.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			_ = c.Close()
		}
	})
	fast := func(c *node.Config) {
		c.PeerCheckInterval, c.Replication.LeftoverInterval = 100*time.Millisecond, 100*time.Millisecond
	}
	a := startNode(t, fast)
	c := startNode(t, func(cfg *node.Config) {
		fast(cfg)
		cfg.AdvertiseHTTP = deadAddr
		cfg.Join = []string{a.GossipAddr()}
	})
	waitConverged(t, []*tnode{a, c})
	reachable := func() (bool, bool) {
		var view struct {
			Members []struct {
				Name      string `json:"name"`
				State     string `json:"state"`
				Reachable bool   `json:"reachable"`
			} `json:"members"`
		}
		a.mustDo("GET", "/v1/cluster", nil, 200, &view)
		for _, m := range view.Members {
			if m.Name == c.Name() {
				return m.Reachable, m.State == "active"
			}
		}
		return true, false
	}
	poll.Eventually(t, 10*time.Second, fmt.Sprintf("%s shown unreachable in /v1/cluster", c.Name()), func() (bool, string) { r, _ := reachable(); return !r, "" })
	if _, active := reachable(); !active {
		t.Errorf("%s is not active: its gossip works, only its API is dead", c.Name())
	}
	if v := a.metric("fairshard_unreachable_members"); v != 1 {
		t.Errorf("fairshard_unreachable_members = %v, want 1", v)
	}
	if !strings.Contains(a.logs.String(), "member unreachable") {
		t.Error("no log line for the unreachable member")
	}

	before := conns.Load()
	time.Sleep(3 * time.Second) // a measurement window, not a wait for a condition
	// Probes back off (0.1, 0.2, 0.4, then every 0.5 s): at most ~8.
	if n := conns.Load() - before; n > 10 {
		t.Errorf("%d connections to the unreachable member's address in 3 s; want only the backed-off probes (≤ 10)", n)
	}

	_ = dead.Close()
	wg.Wait()
	proxy := &tcpProxy{addr: deadAddr, to: c.ListenAddr()}
	proxy.up(t)
	t.Cleanup(proxy.down)
	poll.Eventually(t, 10*time.Second, fmt.Sprintf("%s reachable again", c.Name()), func() (bool, string) { r, _ := reachable(); return r, "" })
	if v := a.metric("fairshard_unreachable_members"); v != 0 {
		t.Errorf("fairshard_unreachable_members = %v after it answers again, want 0", v)
	}
}
