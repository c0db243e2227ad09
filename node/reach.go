package node

import (
	"context"
	"sync"
	"time"

	"github.com/fairshard/fairshard/internal/tick"
	"github.com/prometheus/client_golang/prometheus"
)

// Peer health checks: a member whose API address does not answer (a wrong
// --advertise-http, a firewall, an impostor without the cluster secret) may
// still gossip and stay active. Each node probes every other member's API
// (peer.Client.Probe); after unreachableAfterFailures failed probes in a
// row the member is shown unreachable in /v1/cluster ("reachable": false),
// counted in fairshard_unreachable_members and logged; appends for its
// shards are held here at once (answered "accepted") instead of waiting on
// a forward that fails, and handoff skips it. It is probed again with a
// doubling backoff (PeerCheckInterval up to 5×) and becomes reachable at
// its first answered probe.
const unreachableAfterFailures = 3

// peerProbeTimeout bounds one probe.
const peerProbeTimeout = 5 * time.Second

type peerHealth struct {
	addr        string
	failures    int
	unreachable bool
	next        time.Time
}

// reachability is the node's view of which members' APIs answer.
type reachability struct {
	mu    sync.Mutex
	peers map[string]*peerHealth // member name → health
	down  prometheus.Gauge
}

func newReachability(reg prometheus.Registerer) (*reachability, error) {
	r := &reachability{peers: map[string]*peerHealth{}, down: prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fairshard_unreachable_members",
		Help: "Members whose API does not answer this node's health checks: rows for their shards are held here (accepted) and handoff skips them until they answer.",
	})}
	return r, reg.Register(r.down)
}

// Reachable reports whether member's API answered its last probes (true
// for a member not probed yet).
func (r *reachability) Reachable(member string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.peers[member]
	return p == nil || !p.unreachable
}

// reachableAddr is Reachable for the member serving at apiAddr.
func (r *reachability) reachableAddr(apiAddr string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, p := range r.peers {
		if p.addr == apiAddr && p.unreachable {
			return false
		}
	}
	return true
}

// peerCheckLoop probes the other members' APIs every PeerCheckInterval
// (an unreachable one with its backoff).
func (n *Node) peerCheckLoop(ctx context.Context) error {
	return tick.Every(ctx, n.cfg.PeerCheckInterval, n.checkPeers)
}

func (n *Node) checkPeers(ctx context.Context) {
	r := n.reach
	now := time.Now()
	members := map[string]string{}
	for _, m := range n.ownership().Members {
		if m.Name != n.name && m.APIAddr != "" {
			members[m.Name] = m.APIAddr
		}
	}
	var due []string
	r.mu.Lock()
	for name := range r.peers {
		if _, ok := members[name]; !ok {
			delete(r.peers, name) // gone from the cluster
		}
	}
	for name, addr := range members {
		p := r.peers[name]
		if p == nil || p.addr != addr {
			p = &peerHealth{addr: addr}
			r.peers[name] = p
		}
		if !now.Before(p.next) {
			due = append(due, name)
		}
	}
	r.mu.Unlock()

	var wg sync.WaitGroup
	for _, name := range due {
		addr := members[name]
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, peerProbeTimeout)
			err := n.peers.Probe(pctx, addr)
			cancel()
			if ctx.Err() == nil {
				n.recordProbe(name, addr, err)
			}
		})
	}
	wg.Wait()
	r.mu.Lock()
	down := 0
	for _, p := range r.peers {
		if p.unreachable {
			down++
		}
	}
	r.mu.Unlock()
	r.down.Set(float64(down))
}

func (n *Node) recordProbe(name, addr string, err error) {
	r := n.reach
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.peers[name]
	if p == nil || p.addr != addr {
		return
	}
	interval := n.cfg.PeerCheckInterval
	if err == nil {
		if p.unreachable {
			n.log.Info("member reachable again: its API answers health checks", "member", name, "api_addr", addr)
		}
		p.failures, p.unreachable, p.next = 0, false, time.Now().Add(interval)
		return
	}
	p.failures++
	if !p.unreachable && p.failures >= unreachableAfterFailures {
		p.unreachable = true
		if n.ownSecret {
			n.log.Warn("member unreachable: this node has --api-token and no --cluster-secret, so it signs node-to-node calls with a secret of its own and no member can answer them",
				"member", name, "api_addr", addr, "fix", "give every node the same --cluster-secret-file", "err", err)
		} else {
			n.log.Warn("member unreachable: its API does not answer health checks",
				"member", name, "api_addr", addr, "failures", p.failures, "err", err)
		}
	}
	backoff := interval
	if p.unreachable {
		backoff = min(interval<<min(p.failures-unreachableAfterFailures, 3), 5*interval)
	}
	p.next = time.Now().Add(backoff)
}
