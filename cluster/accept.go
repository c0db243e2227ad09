package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/fairshard/fairshard/internal/bincodec"
)

// Acceptance (docs/adr/0043-acceptance-before-ownership.md): a node the
// cluster has not accepted owns nothing.
//
// memberlist refuses an alive message for a name it holds at another
// address ("conflicting address") until that entry has been dead for
// DeadNodeReclaimTime, but the refused node hears nothing of it: it merges
// its seeds' state, sees them alive and, computing ownership over that
// view, would own a share of the shards its peers have reassigned. So a
// node that joins through seeds starts unaccepted: it is a member of its
// own view (it can route appends to the owners it sees) but not an owner,
// and it asks every live peer, over memberlist's packet channel, at which
// address that peer's ownership view holds its name. It is accepted once
// every live peer answers "at your address". A peer that answers another
// address makes it ping that address under its own name: a node that
// answers is a live duplicate, and the newcomer is refused for good
// (ErrNameConflict, Refused); no answer means the address is a dead
// earlier run of this node, which the peers release DeadNodeReclaimTime
// after declaring it dead, and the newcomer keeps asking.
//
// A node without seeds, or one that found no seed and serves alone
// (AcceptAlone), is a cluster of its own and accepted at once. Acceptance
// is final for the Cluster's life.

// Packet kinds of this file, carried as memberlist user messages beside
// kv's gossip (whose kinds are below 0x80).
const (
	msgMemberQuery  byte = 0x81 // "at which address do you hold me?"
	msgMemberAnswer byte = 0x82 // "at this one" ("" when not a member)
)

// maxQueuedQueries bounds the member queries waiting for an answer; more
// are dropped (the asker asks again next round).
const maxQueuedQueries = 64

// memberQuery asks a peer at which address it holds From.
type memberQuery struct {
	Nonce uint64
	From  string // asker's node name
	Addr  string // asker's gossip address ip:port: where to answer
}

// memberAnswer tells a node at which address the sender's ownership view
// holds it.
type memberAnswer struct {
	Nonce   uint64
	Sender  string // the answering peer
	Subject string // the node asked about
	HeldAt  string // ip:port, "" when Subject is not a member of Sender's view
}

func (q memberQuery) encode() []byte {
	b := []byte{msgMemberQuery}
	b = binary.AppendUvarint(b, q.Nonce)
	b = bincodec.AppendString(b, q.From)
	return bincodec.AppendString(b, q.Addr)
}

func (a memberAnswer) encode() []byte {
	b := []byte{msgMemberAnswer}
	b = binary.AppendUvarint(b, a.Nonce)
	b = bincodec.AppendString(b, a.Sender)
	b = bincodec.AppendString(b, a.Subject)
	return bincodec.AppendString(b, a.HeldAt)
}

// maxAddrBytes bounds an ip:port in these messages.
const maxAddrBytes = 64

func decodeMemberQuery(b []byte) (memberQuery, error) {
	r := bincodec.NewReader(b[1:])
	q := memberQuery{Nonce: r.Uvarint(), From: r.String(MaxNodeNameBytes), Addr: r.String(maxAddrBytes)}
	if r.Err() != nil {
		return memberQuery{}, fmt.Errorf("member query: %w", r.Err())
	}
	return q, nil
}

func decodeMemberAnswer(b []byte) (memberAnswer, error) {
	r := bincodec.NewReader(b[1:])
	a := memberAnswer{Nonce: r.Uvarint(), Sender: r.String(MaxNodeNameBytes),
		Subject: r.String(MaxNodeNameBytes), HeldAt: r.String(maxAddrBytes)}
	if r.Err() != nil {
		return memberAnswer{}, fmt.Errorf("member answer: %w", r.Err())
	}
	return a, nil
}

// handleMemberMsg takes one of this file's packets from NotifyMsg: a
// query is queued for the answer loop (never blocking; dropped when the
// queue is full), an answer about this node is recorded.
func (c *Cluster) handleMemberMsg(buf []byte) {
	switch buf[0] {
	case msgMemberQuery:
		q, err := decodeMemberQuery(buf)
		if err != nil {
			c.log.Debug("dropping a member query", "error", err)
			return
		}
		select {
		case c.acceptance.queries <- q:
		default:
		}
	case msgMemberAnswer:
		a, err := decodeMemberAnswer(buf)
		if err != nil || a.Subject != c.name {
			return
		}
		c.acceptance.mu.Lock()
		c.acceptance.answers[a.Sender] = a.HeldAt
		c.acceptance.mu.Unlock()
		poke(c.acceptance.wake)
	}
}

// answerLoop answers member queries from the published ownership
// snapshot: a peer counts as holding the asker only once its ownership
// has been recomputed with it, so an accepted newcomer never owns a shard
// its peers still own.
func (c *Cluster) answerLoop(ctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case q := <-c.acceptance.queries:
			a := memberAnswer{Nonce: q.Nonce, Sender: c.name, Subject: q.From}
			if m, ok := c.Snapshot().Member(q.From); ok {
				a.HeldAt = m.GossipAddr
			}
			to, err := nodeAt(q.From, q.Addr)
			if err != nil {
				continue
			}
			if err := c.ml.SendBestEffort(to, a.encode()); err != nil {
				c.log.Debug("answering a member query", "to", q.From, "addr", q.Addr, "error", err)
			}
		}
	}
}

// nodeAt builds the memberlist node a packet to name at addr (ip:port)
// goes to.
func nodeAt(name, addr string) (*memberlist.Node, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	ip := net.ParseIP(host)
	p, err := strconv.ParseUint(port, 10, 16)
	if ip == nil || err != nil {
		return nil, fmt.Errorf("address %q is not ip:port", addr)
	}
	return &memberlist.Node{Name: name, Addr: ip, Port: uint16(p)}, nil
}

// acceptInterval is how often an unaccepted node asks its peers again:
// half a probe interval, at least 50 ms (500 ms with DefaultConfig).
func (c *Cluster) acceptInterval() time.Duration {
	return max(c.cfg.ProbeInterval/2, 50*time.Millisecond)
}

// acceptLoop runs while this node is not accepted: every acceptInterval,
// or when an answer or a conflict arrives, it checks the answers, pings
// any other address its name is held at, and asks the peers that have not
// confirmed it yet.
func (c *Cluster) acceptLoop(ctx context.Context) error {
	t := time.NewTicker(c.acceptInterval())
	defer t.Stop()
	var nonce uint64
	since := time.Now()
	for !c.acceptance.accepted.Load() {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-c.acceptance.wake:
		}
		if c.acceptance.accepted.Load() || c.left.Load() {
			return nil
		}
		self := c.GossipAddr()
		var peers []peer
		for _, p := range c.livePeers() {
			if p.name != c.name {
				peers = append(peers, p)
			}
		}
		if len(peers) == 0 {
			continue // alone: the join loop looks for the seeds
		}
		c.acceptance.mu.Lock()
		var ask []peer
		others := map[string]bool{}
		for _, p := range peers {
			held, ok := c.acceptance.answers[p.name]
			if !ok || held != self {
				ask = append(ask, p)
			}
			if ok && held != "" && held != self {
				others[held] = true
			}
		}
		for a := range c.acceptance.conflicts {
			others[a] = true
		}
		clear(c.acceptance.conflicts)
		c.acceptance.mu.Unlock()

		if len(ask) == 0 {
			c.accept(fmt.Sprintf("confirmed by every live peer (%d)", len(peers)), time.Since(since))
			return nil
		}
		if err := c.checkHeldElsewhere(ctx, slices.Sorted(maps.Keys(others))); err != nil {
			return nil // refused for good; Refused() is closed
		}
		nonce++
		q := memberQuery{Nonce: nonce, From: c.name, Addr: self}.encode()
		for _, p := range ask {
			if to, err := nodeAt(p.name, p.addr); err == nil {
				_ = c.ml.SendBestEffort(to, q)
			}
		}
	}
	return nil
}

// checkHeldElsewhere pings this node's name at each address a peer holds
// it at (or a conflict reported). A node that answers is a live duplicate:
// the Cluster is refused (ErrNameConflict) and the error returned. No
// answer (a dead earlier run of this node) is logged, at most once a
// minute per address, and waited out.
func (c *Cluster) checkHeldElsewhere(ctx context.Context, addrs []string) error {
	for _, a := range addrs {
		to, err := nodeAt(c.name, a)
		if err != nil {
			continue
		}
		udp := &net.UDPAddr{IP: to.Addr, Port: int(to.Port)}
		answered := false
		for try := 0; try < 3 && !answered && ctx.Err() == nil; try++ {
			if _, err := c.ml.Ping(c.name, udp); err == nil {
				answered = true
			}
		}
		if answered {
			err := fmt.Errorf("%w: node name %q is already used by a live member at %s (this node is at %s): give every node its own --node-name (the default is the hostname)",
				ErrNameConflict, c.name, a, c.GossipAddr())
			c.refuseSelf(err)
			return err
		}
		c.acceptance.mu.Lock()
		last, logged := c.acceptance.heldLogged[a]
		if !logged || time.Since(last) >= refusalLogEvery {
			c.acceptance.heldLogged[a] = time.Now()
			c.acceptance.mu.Unlock()
			c.log.Warn("the cluster still holds this node's name at another address, which does not answer: a previous run of this node? Owning no shards until the peers release the name",
				"held_at", a, "self", c.GossipAddr(), "released_after", "failure detection + "+c.cfg.DeadNodeReclaimTime.String())
			continue
		}
		c.acceptance.mu.Unlock()
	}
	return nil
}

// accept makes this node an owner: final for the Cluster's life.
func (c *Cluster) accept(why string, waited time.Duration) {
	if c.acceptance.accepted.Swap(true) {
		return
	}
	c.log.Info("accepted by the cluster: this node owns shards from now on", "how", why, "waited", waited.Round(time.Millisecond).String())
	c.Recompute()
}

// refuseSelf records that the cluster refuses this node for good and
// closes Refused.
func (c *Cluster) refuseSelf(err error) {
	c.acceptance.mu.Lock()
	defer c.acceptance.mu.Unlock()
	if c.acceptance.refusedErr != nil {
		return
	}
	c.acceptance.refusedErr = err
	close(c.acceptance.refusedCh)
	c.metrics.refused.WithLabelValues("name_conflict").Inc()
	c.log.Error("refused by the cluster: another live node uses this node's name", "error", err)
}

// noteConflict records, from memberlist's conflict hook, that some node
// holds this node's name at addr; the accept loop pings it. It runs under
// memberlist's node lock: record and poke, nothing more.
func (c *Cluster) noteConflict(addr string) {
	c.acceptance.mu.Lock()
	c.acceptance.conflicts[addr] = true
	c.acceptance.mu.Unlock()
	poke(c.acceptance.wake)
}

// Accepted reports whether the cluster has accepted this node, so that it
// owns shards (see the acceptance notes in accept.go): true from New for
// a node without seeds, after AcceptAlone, or once every live peer holds
// it at its own address. OwnershipSnapshot.Accepted carries the same
// value as of the snapshot.
func (c *Cluster) Accepted() bool { return c.acceptance.accepted.Load() }

// AcceptAlone accepts this node as a cluster of its own if it has no live
// peer (the caller found no seed to join and serves alone) and reports
// whether it is accepted now. With live peers it changes nothing: their
// confirmation decides.
func (c *Cluster) AcceptAlone() bool {
	if c.acceptance.accepted.Load() {
		return true
	}
	for _, p := range c.livePeers() {
		if p.name != c.name {
			return false
		}
	}
	c.accept("alone: no seed answered", 0)
	return true
}

// Refused returns a channel closed when the cluster refuses this node for
// good: another live node uses its name (RefusedErr says which, wrapping
// ErrNameConflict). A refused node owns nothing and never will; the
// process should stop (without Leave, which would carry the other node's
// name).
func (c *Cluster) Refused() <-chan struct{} { return c.acceptance.refusedCh }

// RefusedErr returns why the cluster refused this node, nil while it has
// not.
func (c *Cluster) RefusedErr() error {
	c.acceptance.mu.Lock()
	defer c.acceptance.mu.Unlock()
	return c.acceptance.refusedErr
}

// ErrNameConflict is returned (wrapped, naming the name and both
// addresses) by Join and RefusedErr when another live member uses this
// node's name: the cluster refuses the newcomer.
var ErrNameConflict = errors.New("cluster: node name already used by a live member")

// acceptance is what this node knows of its own acceptance by the members
// (accept.go): accepted once the members hold it at its address; answers
// maps each peer name to the address it holds this node at ("" none);
// conflicts are the addresses memberlist saw this node's name at;
// heldLogged rate-limits the "held elsewhere" log line; refusedErr is why
// the node was refused for good, refusedCh closed then; queries and wake
// (1-buffered) feed the acceptance loop. mu guards the maps and
// refusedErr.
type acceptance struct {
	accepted   atomic.Bool
	mu         sync.Mutex
	answers    map[string]string
	conflicts  map[string]bool
	heldLogged map[string]time.Time
	refusedErr error
	refusedCh  chan struct{}
	queries    chan memberQuery
	wake       chan struct{}
}
