package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/fairshard/fairshard/lease"
)

// simNode is a node in the protocol test: a real Client, its demand, and
// the end times of the rows it has claimed.
type simNode struct {
	name   string
	client *lease.Client
	demand uint32
	rows   []time.Time
	cutoff int // rounds left cut off from the coordinator
}

// holds is the node's true holding: what it runs, or may start, now. A
// row due now has finished, even if the node has not yet had its turn.
func (n *simNode) holds(now time.Time) uint32 {
	g, _, _ := n.client.Grant("ns", now)
	running := uint32(0)
	for _, end := range n.rows {
		if now.Before(end) {
			running++
		}
	}
	return max(g, running)
}

// fairShares: f_i = min(w_i, ⌈ℓ⌉) for the water level ℓ of quota q over
// wants w (everyone's wants when they fit).
func fairShares(q uint32, w []uint32) []uint32 {
	var sum uint64
	for _, x := range w {
		sum += uint64(min(x, q))
	}
	f := make([]uint32, len(w))
	if sum <= uint64(q) {
		for i, x := range w {
			f[i] = min(x, q)
		}
		return f
	}
	sorted := slices.Clone(w)
	slices.Sort(sorted)
	remaining, k := uint64(q), uint64(len(sorted))
	var level uint64
	for _, x := range sorted {
		if uint64(x)*k <= remaining {
			remaining -= uint64(x)
			k--
			continue
		}
		level = (remaining + k - 1) / k
		break
	}
	for i, x := range w {
		f[i] = uint32(min(uint64(x), level))
	}
	return f
}

var errDown = errors.New("coordinator unreachable")

// TestProtocolRounds runs real Clients against a real Coordinator on a
// manual clock, one refresh interval R per round, through coordinator
// crashes (the successor starts a new term and learns), outages (calls
// fail), single nodes cut off from the coordinator while the others are
// not, answers lost after the coordinator recorded them, and demand that
// changes. Each round every node, in random order, finishes its rows that
// are due (a row runs 1..D rounds), claims up to min(its unexpired grant,
// its demand), and refreshes.
//
// Safety, checked after every step: Σ_nodes max(unexpired grant, claimed
// rows) ≤ q. It holds through every failure because a node keeps a grant
// only until it expires (counted from the send), the coordinator counts a
// silent node's holding until its grant's expiry + Drain (≥ D rounds), and
// a new coordinator confirms only what nodes report for LeaseLength +
// Drain (set here: the default, LeaseLength, assumes nodes cut off from
// the new coordinator run no rows past their lease).
//
// Liveness, checked once the run has settled (no failure, loss, cut-off
// node or demand change for D+3 rounds, and the coordinator's learning
// over; a round in which any node is cut off is not settled): a node with
// wants > 0 is granted 0 only while the other nodes hold the whole quota,
// none above its fair share (as backpressure.TestFairShareRefreshRounds),
// or, when the wants exceed the quota, while contended rows go round
// (TestContendedQuotaTakesTurns bounds how long a node waits for one); and
// the quota idle while wanted at the end of a settled round is at most
// what came free at the round's start (Σ over nodes of the holding they
// ended the last round with, less what they still hold): a row that comes
// free reaches a waiting node at its next refresh, within one round, so
// no capacity stays idle through a whole round.
func TestProtocolRounds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const R = testRefresh
		clk := newClock()
		q := rapid.Uint32Range(0, 10).Draw(t, "quota")
		maxRun := rapid.IntRange(1, 4).Draw(t, "maxRowRounds")
		leaseRounds := rapid.IntRange(2, 8).Draw(t, "leaseRounds")
		w := newWorld()
		cfg := w.config()
		cfg.LeaseLength = time.Duration(leaseRounds) * R
		cfg.RefreshInterval = R
		cfg.Drain = time.Duration(maxRun) * R
		// Nodes here can be cut off from a new coordinator while their rows
		// run: learning must cover the drain too (docs/DECISIONS.md).
		cfg.LearningPeriod = cfg.LeaseLength + cfg.Drain
		// Sometimes the node's member count caps a namespace's first
		// refresh (it may only lower grants: safety must hold either way).
		members := rapid.IntRange(0, 6).Draw(t, "members")
		cfg.Members = func() int { return members }
		newTerm := func() *lease.Coordinator {
			w.coordinate("ns", clk.Now(), q)
			c, err := lease.NewCoordinator(cfg)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		coord := newTerm()
		learnEnd := clk.Now().Add(cfg.LeaseLength + cfg.Drain)

		nodes := make([]*simNode, rapid.IntRange(1, 5).Draw(t, "nodes"))
		for i := range nodes {
			name := fmt.Sprintf("node-%d", i)
			c, err := lease.NewClient(lease.ClientConfig{Node: name, Now: clk.Now})
			if err != nil {
				t.Fatal(err)
			}
			nodes[i] = &simNode{name: name, client: c}
		}
		route := func(string) (string, bool) { return "coord", true }
		heldAtEnd := make([]uint32, len(nodes)) // each node's holding at the end of the last round
		var down int                            // rounds left of an outage
		settledAt := 0                          // the last round with a failure or change
		rounds := rapid.IntRange(1, 60).Draw(t, "rounds")
		for round := range rounds {
			clk.Advance(R)
			now := clk.Now()
			// What came free since the last round ended: rows due now and
			// grants expired now.
			var freed uint64
			for i, n := range nodes {
				if h := n.holds(now); h < heldAtEnd[i] {
					freed += uint64(heldAtEnd[i] - h)
				}
			}
			switch rapid.IntRange(0, 19).Draw(t, "event") {
			case 0: // the coordinator crashes; a successor takes over later
				down = rapid.IntRange(0, leaseRounds+2).Draw(t, "outage")
				coord = nil
				settledAt = round
			case 1: // demand changes
				for _, n := range nodes {
					n.demand = rapid.Uint32Range(0, q+2).Draw(t, "demand")
				}
				settledAt = round
			case 2:
				settledAt = round // this round loses answers
			case 3: // one node is cut off from the coordinator for a while
				n := nodes[rapid.IntRange(0, len(nodes)-1).Draw(t, "cutNode")]
				n.cutoff = rapid.IntRange(1, leaseRounds+maxRun+2).Draw(t, "cutRounds")
			}
			lossy := settledAt == round
			if down > 0 {
				down--
				settledAt = round
			} else if coord == nil {
				coord = newTerm()
				learnEnd = now.Add(cfg.LeaseLength + cfg.Drain)
			}
			// transport answers through the coordinator; lost answers are
			// recorded there but never reach the node. (rapid draws must
			// stay on the test goroutine, so lost is drawn before.)
			transport := func(lost, cut bool) lease.Transport {
				return func(_ context.Context, _ string, req lease.Request) (lease.Response, error) {
					if coord == nil || cut {
						return lease.Response{}, errDown
					}
					resp, err := coord.Handle(now, req)
					if err == nil && lost {
						return lease.Response{}, errors.New("answer lost")
					}
					return resp, err
				}
			}
			wants := make([]uint32, len(nodes))
			for i, n := range nodes {
				wants[i] = min(n.demand, q)
			}
			fair := fairShares(q, wants)
			// turns: more nodes want rows than the quota gives each one
			// (the coordinator rotates the rows left over).
			turns := contended(q, wants)
			for _, n := range nodes {
				if n.cutoff > 0 {
					settledAt = round // a node cut off this round
				}
			}
			settled := round >= settledAt+maxRun+3 && !now.Before(learnEnd.Add(time.Duration(maxRun+3)*R))

			for _, i := range rapid.Permutation(indexes(len(nodes))).Draw(t, "order") {
				n := nodes[i]
				n.rows = slices.DeleteFunc(n.rows, func(end time.Time) bool { return !now.Before(end) })
				g, _, _ := n.client.Grant("ns", now)
				for uint32(len(n.rows)) < min(g, n.demand) {
					n.rows = append(n.rows, now.Add(time.Duration(rapid.IntRange(1, maxRun).Draw(t, "rowRounds"))*R))
				}
				demand := []lease.Demand{{Namespace: "ns", Wants: wants[i], Claimed: uint32(len(n.rows))}}
				lost := lossy && rapid.Bool().Draw(t, "lost")
				cut := n.cutoff > 0
				if cut {
					n.cutoff--
					settledAt = round
				}
				res, err := n.client.Refresh(context.Background(), 0, demand, route, transport(lost, cut))
				if err != nil {
					t.Fatal(err)
				}
				var total uint32
				for _, m := range nodes {
					total += m.holds(now)
				}
				if total > q {
					t.Fatalf("round %d after %s: nodes hold %d > quota %d", round, n.name, total, q)
				}
				if !settled || wants[i] == 0 || len(res) == 0 || res[0].Err != nil {
					continue
				}
				if g, _, _ := n.client.Grant("ns", now); g > 0 {
					continue
				}
				var others uint32
				for j, m := range nodes {
					if j == i {
						continue
					}
					h := m.holds(now)
					others += h
					if h > fair[j] {
						t.Fatalf("round %d: %s (wants %d) gets 0 while %s holds %d > fair share %d", round, n.name, wants[i], m.name, h, fair[j])
					}
				}
				if others < q && !turns {
					t.Fatalf("round %d: %s (wants %d) gets 0 while the others hold %d of %d", round, n.name, wants[i], others, q)
				}
			}
			// A row that came free at the round's start reaches a waiting
			// node at the waiter's next refresh: this round if the waiter
			// refreshes after the holder reported it, else the next. So the
			// quota idle while wanted at the round's end is at most what
			// came free at its start; nothing idles through a whole round.
			var held, wanted uint64
			for i, n := range nodes {
				heldAtEnd[i] = n.holds(now)
				held += uint64(heldAtEnd[i])
				wanted += uint64(wants[i])
			}
			if idle := min(uint64(q), wanted) - min(held, uint64(q), wanted); settled && idle > freed {
				t.Fatalf("round %d: the nodes hold %d of quota %d while they want %d: %d idle, but only %d came free at the round's start", round, held, q, wanted, idle, freed)
			}
		}
	})
}

// contended reports whether quota q leaves rows over for turns: the wants
// do not all fit and do not divide evenly at the water level.
func contended(q uint32, wants []uint32) bool {
	var sum uint64
	for _, w := range wants {
		sum += uint64(w)
	}
	return sum > uint64(q)
}

func indexes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
