package cluster

import (
	"fmt"
	"log"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
)

// dialTracker wraps memberlist's transport and counts the stream
// connections it opened per address. A Join that fails after it reached
// a seed failed in the state exchange (push/pull) itself: the peer
// answered, but refused our state or sent one we cannot take (another
// gossip key, a state over memberlist's 20 MiB limit). Join reports that
// as ErrStateExchange, so the node does not mistake it for "nobody is up"
// and serve a cluster of its own beside the live one, without its config.
type dialTracker struct {
	memberlist.NodeAwareTransport

	mu    sync.Mutex
	dials map[string]uint64 // ip:port → successful stream dials
}

func (t *dialTracker) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	conn, err := t.NodeAwareTransport.DialAddressTimeout(a, timeout)
	if err == nil {
		t.mu.Lock()
		t.dials[a.Addr]++
		t.mu.Unlock()
	}
	return conn, err
}

// counts returns the dial counts of addrs.
func (t *dialTracker) counts(addrs []string) map[string]uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]uint64, len(addrs))
	for _, a := range addrs {
		out[a] = t.dials[a]
	}
	return out
}

// reached reports whether any of addrs was dialled since before was taken.
func (t *dialTracker) reached(before map[string]uint64) []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var out []string
	for a, n := range before {
		if t.dials[a] > n {
			out = append(out, a)
		}
	}
	return out
}

// newTransport builds the network transport memberlist would build for
// mc (a TCP and UDP listener on BindAddr:BindPort, a few retries when the
// port is picked by the kernel) and wraps it in a dialTracker. It writes
// the picked port back into mc as memberlist does.
func newTransport(mc *memberlist.Config, logger *log.Logger) (*dialTracker, error) {
	nc := &memberlist.NetTransportConfig{
		BindAddrs: []string{mc.BindAddr},
		BindPort:  mc.BindPort,
		Logger:    logger,
	}
	attempts := 1
	if mc.BindPort == 0 {
		// Binding UDP and TCP on one kernel-picked port can race with
		// another process; each attempt picks another port.
		attempts = 10
	}
	var nt *memberlist.NetTransport
	var err error
	for range attempts {
		if nt, err = memberlist.NewNetTransport(nc); err == nil {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("set up gossip transport on %s:%d: %w", mc.BindAddr, mc.BindPort, err)
	}
	if mc.BindPort == 0 {
		mc.BindPort = nt.GetAutoBindPort()
		mc.AdvertisePort = mc.BindPort // as memberlist does for a picked port
	}
	return &dialTracker{NodeAwareTransport: nt, dials: make(map[string]uint64)}, nil
}
