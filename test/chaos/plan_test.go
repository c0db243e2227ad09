package chaos

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// faultKind names a nemesis (Jepsen's word for the fault injector).
type faultKind string

const (
	// Process lane: faults of one node process.
	faultKill     faultKind = "kill"      // SIGKILL, down for Hold, restart with the same name and data dir
	faultKillWipe faultKind = "kill-wipe" // the same, its data dir deleted before the restart (planOpts.Wipe)
	faultRestart  faultKind = "restart"   // SIGTERM, wait for the exit, restart
	faultPause    faultKind = "pause"     // SIGSTOP for Hold, then SIGCONT
	faultJoin     faultKind = "join"      // a new node joins
	faultLeave    faultKind = "leave"     // SIGTERM; the node is gone for good
	// Network lane: nftables rules inside the node namespaces.
	faultIsolate faultKind = "isolate" // one node cut from the rest for Hold
	faultSplit   faultKind = "split"   // the nodes cut in two halves for Hold
	faultLoss    faultKind = "loss"    // LossPct % of the packets between nodes dropped for Hold
)

// Lanes run their steps one after another, concurrently with each other, so
// a network fault may overlap a process fault. Join and leave never overlap
// a partition (the executor makes them wait for each other): a node joining
// during a partition would bridge it, and a node leaving during one could
// not hand its rows to the other side and never comes back.
const (
	laneProcess = "process"
	laneNetwork = "network"
)

// planStep is one nemesis step. Process-lane targets are resolved when the
// plan is made (only that lane changes who is a member); network-lane
// targets depend on who is a member when the step runs, so the step carries
// a random Pick and the executor resolves it then.
type planStep struct {
	Lane    string
	Kind    faultKind
	Gap     time.Duration // wait after the lane's previous step before this one
	Node    string        // process lane: the target, or the new node's name
	Hold    time.Duration // down time (kill), pause length, partition or loss length
	LossPct int
	Pick    uint64 // network lane: chooses the targets at execution time
}

func (s planStep) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "+%.1fs %s", s.Gap.Seconds(), s.Kind)
	if s.Node != "" {
		b.WriteString(" " + s.Node)
	}
	switch s.Kind {
	case faultKill, faultKillWipe:
		fmt.Fprintf(&b, " (down %.1fs)", s.Hold.Seconds())
	case faultPause, faultIsolate, faultSplit:
		fmt.Fprintf(&b, " for %.1fs", s.Hold.Seconds())
	case faultLoss:
		fmt.Fprintf(&b, " %d%% for %.1fs", s.LossPct, s.Hold.Seconds())
	}
	if s.Lane == laneNetwork && s.Kind != faultLoss {
		fmt.Fprintf(&b, " (pick %d)", s.Pick%1000)
	}
	return b.String()
}

// planOpts shape a plan.
type planOpts struct {
	// Duration is how long faults are started; a step still running at the
	// end finishes (and heals) first.
	Duration time.Duration
	// Nodes is the initial cluster size; MinNodes and MaxNodes bound it
	// through joins and leaves.
	Nodes, MinNodes, MaxNodes int
	// Wipe adds kill-wipe: the killed node's data dir is deleted before the
	// restart. Without replication it loses the rows only that node held,
	// which the "every acknowledged row is delivered" checker reports.
	Wipe bool
}

// plan is the whole fault schedule of a run, a pure function of the seed
// and the options: the same seed replays the same faults on the same nodes
// in the same order per lane (wall-clock timing, and so the interleaving of
// the two lanes and the rows affected, vary from run to run).
type plan struct {
	Seed    uint64
	Opts    planOpts
	Initial []string // n1..nN
	// Witness is an initial node never killed, restarted or removed, so the
	// leak check always has a process that lived through the whole run. It
	// may be paused and partitioned.
	Witness string
	Process []planStep
	Network []planStep
}

// processWeights and networkWeights are the relative odds of each kind.
var (
	processWeights = []struct {
		kind   faultKind
		weight int
	}{{faultKill, 4}, {faultRestart, 2}, {faultPause, 3}, {faultJoin, 2}, {faultLeave, 2}, {faultKillWipe, 3}}
	networkWeights = []struct {
		kind   faultKind
		weight int
	}{{faultIsolate, 2}, {faultSplit, 2}, {faultLoss, 2}}
)

// makePlan draws the schedule from seed.
func makePlan(seed uint64, o planOpts) plan {
	rng := rand.New(rand.NewPCG(seed, 0x6368616f73)) // "chaos"
	p := plan{Seed: seed, Opts: o}
	for i := 1; i <= o.Nodes; i++ {
		p.Initial = append(p.Initial, fmt.Sprintf("n%d", i))
	}
	p.Witness = p.Initial[rng.IntN(len(p.Initial))]
	between := func(lo, hi time.Duration) time.Duration {
		return lo + time.Duration(rng.Int64N(int64(hi-lo)+1))
	}
	// Nominal step lengths (the plan is long enough if steps run fast;
	// the executor stops starting steps at Duration).
	const overhead = 2 * time.Second

	running := append([]string(nil), p.Initial...)
	next := o.Nodes + 1
	for t := time.Duration(0); t < o.Duration; {
		s := planStep{Lane: laneProcess, Gap: between(2*time.Second, 6*time.Second)}
		var choices []faultKind
		var weights []int
		for _, w := range processWeights {
			ok := true
			switch w.kind {
			case faultJoin:
				ok = len(running) < o.MaxNodes
			case faultLeave:
				ok = len(running) > o.MinNodes
			case faultKillWipe:
				ok = o.Wipe
			}
			if ok {
				choices = append(choices, w.kind)
				weights = append(weights, w.weight)
			}
		}
		s.Kind = choices[pickWeighted(rng, weights)]
		var victims []string // nodes a process fault may hit: never the witness
		for _, n := range running {
			if n != p.Witness {
				victims = append(victims, n)
			}
		}
		switch s.Kind {
		case faultKill, faultKillWipe:
			s.Node = victims[rng.IntN(len(victims))]
			s.Hold = between(0, 4*time.Second)
		case faultRestart:
			s.Node = victims[rng.IntN(len(victims))]
		case faultPause:
			s.Node = running[rng.IntN(len(running))]
			s.Hold = between(500*time.Millisecond, 5*time.Second)
		case faultJoin:
			s.Node = fmt.Sprintf("n%d", next)
			next++
			running = append(running, s.Node)
		case faultLeave:
			s.Node = victims[rng.IntN(len(victims))]
			for i, n := range running {
				if n == s.Node {
					running = append(running[:i], running[i+1:]...)
					break
				}
			}
		}
		p.Process = append(p.Process, s)
		t += s.Gap + s.Hold + overhead
	}
	for t := time.Duration(0); t < o.Duration; {
		s := planStep{Lane: laneNetwork, Gap: between(3*time.Second, 10*time.Second), Pick: rng.Uint64()}
		var weights []int
		for _, w := range networkWeights {
			weights = append(weights, w.weight)
		}
		s.Kind = networkWeights[pickWeighted(rng, weights)].kind
		s.Hold = between(3*time.Second, 10*time.Second)
		if s.Kind == faultLoss {
			s.LossPct = 5 + rng.IntN(11) // 5..15 %
		}
		p.Network = append(p.Network, s)
		t += s.Gap + s.Hold
	}
	return p
}

func pickWeighted(rng *rand.Rand, weights []int) int {
	total := 0
	for _, w := range weights {
		total += w
	}
	r := rng.IntN(total)
	for i, w := range weights {
		if r < w {
			return i
		}
		r -= w
	}
	return len(weights) - 1
}

// resolveNetwork picks the targets of a network step among members (the
// nodes that have a namespace and have not left, sorted by name): the
// isolated node, or one half of a split (the rest is the other half).
func resolveNetwork(s planStep, members []string) (sideA, sideB []string) {
	if len(members) < 2 || s.Kind == faultLoss {
		return nil, nil
	}
	rng := rand.New(rand.NewPCG(s.Pick, 1))
	ms := append([]string(nil), members...)
	switch s.Kind {
	case faultIsolate:
		i := rng.IntN(len(ms))
		sideA = []string{ms[i]}
		sideB = append(append([]string(nil), ms[:i]...), ms[i+1:]...)
	case faultSplit:
		rng.Shuffle(len(ms), func(i, j int) { ms[i], ms[j] = ms[j], ms[i] })
		half := len(ms) / 2
		sideA, sideB = ms[:half], ms[half:]
	}
	return sideA, sideB
}

// String renders the plan as the run prints it.
func (p plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d, %v of faults, nodes %s (witness %s, %d..%d members)\n",
		p.Seed, p.Opts.Duration, strings.Join(p.Initial, ","), p.Witness, p.Opts.MinNodes, p.Opts.MaxNodes)
	b.WriteString("process lane:")
	for _, s := range p.Process {
		b.WriteString("\n  " + s.String())
	}
	b.WriteString("\nnetwork lane:")
	for _, s := range p.Network {
		b.WriteString("\n  " + s.String())
	}
	return b.String()
}
