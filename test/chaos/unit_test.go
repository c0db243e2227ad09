package chaos

import (
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"
)

// These tests run everywhere (no root, no processes): the plan is a pure
// function of its seed, and every checker reports a history built to break
// it, and stays quiet on one that does not.

func TestPlanIsAFunctionOfTheSeed(t *testing.T) {
	o := planOpts{Duration: 2 * time.Minute, Nodes: 4, MinNodes: 3, MaxNodes: 6}
	a, b := makePlan(42, o), makePlan(42, o)
	if !reflect.DeepEqual(a, b) || a.String() != b.String() {
		t.Fatalf("two plans of seed 42 differ:\n%s\n---\n%s", a, b)
	}
	if c := makePlan(43, o); reflect.DeepEqual(a.Process, c.Process) && reflect.DeepEqual(a.Network, c.Network) {
		t.Fatalf("seeds 42 and 43 drew the same plan:\n%s", a)
	}
}

func TestPlanKeepsItsBounds(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		o := planOpts{
			Duration: time.Duration(rapid.IntRange(10, 3600).Draw(rt, "seconds")) * time.Second,
			Nodes:    rapid.IntRange(3, 8).Draw(rt, "nodes"),
			Wipe:     rapid.Bool().Draw(rt, "wipe"),
		}
		o.MinNodes, o.MaxNodes = 3, o.Nodes+2
		p := makePlan(rapid.Uint64().Draw(rt, "seed"), o)
		if !slices.Contains(p.Initial, p.Witness) {
			rt.Fatalf("witness %s is not an initial node", p.Witness)
		}
		running := map[string]bool{}
		for _, n := range p.Initial {
			running[n] = true
		}
		var nominal time.Duration
		for _, s := range p.Process {
			nominal += s.Gap + s.Hold
			switch s.Kind {
			case faultJoin:
				if running[s.Node] {
					rt.Fatalf("join of %s, already a member", s.Node)
				}
				running[s.Node] = true
			default:
				if !running[s.Node] {
					rt.Fatalf("%s of %s, not a member", s.Kind, s.Node)
				}
				if s.Kind != faultPause && s.Node == p.Witness {
					rt.Fatalf("%s of the witness %s", s.Kind, s.Node)
				}
				if s.Kind == faultKillWipe && !o.Wipe {
					rt.Fatalf("kill-wipe without planOpts.Wipe")
				}
				if s.Kind == faultLeave {
					delete(running, s.Node)
				}
			}
			if len(running) < o.MinNodes || len(running) > o.MaxNodes {
				rt.Fatalf("%d members after %s; bounds %d..%d", len(running), s, o.MinNodes, o.MaxNodes)
			}
		}
		if nominal+2*time.Second*time.Duration(len(p.Process)) < o.Duration {
			rt.Fatalf("process lane covers %v of %v", nominal, o.Duration)
		}
		var net time.Duration
		for _, s := range p.Network {
			net += s.Gap + s.Hold
			if s.Kind == faultLoss && (s.LossPct < 5 || s.LossPct > 15) {
				rt.Fatalf("loss of %d%%; want 5..15", s.LossPct)
			}
		}
		if net < o.Duration {
			rt.Fatalf("network lane covers %v of %v", net, o.Duration)
		}
	})
}

func TestResolveNetworkSplitsTheMembers(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		n := rapid.IntRange(2, 9).Draw(rt, "members")
		var members []string
		for i := range n {
			members = append(members, "n"+string(rune('1'+i)))
		}
		kind := rapid.SampledFrom([]faultKind{faultIsolate, faultSplit}).Draw(rt, "kind")
		s := planStep{Lane: laneNetwork, Kind: kind, Pick: rapid.Uint64().Draw(rt, "pick")}
		a, b := resolveNetwork(s, members)
		a2, b2 := resolveNetwork(s, members)
		if !slices.Equal(a, a2) || !slices.Equal(b, b2) {
			rt.Fatalf("not deterministic")
		}
		all := append(append([]string(nil), a...), b...)
		slices.Sort(all)
		if !slices.Equal(all, members) {
			rt.Fatalf("sides %v | %v do not partition %v", a, b, members)
		}
		if kind == faultIsolate && len(a) != 1 {
			rt.Fatalf("isolate cut %v", a)
		}
		if kind == faultSplit && (len(a) != n/2 || len(b) != n-n/2) {
			rt.Fatalf("split %v | %v", a, b)
		}
	})
}

func TestDocumentedInFlightBound(t *testing.T) {
	for _, tc := range []struct {
		name             string
		q, n             int
		calm             bool
		want             int
		whereItComesFrom string
	}{
		{"one node enforces the quota exactly", 8, 1, true, 8, "ceil(8×1/1)"},
		{"rounding up admits N−1 more", 2, 4, true, 5, "4 × ceil(2/4)=4 ≤ 2+3"},
		{"a partition doubles it", 8, 4, false, 22, "each side enforces q+k−1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := documentedInFlightBound(tc.q, tc.n, tc.calm); got != tc.want {
				t.Errorf("bound(q=%d, n=%d, calm=%v) = %d; want %d (%s)", tc.q, tc.n, tc.calm, got, tc.want, tc.whereItComesFrom)
			}
		})
	}
}

// ---- synthetic histories ----

const ms = time.Millisecond

// hb builds a history: namespaces "a" (quota 2) and "b" (quota 4); nodes
// n1..n3 (indexes 1..3).
type hb struct{ h *history }

func newHB() *hb {
	return &hb{h: &history{
		namespaces: []nsSpec{{Name: "a", Quota: 2}, {Name: "b", Quota: 4}},
		nodes:      []string{"", "n1", "n2", "n3"},
		attempts:   map[int][]attempt{},
		finalHeal:  100 * time.Second, converged: 101 * time.Second,
	}}
}

// row adds an acknowledged row of namespace ns and returns its seq.
func (b *hb) row(ns uint8, ack ackStatus, failed uint16) int {
	b.h.rows = append(b.h.rows, rowRec{ns: ns, ack: ack, ackNode: 1, tries: failed + 1, failed: failed, sent: ms, acked: 2 * ms})
	return len(b.h.rows) - 1
}

func (b *hb) deliver(seq int, node nodeIdx, from, to time.Duration) {
	ns := uint8(0)
	if seq >= 0 && seq < len(b.h.rows) {
		ns = b.h.rows[seq].ns
	}
	b.h.deliveries = append(b.h.deliveries, delivery{seq: seq, ns: ns, node: node, attempt: 1, start: from, end: to, ok: true})
}

func (b *hb) event(at time.Duration, kind eventKind, node string) {
	b.h.events = append(b.h.events, event{At: at, Kind: kind, Nodes: []string{node}})
}

func (b *hb) episode(lane string, from, to time.Duration) {
	b.h.events = append(b.h.events, event{At: from, Kind: evEpisode, Lane: lane, Detail: "kill n2"},
		event{At: to, Kind: evEpisodeE, Lane: lane, Detail: "kill n2"})
}

// calm adds monitor samples every 250 ms over [from, to) in which nodes
// agree on one view.
func (b *hb) calm(from, to time.Duration, nodes ...string) {
	var members []string
	for _, n := range nodes {
		members = append(members, n+":active")
	}
	view := nodeView{Version: 7, Members: strings.Join(members, ",")}
	for at := from; at < to; at += 250 * ms {
		s := viewSample{At: at, Expect: nodes, Views: map[string]nodeView{}}
		for _, n := range nodes {
			s.Views[n] = view
		}
		b.h.samples = append(b.h.samples, s)
	}
}

func invariants(vs []violation) []string {
	var out []string
	for _, v := range vs {
		out = append(out, v.Invariant)
	}
	return out
}

func wantOnly(t *testing.T, vs []violation, want ...string) {
	t.Helper()
	got := invariants(vs)
	slices.Sort(got)
	got = slices.Compact(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		var lines []string
		for _, v := range vs {
			lines = append(lines, v.Invariant+": "+v.Summary)
		}
		t.Fatalf("violations %v; want %v\n%s", got, want, strings.Join(lines, "\n"))
	}
}

func TestCheckDelivered(t *testing.T) {
	b := newHB()
	ok := b.row(0, ackCreated, 0)
	b.deliver(ok, 1, 10*ms, 50*ms)
	vs, f := check(b.h, checkOpts{})
	wantOnly(t, vs)
	if f.RowsAcked != 1 || f.Deliveries != 1 || f.Duplicates != 0 {
		t.Fatalf("figures %+v", f)
	}

	lost := b.row(1, ackCreated, 0)
	unacked := b.row(1, ackNone, 3)
	never := b.row(0, ackNone, 0)
	b.h.rows[never].tries = 0
	b.deliver(never, 2, 60*ms, 90*ms)
	b.h.strays = []string{"someone-else"}
	vs, _ = check(b.h, checkOpts{})
	wantOnly(t, vs, "acknowledged-delivered", "appends-acknowledged", "no-phantom")
	for _, v := range vs {
		if v.Invariant == "acknowledged-delivered" && !slices.Equal(v.Seqs, []int{lost}) {
			t.Errorf("acknowledged-delivered names rows %v; want [%d]", v.Seqs, lost)
		}
		if v.Invariant == "appends-acknowledged" && !slices.Equal(v.Seqs, []int{unacked}) {
			t.Errorf("appends-acknowledged names rows %v; want [%d]", v.Seqs, unacked)
		}
	}
	if s := formatViolation(b.h, vs[0]); !strings.Contains(s, "rows involved") && vs[0].Invariant != "no-phantom" {
		t.Errorf("a violation with rows prints no rows:\n%s", s)
	}
}

func TestCheckDuplicates(t *testing.T) {
	t.Run("a kill between the answer and the repeat explains it", func(t *testing.T) {
		b := newHB()
		r := b.row(0, ackCreated, 0)
		b.deliver(r, 2, 1000*ms, 1040*ms)
		b.event(1041*ms, evKill, "n2")
		b.deliver(r, 2, 3000*ms, 3040*ms)
		vs, f := check(b.h, checkOpts{})
		wantOnly(t, vs)
		if f.DupByCause["kill"] != 1 {
			t.Fatalf("causes %v; want one kill", f.DupByCause)
		}
	})
	t.Run("a kill of another node does not", func(t *testing.T) {
		b := newHB()
		r := b.row(0, ackCreated, 0)
		b.deliver(r, 2, 1000*ms, 1040*ms)
		b.event(1041*ms, evKill, "n3")
		b.deliver(r, 1, 3000*ms, 3040*ms)
		vs, _ := check(b.h, checkOpts{})
		wantOnly(t, vs, "duplicates-explained")
		if !strings.Contains(formatViolation(b.h, vs[0]), "delivery from n2") {
			t.Errorf("the violation does not show the row's deliveries:\n%s", formatViolation(b.h, vs[0]))
		}
	})
	t.Run("a graceful stop does not", func(t *testing.T) {
		b := newHB()
		r := b.row(0, ackCreated, 0)
		b.deliver(r, 2, 1000*ms, 1040*ms)
		b.event(1041*ms, evTerm, "n2")
		b.event(1500*ms, evKill, "n2")
		b.deliver(r, 2, 3000*ms, 3040*ms)
		vs, _ := check(b.h, checkOpts{})
		wantOnly(t, vs, "duplicates-explained")
	})
	t.Run("a kill long after the answer does not", func(t *testing.T) {
		b := newHB()
		r := b.row(0, ackCreated, 0)
		b.deliver(r, 2, 1000*ms, 1040*ms)
		b.event(30*time.Second, evKill, "n2")
		b.deliver(r, 2, 31*time.Second, 31*time.Second+40*ms)
		vs, _ := check(b.h, checkOpts{})
		wantOnly(t, vs, "duplicates-explained")
	})
	t.Run("a retried append explains one copy per failed attempt", func(t *testing.T) {
		b := newHB()
		r := b.row(0, ackCreated, 1)
		b.deliver(r, 1, 1000*ms, 1040*ms)
		b.deliver(r, 2, 2000*ms, 2040*ms)
		vs, f := check(b.h, checkOpts{})
		wantOnly(t, vs)
		if f.DupByCause["retried append"] != 1 {
			t.Fatalf("causes %v", f.DupByCause)
		}
		b.deliver(r, 3, 3000*ms, 3040*ms)
		vs, _ = check(b.h, checkOpts{})
		wantOnly(t, vs, "duplicates-explained")
	})
	t.Run("a partition between the two deliverers explains it, concurrent or not", func(t *testing.T) {
		b := newHB()
		b.h.cuts = []cut{{from: 2 * time.Second, to: 62 * time.Second, sideA: []string{"n3"}, sideB: []string{"n1", "n2"}}}
		r := b.row(0, ackCreated, 0)
		b.deliver(r, 1, 5000*ms, 5040*ms)
		b.deliver(r, 3, 5010*ms, 5050*ms)
		b.deliver(r, 1, 63*time.Second, 63*time.Second+40*ms) // right after the heal, before repair
		vs, f := check(b.h, checkOpts{})
		wantOnly(t, vs)
		if f.DupByCause["partition"] != 2 {
			t.Fatalf("causes %v; want two by partition", f.DupByCause)
		}
	})
	t.Run("a partition does not explain nodes on one side, or long after", func(t *testing.T) {
		b := newHB()
		b.h.cuts = []cut{{from: 2 * time.Second, to: 62 * time.Second, sideA: []string{"n3"}, sideB: []string{"n1", "n2"}}}
		r := b.row(0, ackCreated, 0)
		b.deliver(r, 1, 5000*ms, 5040*ms)
		b.deliver(r, 2, 6000*ms, 6040*ms)
		vs, _ := check(b.h, checkOpts{})
		wantOnly(t, vs, "duplicates-explained")
		b = newHB()
		b.h.cuts = []cut{{from: 2 * time.Second, to: 12 * time.Second, sideA: []string{"n3"}, sideB: []string{"n1", "n2"}}}
		r = b.row(0, ackCreated, 0)
		b.deliver(r, 1, 40*time.Second, 40*time.Second+40*ms)
		b.deliver(r, 3, 50*time.Second, 50*time.Second+40*ms)
		vs, _ = check(b.h, checkOpts{})
		wantOnly(t, vs, "duplicates-explained")
	})
	t.Run("a pause of the repeating node explains it (it acted on its old view)", func(t *testing.T) {
		b := newHB()
		r := b.row(0, ackCreated, 0)
		b.event(19*time.Second, evStop, "n3")
		b.deliver(r, 2, 20*time.Second, 20*time.Second+40*ms)
		b.event(23*time.Second, evCont, "n3")
		b.deliver(r, 3, 23*time.Second+500*ms, 23*time.Second+540*ms)
		vs, f := check(b.h, checkOpts{})
		wantOnly(t, vs)
		if f.DupByCause["partition"] != 1 {
			t.Fatalf("causes %v; want one by partition (the pause)", f.DupByCause)
		}
	})
	t.Run("nodes the monitor saw not listing each other explain it", func(t *testing.T) {
		b := newHB()
		r := b.row(0, ackCreated, 0)
		all := "n1:active,n2:active,n3:active"
		for at := 10 * time.Second; at < 30*time.Second; at += 250 * ms {
			v := map[string]nodeView{"n1": {Members: all}, "n2": {Members: all}, "n3": {Members: all}}
			if at >= 20*time.Second && at < 22*time.Second {
				v["n1"] = nodeView{Members: "n1:active,n3:active"} // n1 suspects n2
			}
			b.h.samples = append(b.h.samples, viewSample{At: at, Views: v, Expect: []string{"n1", "n2", "n3"}})
		}
		b.deliver(r, 2, 20500*ms, 20540*ms)
		b.deliver(r, 1, 21500*ms, 21540*ms)
		vs, f := check(b.h, checkOpts{})
		wantOnly(t, vs)
		if f.DupByCause["partition"] != 1 {
			t.Fatalf("causes %v; want one by partition (a view split)", f.DupByCause)
		}
		b.deliver(r, 3, 50*time.Second, 50*time.Second+40*ms) // n1 → n3: no split between them
		vs, _ = check(b.h, checkOpts{})
		wantOnly(t, vs, "duplicates-explained")
	})
	t.Run("two claimers of a row appended once", func(t *testing.T) {
		b := newHB()
		r := b.row(0, ackCreated, 0)
		b.deliver(r, 1, 1000*ms, 1040*ms)
		b.deliver(r, 2, 1010*ms, 1050*ms)
		vs, _ := check(b.h, checkOpts{})
		wantOnly(t, vs, "duplicates-explained", "one-claimer")
	})
	t.Run("a kill explains at most the quotas' sum", func(t *testing.T) {
		b := newHB()
		for i := range 7 { // quotas 2 + 4 = 6
			r := b.row(0, ackCreated, 0)
			b.deliver(r, 2, time.Duration(1000+50*i)*ms, time.Duration(1040+50*i)*ms)
			b.deliver(r, 2, time.Duration(3000+50*i)*ms, time.Duration(3040+50*i)*ms)
		}
		b.event(1400*ms, evKill, "n2")
		vs, _ := check(b.h, checkOpts{})
		wantOnly(t, vs, "duplicates-bounded")
	})
}

func TestCheckInFlight(t *testing.T) {
	// Namespace a (quota 2) on 2 agreeing nodes: calm bound 3, disturbed
	// bound 2 × 3 at the 2 processes the run had.
	setup := func() *hb {
		b := newHB()
		b.event(0, evStart, "n1")
		b.event(0, evStart, "n2")
		b.calm(0, 20*time.Second, "n1", "n2")
		return b
	}
	burst := func(b *hb, at time.Duration, count int, node func(i int) nodeIdx) {
		for i := range count {
			r := b.row(0, ackCreated, 0)
			b.deliver(r, node(i), at+time.Duration(i)*ms, at+100*ms)
		}
	}
	alternate := func(i int) nodeIdx { return nodeIdx(1 + i%2) }

	b := setup()
	burst(b, 5*time.Second, 3, alternate)
	vs, f := check(b.h, checkOpts{})
	wantOnly(t, vs)
	if f.MaxInFlight["a"] != 3 || f.MaxInFlightCalm["a"] != 3 {
		t.Fatalf("max in flight %v (calm %v); want 3", f.MaxInFlight, f.MaxInFlightCalm)
	}

	b = setup()
	burst(b, 5*time.Second, 4, alternate)
	vs, _ = check(b.h, checkOpts{})
	wantOnly(t, vs, "in-flight-bound")
	if len(vs[0].Seqs) != 4 || !strings.Contains(vs[0].Detail, "n1 2, n2 2") {
		t.Fatalf("violation names %v, %q; want the 4 rows in flight, 2 per node", vs[0].Seqs, vs[0].Detail)
	}

	// Within CalmSettle of the agreement's start the disturbed bound holds.
	b = setup()
	burst(b, time.Second, 4, alternate)
	vs, _ = check(b.h, checkOpts{})
	wantOnly(t, vs)

	// During an episode: 6 is allowed, 7 is not.
	b = setup()
	b.episode(laneProcess, 4*time.Second, 6*time.Second)
	burst(b, 5*time.Second, 6, alternate)
	vs, _ = check(b.h, checkOpts{})
	wantOnly(t, vs, "node-in-flight-bound") // 3 from one node > quota 2
	b = setup()
	b.episode(laneNetwork, 4*time.Second, 6*time.Second)
	burst(b, 5*time.Second, 7, func(i int) nodeIdx { return nodeIdx(1 + i%4) }) // at most 2 per sender
	vs, _ = check(b.h, checkOpts{})
	wantOnly(t, vs, "in-flight-bound")

	// A tighter bound (exact quotas) is a parameter.
	b = setup()
	burst(b, 5*time.Second, 3, alternate)
	vs, _ = check(b.h, checkOpts{InFlightBound: func(q, _ int, _ bool) int { return q }})
	wantOnly(t, vs, "in-flight-bound")
}

func TestCheckConvergence(t *testing.T) {
	b := newHB()
	b.h.finalHeal, b.h.converged = 50*time.Second, 55*time.Second
	vs, f := check(b.h, checkOpts{})
	wantOnly(t, vs)
	if f.Converged != 5*time.Second {
		t.Fatalf("converged %v", f.Converged)
	}
	b.h.converged = 61 * time.Second
	vs, _ = check(b.h, checkOpts{})
	wantOnly(t, vs, "convergence")
	b.h.converged = 0
	vs, _ = check(b.h, checkOpts{})
	wantOnly(t, vs, "convergence")
}

func TestCheckLeaks(t *testing.T) {
	base := resources{Goroutines: 60, FDs: 30, SocketFDs: 22}
	base.Established.Server, base.Established.Client = 5, 12
	for _, tc := range []struct {
		name string
		edit func(*resources)
		want []string
	}{
		{"more connections explain more goroutines", func(r *resources) { r.Established.Client += 10; r.Goroutines += 20; r.SocketFDs += 10; r.FDs += 10 }, nil},
		{"goroutines nothing explains", func(r *resources) { r.Goroutines += 11 }, []string{"no-goroutine-leak"}},
		{"a file left open", func(r *resources) { r.FDs += 3 }, []string{"no-fd-leak"}},
		{"sockets that are no connection", func(r *resources) { r.FDs += 3; r.SocketFDs += 3 }, []string{"no-fd-leak"}},
		{"a connection the peer closed", func(r *resources) { r.CloseWait = 1; r.FDs++; r.SocketFDs++ }, []string{"no-fd-leak"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newHB()
			after := base
			tc.edit(&after)
			b.h.leaks = []leakSample{{Node: "n1", Before: base, After: after}}
			vs, _ := check(b.h, checkOpts{})
			wantOnly(t, vs, tc.want...)
		})
	}
}

func TestCheckCrash(t *testing.T) {
	b := newHB()
	b.h.events = append(b.h.events, event{At: time.Second, Kind: evCrash, Nodes: []string{"n2"}, Detail: "exit code 2"})
	vs, _ := check(b.h, checkOpts{})
	wantOnly(t, vs, "no-crash")
}

func TestKeys(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want int
	}{{rowKey("tiny", 0), 0}, {rowKey("a-b", 1234), 1234}, {"nodash", -1}, {"x-", -1}, {"x-3a", -1}} {
		if got := seqOfKey(tc.key); got != tc.want {
			t.Errorf("seqOfKey(%q) = %d; want %d", tc.key, got, tc.want)
		}
	}
}

func TestGracefulStopsByOutcome(t *testing.T) {
	b := newHB()
	ev := func(at time.Duration, kind eventKind, node, detail, lane string) {
		e := event{At: at, Kind: kind, Detail: detail, Lane: lane}
		if node != "" {
			e.Nodes = []string{node}
		}
		b.h.events = append(b.h.events, e)
	}
	ev(1*time.Second, evTerm, "n1", "SIGTERM", "")
	ev(2*time.Second, evExit, "n1", "exit code 0 after 1s", "")
	ev(3*time.Second, evEpisode, "", "loss 5%", laneNetwork)
	ev(4*time.Second, evTerm, "n2", "SIGTERM", "")
	ev(5*time.Second, evEpisodeE, "", "loss", laneNetwork)
	ev(24*time.Second, evExit, "n2", "exit code 1 after 20s", "")
	ev(30*time.Second, evTerm, "n3", "SIGTERM", "")
	ev(50*time.Second, evExit, "n3", "exit code 1 after 20s", "")
	got := gracefulStops(b.h)
	want := map[string]int{"exit 0": 1, "exit ≠ 0 during a network fault": 1, "exit ≠ 0 with no network fault": 1}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("graceful stops %v; want %v", got, want)
	}
}

// rowAt adds a row of namespace ns acknowledged at acked and returns its seq.
func (b *hb) rowAt(ns uint8, acked time.Duration) int {
	seq := b.row(ns, ackCreated, 0)
	b.h.rows[seq].sent, b.h.rows[seq].acked = acked-ms, acked
	return seq
}

func TestNamespaceProgress(t *testing.T) {
	const s = time.Second
	// n1 and n2 agree from 0 to 60 s: one calm region, [2 s, 60 s). The
	// final heal is at 70 s and the drain ends at 100 s.
	setup := func() *hb {
		b := newHB()
		b.calm(0, 60*s, "n1", "n2")
		b.h.finalHeal, b.h.converged = 70*s, 71*s
		b.h.drain = drainRec{from: 75 * s, to: 100 * s, done: true}
		return b
	}
	progress := func(vs []violation) *violation {
		for i := range vs {
			if vs[i].Invariant == "namespace-progress" {
				return &vs[i]
			}
		}
		return nil
	}

	t.Run("a steady stream of deliveries", func(t *testing.T) {
		b := setup()
		for at := s; at < 90*s; at += s {
			r := b.rowAt(0, at)
			b.deliver(r, 1, at+60*ms, at+100*ms)
		}
		vs, f := check(b.h, checkOpts{})
		wantOnly(t, vs)
		if w := f.LongestWait["a"]; w.Wait != 100*ms {
			t.Errorf("longest wait %+v; want 100ms", w)
		}
		if g := f.LongestStallCalm["a"]; g.to-g.from > s || g.Waiting != 1 {
			t.Errorf("longest calm stall %+v; want under 1 s with 1 row waiting", g)
		}
		if _, ok := f.LongestStallCalm["b"]; ok {
			t.Errorf("namespace b had nothing waiting, yet a stall %+v", f.LongestStallCalm["b"])
		}
	})
	t.Run("rows waiting with no delivery in a calm region", func(t *testing.T) {
		b := setup()
		var waiting []int
		for i := range 3 {
			waiting = append(waiting, b.rowAt(0, 10*s+time.Duration(i)*ms))
		}
		for i, r := range waiting {
			b.deliver(r, nodeIdx(1+i/2), 34*s, 35*s) // 2 from n1, 1 from n2: within the quota
		}
		vs, f := check(b.h, checkOpts{})
		wantOnly(t, vs, "namespace-progress")
		v := progress(vs)
		if v.At != 10*s || !strings.Contains(v.Summary, "namespace a") || !strings.Contains(v.Summary, "3 acknowledged rows waiting") ||
			!strings.Contains(v.Summary, "in a calm region") || !slices.Equal(v.Seqs, waiting) {
			t.Errorf("violation at %v: %s, rows %v", v.At, v.Summary, v.Seqs)
		}
		if g := f.LongestStallCalm["a"]; g.from != 10*s || g.to != 35*s || g.Waiting != 3 {
			t.Errorf("longest calm stall %+v; want 10s–35s with 3 rows", g)
		}
		if w := f.LongestWait["a"]; w.Seq != waiting[0] || w.Wait != 25*s {
			t.Errorf("longest wait %+v", w)
		}
		vs, _ = check(b.h, checkOpts{ProgressBound: 30 * s})
		wantOnly(t, vs)
	})
	t.Run("a delivery of any row of the namespace is progress", func(t *testing.T) {
		b := setup()
		stuck := b.rowAt(0, 10*s)
		b.deliver(stuck, 2, 50*s, 50*s+40*ms)
		for at := 11 * s; at < 60*s; at += 5 * s {
			r := b.rowAt(0, at)
			b.deliver(r, 1, at+10*ms, at+50*ms)
		}
		vs, f := check(b.h, checkOpts{})
		wantOnly(t, vs)
		if w := f.LongestWait["a"]; w.Seq != stuck || w.Wait != 40*s+40*ms {
			t.Errorf("longest wait %+v; want row %d, 40.04 s", w, stuck)
		}
	})
	t.Run("outside calm regions a stall is not one", func(t *testing.T) {
		b := setup()
		b.episode(laneNetwork, 5*s, 40*s)
		r := b.rowAt(0, 10*s)
		b.deliver(r, 2, 34*s, 35*s)
		vs, f := check(b.h, checkOpts{})
		wantOnly(t, vs)
		if _, ok := f.LongestStallCalm["a"]; ok {
			t.Errorf("a stall during a fault counted as calm: %+v", f.LongestStallCalm["a"])
		}
		if f.LongestWait["a"].Wait != 25*s {
			t.Errorf("longest wait %+v; want 25 s", f.LongestWait["a"])
		}
	})
	t.Run("a stall counts from the region's start", func(t *testing.T) {
		b := setup() // the calm region begins at 2 s
		r := b.rowAt(0, 500*ms)
		b.deliver(r, 1, 21*s, 21*s+900*ms) // 19.9 s into the region
		vs, _ := check(b.h, checkOpts{})
		wantOnly(t, vs)
		b = setup()
		r = b.rowAt(0, 500*ms)
		b.deliver(r, 1, 22*s, 22*s+100*ms)
		vs, _ = check(b.h, checkOpts{})
		wantOnly(t, vs, "namespace-progress")
		if v := progress(vs); v.At != 2*s {
			t.Errorf("stall from %v; want the region's start, 2 s", v.At)
		}
	})
	t.Run("a row delivered before its acknowledgement never waits", func(t *testing.T) {
		b := setup()
		r := b.rowAt(0, 30*s)
		b.deliver(r, 1, 10*s, 10*s+40*ms)
		vs, f := check(b.h, checkOpts{})
		wantOnly(t, vs)
		if _, ok := f.LongestWait["a"]; ok {
			t.Errorf("a row delivered before its ack has a wait: %+v", f.LongestWait["a"])
		}
	})
	t.Run("after the final heal", func(t *testing.T) {
		b := setup()
		r := b.rowAt(1, 72*s)
		b.deliver(r, 1, 95*s, 95*s+40*ms)
		vs, _ := check(b.h, checkOpts{})
		wantOnly(t, vs, "namespace-progress")
		if v := progress(vs); !strings.Contains(v.Summary, "namespace b") || !strings.Contains(v.Summary, "after the final heal") {
			t.Errorf("violation: %s", v.Summary)
		}
		// A row never delivered waits to the end of the drain.
		b = setup()
		b.h.drain = drainRec{from: 75 * s, to: 150 * s, missing: 1, why: "no acknowledged row delivered for 1m0s"}
		b.rowAt(1, 80*s)
		vs, _ = check(b.h, checkOpts{})
		wantOnly(t, vs, "namespace-progress", "acknowledged-delivered")
		if v := progress(vs); !strings.Contains(v.Summary, "to the end of the run (1m10s)") {
			t.Errorf("violation: %s", v.Summary)
		}
	})
	t.Run("one violation per namespace, counting its stalls", func(t *testing.T) {
		b := setup()
		for _, at := range []time.Duration{5 * s, 30 * s} {
			r := b.rowAt(0, at)
			b.deliver(r, 1, at+25*s, at+25*s+40*ms)
		}
		vs, _ := check(b.h, checkOpts{})
		wantOnly(t, vs, "namespace-progress")
		if len(vs) != 1 || vs[0].At != 5*s || !strings.Contains(vs[0].Summary, "(2 such stalls)") {
			t.Errorf("violations %+v", vs)
		}
	})
}

func TestStallsIn(t *testing.T) {
	const s = time.Second
	spans := []interval{{1 * s, 5 * s}, {8 * s, 20 * s}}
	ends := []time.Duration{2 * s, 3 * s, 5 * s, 9 * s, 30 * s}
	got := stallsIn(spans, ends, interval{0, 12 * s})
	want := []interval{{1 * s, 2 * s}, {2 * s, 3 * s}, {3 * s, 5 * s}, {8 * s, 9 * s}, {9 * s, 12 * s}}
	if !slices.Equal(got, want) {
		t.Fatalf("stalls %v; want %v", got, want)
	}
	if got := stallsIn(spans, ends, interval{5 * s, 8 * s}); len(got) != 0 {
		t.Fatalf("stalls %v between the spans; want none", got)
	}
	if got := unionIntervals([]interval{{5, 7}, {1, 3}, {2, 4}, {7, 8}, {9, 9}}); !slices.Equal(got, []interval{{1, 4}, {5, 8}}) {
		t.Fatalf("union %v", got)
	}
}

func TestExposure(t *testing.T) {
	b := newHB()
	// Under-replicated shards summed over the answering nodes, a sample
	// every 250 ms; nil: no node answered.
	sums := []any{0, 2, 1, 0, 0, 3, 3, 3, nil, 3, 0, 1}
	for i, sum := range sums {
		s := viewSample{At: time.Duration(i) * 250 * ms, Views: map[string]nodeView{}, Expect: []string{"n1", "n2"}}
		if n, ok := sum.(int); ok {
			s.Views["n1"] = nodeView{UnderReplicated: n}
			s.Views["n2"] = nodeView{}
		}
		b.h.samples = append(b.h.samples, s)
	}
	got, at := exposure(b.h)
	if got != 1250*ms || at != 1250*ms {
		t.Fatalf("longest exposure %v at %v; want 1.25s at 1.25s (samples 5–9, the unanswered one skipped)", got, at)
	}
	b.h.samples = b.h.samples[:10] // ends under-replicated
	if got, at = exposure(b.h); got != time.Second || at != 1250*ms {
		t.Fatalf("open at the end: %v at %v; want 1s at 1.25s", got, at)
	}
	_, f := check(b.h, checkOpts{})
	if f.Exposure != time.Second {
		t.Fatalf("figure %v", f.Exposure)
	}
	if s := formatFigures(f, b.h); !strings.Contains(s, "R = 2 exposure: longest under-replicated stretch 1.0 s, at 1.250s") {
		t.Fatalf("figures do not show the exposure:\n%s", s)
	}
}

func TestLeaveWatch(t *testing.T) {
	const s = time.Second
	st := func(left int) leaveStatus { return leaveStatus{ShardsLeft: left, LastError: "n3: connection refused"} }
	t.Run("the grace, then a stall's length from the SIGTERM", func(t *testing.T) {
		w := newLeaveWatch(20*s, 60*s, 5*time.Minute)
		w.observe(s, st(40), true)
		for _, at := range []time.Duration{10 * s, 20 * s, 59 * s} {
			if why := w.giveUp(at); why != "" {
				t.Fatalf("gave up at %v: %s", at, why)
			}
		}
		if why := w.giveUp(60 * s); !strings.Contains(why, "no hand-off progress") || !strings.Contains(why, "shards_left 40") || !strings.Contains(why, "connection refused") {
			t.Fatalf("at 60 s: %q", why)
		}
	})
	t.Run("progress keeps it waiting, up to the limit", func(t *testing.T) {
		w := newLeaveWatch(20*s, 60*s, 5*time.Minute)
		left := 1000
		for at := s; at < 5*time.Minute; at += 30 * s {
			w.observe(at, st(left), true)
			left--
			if why := w.giveUp(at); why != "" {
				t.Fatalf("gave up at %v: %s", at, why)
			}
		}
		if why := w.giveUp(5 * time.Minute); !strings.Contains(why, "in all") {
			t.Fatalf("at the limit: %q", why)
		}
	})
	t.Run("no answer, no leave, or shards_left not below its lowest is no progress", func(t *testing.T) {
		w := newLeaveWatch(20*s, 60*s, 5*time.Minute)
		w.observe(s, st(50), true)
		w.observe(30*s, st(40), true) // progress at 30 s
		w.observe(40*s, st(45), true)
		w.observe(50*s, st(40), true)
		w.observe(60*s, leaveStatus{}, false)
		if why := w.giveUp(89 * s); why != "" {
			t.Fatalf("gave up at 89 s: %s", why)
		}
		if why := w.giveUp(90 * s); why == "" {
			t.Fatalf("still waiting 60 s after the last progress")
		}
	})
	t.Run("rows handed off count as progress while shards_left stands", func(t *testing.T) {
		w := newLeaveWatch(20*s, 60*s, 5*time.Minute)
		w.observe(s, leaveStatus{ShardsLeft: 800, RowsHandedOff: 0}, true)
		w.observe(50*s, leaveStatus{ShardsLeft: 800, RowsHandedOff: 9000}, true) // a long pass, mid-way
		w.observe(70*s, leaveStatus{ShardsLeft: 800, RowsHandedOff: 9000}, true)
		if why := w.giveUp(109 * s); why != "" {
			t.Fatalf("gave up 59 s after rows were handed off: %s", why)
		}
		if why := w.giveUp(110 * s); !strings.Contains(why, "rows_handed_off 9000") {
			t.Fatalf("at 110 s: %q", why)
		}
	})
	t.Run("a grace longer than a stall", func(t *testing.T) {
		w := newLeaveWatch(90*s, 60*s, 5*time.Minute)
		if why := w.giveUp(80 * s); why != "" {
			t.Fatalf("gave up within the grace: %s", why)
		}
		if why := w.giveUp(90 * s); !strings.Contains(why, "no leave status read") {
			t.Fatalf("after the grace: %q", why)
		}
	})
}

func TestGracefulStopsCutShort(t *testing.T) {
	b := newHB()
	ev := func(at time.Duration, kind eventKind, node, detail string) {
		b.h.events = append(b.h.events, event{At: at, Kind: kind, Nodes: []string{node}, Detail: detail})
	}
	ev(1*time.Second, evTerm, "n1", "SIGTERM")
	ev(61*time.Second, evTerm, "n1", "second SIGTERM 1m0s after the first: no hand-off progress for 1m0s")
	ev(62*time.Second, evExit, "n1", "exit code 1 after 1m1s, a second SIGTERM at 1m0s")
	ev(70*time.Second, evTerm, "n2", "SIGTERM")
	ev(130*time.Second, evTerm, "n2", "second SIGTERM")
	ev(145*time.Second, evKill, "n2", "SIGKILL: still running 15s after the second SIGTERM")
	ev(150*time.Second, evKill, "n3", "SIGKILL (process reaped)") // a kill nemesis, no stop
	ev(200*time.Second, evTerm, "n2", "SIGTERM")
	ev(201*time.Second, evExit, "n2", "exit code 0 after 1s")
	got := gracefulStops(b.h)
	want := map[string]int{"cut short by a second SIGTERM": 1, "killed": 1, "exit 0": 1}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("graceful stops %v; want %v", got, want)
	}
}

func TestFormatFigures(t *testing.T) {
	b := newHB()
	b.calm(0, 60*time.Second, "n1", "n2")
	r := b.rowAt(0, 10*time.Second)
	b.deliver(r, 1, 13*time.Second, 13*time.Second+40*ms)
	b.h.drain = drainRec{from: 75 * time.Second, to: 87 * time.Second, done: true}
	_, f := check(b.h, checkOpts{})
	out := formatFigures(f, b.h)
	for _, want := range []string{
		"longest stall of a namespace with rows waiting, while calm: a 3.04s from 10.000s (1 rows waiting); b none",
		"longest wait of a row for its first delivery: a 3.04s (a-0, acknowledged at 10.000s); b none",
		"drain after the final heal: 12s",
		"R = 2 exposure: longest under-replicated stretch none",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("figures lack %q:\n%s", want, out)
		}
	}
	b.h.drain = drainRec{from: 75 * time.Second, to: 135 * time.Second, missing: 4, why: "no acknowledged row delivered for 1m0s"}
	_, f = check(b.h, checkOpts{})
	if out := formatFigures(f, b.h); !strings.Contains(out, "drain after the final heal: gave up after 1m0s (no acknowledged row delivered for 1m0s), 4 acknowledged rows undelivered") {
		t.Errorf("figures of a drain that gave up:\n%s", out)
	}
}
