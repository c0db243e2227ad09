package cluster

import (
	"bytes"
	"context"
	"time"

	"github.com/hashicorp/memberlist"
)

// events is the memberlist.EventDelegate of a Cluster. memberlist calls it
// while holding its node lock, one call at a time, so calling Members or
// LocalNode here would deadlock (PITFALLS, memberlist#237); it also fires
// for the local node inside memberlist.Create, before the *Memberlist
// exists. Each callback copies what the Cluster needs of the node into its
// own peer map (reading the *Node is safe only here, under memberlist's
// lock: the nodes Members returns are written concurrently) and pokes the
// 1-buffered recompute channel, so a burst of joins and leaves merges into
// one recompute.
type events struct{ c *Cluster }

var _ memberlist.EventDelegate = (*events)(nil)

func (e *events) NotifyJoin(n *memberlist.Node)   { e.c.setPeer(n) }
func (e *events) NotifyUpdate(n *memberlist.Node) { e.c.setPeer(n) }
func (e *events) NotifyLeave(n *memberlist.Node) {
	e.c.peersMu.Lock()
	delete(e.c.peers, n.Name)
	// A member that announced it was leaving (its meta says so) went on
	// purpose; any other that disappears failed. (memberlist's Node.State
	// does not say: NotifyLeave gets a Node whose State field is not the
	// one deadNode updates.)
	if m, err := decodeMeta(n.Meta); n.Name != e.c.name && (err != nil || m.State != MemberLeaving) {
		e.c.failed[n.Name] = time.Now()
		forgetOldestFailures(e.c.failed)
	} else {
		delete(e.c.failed, n.Name)
	}
	e.c.peersMu.Unlock()
	poke(e.c.recomputeCh)
}

// maxFailedPeers bounds the failed peers a Cluster remembers.
const maxFailedPeers = 64

// forgetOldestFailures trims failed to maxFailedPeers entries, dropping
// the oldest failures.
func forgetOldestFailures(failed map[string]time.Time) {
	for len(failed) > maxFailedPeers {
		oldest, at := "", time.Time{}
		for name, t := range failed {
			if oldest == "" || t.Before(at) {
				oldest, at = name, t
			}
		}
		delete(failed, oldest)
	}
}

// lastFailure returns when the most recent of the failed peers that have
// not returned failed; zero when there is none.
func (c *Cluster) lastFailure() time.Time {
	c.peersMu.Lock()
	defer c.peersMu.Unlock()
	var last time.Time
	for _, t := range c.failed {
		if t.After(last) {
			last = t
		}
	}
	return last
}

// peer is the Cluster's copy of one live memberlist node (alive or
// suspect: memberlist reports a death as a leave).
type peer struct {
	name string
	addr string // ip:port
	meta []byte
}

func (c *Cluster) setPeer(n *memberlist.Node) {
	p := peer{name: n.Name, addr: n.Address(), meta: bytes.Clone(n.Meta)}
	c.peersMu.Lock()
	c.peers[p.name] = p
	delete(c.failed, p.name) // it returned
	if p.name == c.name {
		c.selfAddr = p.addr
	}
	c.peersMu.Unlock()
	poke(c.recomputeCh)
}

// livePeers returns a copy of the peer map's values.
func (c *Cluster) livePeers() []peer {
	c.peersMu.Lock()
	defer c.peersMu.Unlock()
	out := make([]peer, 0, len(c.peers))
	for _, p := range c.peers {
		out = append(out, p)
	}
	return out
}

// recomputeLoop recomputes ownership whenever membership changed, until
// ctx ends.
func (c *Cluster) recomputeLoop(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.recomputeCh:
			c.Recompute()
		}
	}
}
