package testnode

import (
	"fmt"
	"net"
	"sync/atomic"
	"time"

	"github.com/fairshard/fairshard/cluster/clustertest"
	"github.com/fairshard/fairshard/node"
)

// GossipProfile is the memberlist timing of every test node: the fast
// profile's intervals with probe timeouts that a node starved of CPU for a
// few tenths of a second (many nodes, race-built, on a machine shared with
// other suites) still meets, so a live node is not suspected for it.
const GossipProfile = "shared-host"

// ServeFlags are the `fairshard serve` flags every node process of a test
// runs with: the test gossip profile and short loops, so a scenario plays
// out in seconds. Callers add their identity, secrets, grace and lease
// flags.
func ServeFlags() []string {
	return []string{
		"--gossip-profile", GossipProfile,
		"--poll-interval", "10ms",
		"--handoff-interval", "500ms",
		"--delivery-timeout", "5s",
		"--retry-base", "50ms",
		"--retry-cap", "1s",
		"--quota-ttl", "500ms",
		"--log-level", "info",
	}
}

var nodeSeq atomic.Int64

// Config is the config of an in-process test node named node-<n> (n counts
// the nodes of the test binary): its own loopback IP with free API and
// gossip ports, data dir dir, the test gossip profile and short sweep,
// handoff, retry and quota intervals.
func Config(dir string) node.Config {
	cfg := node.DefaultConfig()
	ip := clustertest.TakeIP()
	cfg.NodeName = fmt.Sprintf("node-%d", nodeSeq.Add(1))
	cfg.DataDir = dir
	cfg.HTTPAddr = net.JoinHostPort(ip, "0")
	cfg.GossipAddr = net.JoinHostPort(ip, "0")
	cfg.GossipProfile = GossipProfile
	cfg.Dispatch.PollInterval = 10 * time.Millisecond
	cfg.Replication.LeftoverInterval = 200 * time.Millisecond
	cfg.Dispatch.Retry.Base = 20 * time.Millisecond
	cfg.Dispatch.Retry.Cap = 200 * time.Millisecond
	cfg.Dispatch.DeliveryTimeout = 5 * time.Second
	cfg.ShutdownGrace = 10 * time.Second
	cfg.QuotaTTL = 50 * time.Millisecond
	return cfg
}
