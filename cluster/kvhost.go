package cluster

import (
	"github.com/hashicorp/memberlist"
)

// kvBroadcast is one kv change queued for gossip (kv.Config.Broadcast). It
// is a NamedBroadcast: a newer change of the same key replaces a queued
// older one, so a queue never holds a stale value behind a newer one.
type kvBroadcast struct {
	key string
	msg []byte
}

var _ memberlist.NamedBroadcast = (*kvBroadcast)(nil)

func (b *kvBroadcast) Name() string    { return "config/" + b.key }
func (b *kvBroadcast) Message() []byte { return b.msg }
func (b *kvBroadcast) Finished()       {}
func (b *kvBroadcast) Invalidates(o memberlist.Broadcast) bool {
	ob, ok := o.(*kvBroadcast)
	return ok && ob.key == b.key
}

// maxQueuedBroadcasts bounds the config gossip queue. A burst of writes
// (thousands of holds, a whole state merged on a join) would otherwise
// queue one message per key and flood the UDP gossip for minutes, starving
// the probes; past the bound the oldest messages are dropped, and the next
// push/pull (which sends every entry) brings them anyway.
const maxQueuedBroadcasts = 1024

// queueBroadcast is the kv store's Broadcast hook: it never blocks.
func (c *Cluster) queueBroadcast(key string, msg []byte) {
	c.broadcasts.QueueBroadcast(&kvBroadcast{key: key, msg: msg})
	if c.broadcasts.NumQueued() > maxQueuedBroadcasts {
		c.broadcasts.Prune(maxQueuedBroadcasts)
	}
}

// poke does a non-blocking send on a 1-buffered wake-up channel: bursts of
// events merge into one wake-up.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
