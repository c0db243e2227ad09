package chaos

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
)

// checkOpts are the documented bounds the checkers hold the run to.
type checkOpts struct {
	// InFlightBound is the most concurrent deliveries of a namespace with
	// quota q the target may see while nodes members are running; calm is
	// true while every node has agreed on one view for a while (see
	// CalmSettle), false during faults, ownership changes and right after
	// them. Defaults to documentedInFlightBound. Exact quotas can pass a
	// tighter function.
	InFlightBound func(q, nodes int, calm bool) int
	// CalmSettle is how long every node must have agreed on one view before
	// the calm bound applies: claims made under an older view finish
	// first. Defaults to 2 s.
	CalmSettle time.Duration
	// SettleLag is the longest a node may take between the target's answer
	// and committing the row done; a kill or pause in that gap explains a
	// repeat delivery. Defaults to 10 s.
	SettleLag time.Duration
	// ConvergeBound is how long after the last fault heals every node must
	// agree on one shard table (the failure-detection bound of the gossip
	// profile, plus a re-join round). Defaults to 10 s.
	ConvergeBound time.Duration
	// GoroutineSlack and FDSlack are how many goroutines not explained by
	// open connections, and non-socket fds, a surviving process may have
	// gained across the run. Default to 10 and 2.
	GoroutineSlack, FDSlack int
	// PollEvery is the monitor's poll period: a membership split it saw
	// may have begun or ended that much outside its samples. Defaults to
	// 250 ms (the run's monitorEvery).
	PollEvery time.Duration
	// ProgressBound is the longest a namespace with acknowledged rows
	// waiting may go without a delivery during a calm region or after the
	// final heal (checkProgress). Defaults to 20 s: after an ownership
	// change two waits hold a namespace's rows back, a new lease
	// coordinator's learning period of one lease length (10 s), in which
	// it grants only what nodes already hold, and a new primary's handover
	// wait of up to the delivery timeout + 5 s (10 s here) before it claims
	// from a shard; 20 s covers both one after the other, and a calm
	// region's CalmSettle and the poll loops' periods are the margin.
	ProgressBound time.Duration
}

// documentedInFlightBound is README "Guarantees, stated honestly" today:
// each node enforces ceil(q × owned/total), so N nodes that agree on one
// view admit at most q + N − 1; during an ownership change the old and the
// new owner overlap and under a partition each side enforces the quota on
// its own, so up to twice that.
func documentedInFlightBound(q, nodes int, calm bool) int {
	b := q + max(nodes, 1) - 1
	if calm {
		return b
	}
	return 2 * b
}

func (o checkOpts) withDefaults() checkOpts {
	if o.InFlightBound == nil {
		o.InFlightBound = documentedInFlightBound
	}
	o.CalmSettle = cmp.Or(o.CalmSettle, 2*time.Second)
	o.SettleLag = cmp.Or(o.SettleLag, 10*time.Second)
	o.ConvergeBound = cmp.Or(o.ConvergeBound, 10*time.Second)
	o.PollEvery = cmp.Or(o.PollEvery, 250*time.Millisecond)
	o.ProgressBound = cmp.Or(o.ProgressBound, 20*time.Second)
	o.GoroutineSlack = cmp.Or(o.GoroutineSlack, 10)
	o.FDSlack = cmp.Or(o.FDSlack, 2)
	return o
}

// violation is one broken invariant.
type violation struct {
	Invariant string
	At        time.Duration // when it happened; -1: found at the end
	Summary   string
	Seqs      []int // rows involved (at most a few)
	Detail    string
}

// figures are the run's numbers (BENCHMARKS.md records them).
type figures struct {
	Faults          map[faultKind]int
	RowsSent        int
	RowsAcked       int
	ByAck           map[ackStatus]int
	Deliveries      int // answered 200
	Abandoned       int // the sender went away first
	Duplicates      int // repeat deliveries (answered 200 more than once)
	DupByCause      map[string]int
	MaxInFlight     map[string]int // namespace → max concurrent at the target
	MaxInFlightCalm map[string]int
	MaxNodeInFlight map[string]int // namespace → max from one node
	// GracefulStops counts SIGTERM stops by outcome (gracefulStops): "exit
	// 0", "cut short by a second SIGTERM" (the leave made no progress; its
	// rows wait on disk for the node's return, README "Operations"), "exit
	// ≠ 0 during a network fault", "exit ≠ 0 with no network fault",
	// "killed".
	GracefulStops     map[string]int
	Converged         time.Duration // after the last heal (-1: never)
	MaxEpisodeConverg time.Duration // longest wait for agreement after a fault healed with no other fault active
	// LongestStallCalm is, per namespace, the longest stretch inside calm
	// regions in which it had acknowledged rows waiting and no delivery of
	// it ended (checkProgress).
	LongestStallCalm map[string]stall
	// LongestWait is, per namespace, the row that waited longest from its
	// acknowledgement to the end of its first delivery.
	LongestWait map[string]rowWait
	// Drain is the drain after the final heal (history.drain).
	Drain drainRec
	// Exposure is the longest stretch of the monitor's samples in which the
	// nodes reported under-replicated shards, and when it began (exposure).
	Exposure, ExposureAt time.Duration
}

// stall is a stretch in which a namespace had rows waiting and no delivery
// of it ended.
type stall struct {
	interval
	Waiting int // acknowledged rows waiting during it
}

// rowWait is how long one row waited for its first delivery.
type rowWait struct {
	Seq  int
	Wait time.Duration
}

// check runs every checker on h and returns the violations, earliest
// first, and the run's figures.
func check(h *history, o checkOpts) ([]violation, figures) {
	o = o.withDefaults()
	f := figures{Faults: map[faultKind]int{}, ByAck: map[ackStatus]int{}, DupByCause: map[string]int{},
		MaxInFlight: map[string]int{}, MaxInFlightCalm: map[string]int{}, MaxNodeInFlight: map[string]int{},
		LongestStallCalm: map[string]stall{}, LongestWait: map[string]rowWait{}, Drain: h.drain}
	var vs []violation
	vs = append(vs, checkProcesses(h)...)
	vs = append(vs, checkDelivered(h, &f)...)
	vs = append(vs, checkDuplicates(h, o, &f)...)
	vs = append(vs, checkInFlight(h, o, &f)...)
	vs = append(vs, checkConvergence(h, o, &f)...)
	vs = append(vs, checkProgress(h, o, &f)...)
	vs = append(vs, checkLeaks(h, o)...)
	f.Exposure, f.ExposureAt = exposure(h)
	for _, e := range h.events {
		if e.Kind == evEpisode {
			f.Faults[faultKind(strings.Fields(e.Detail)[0])]++
		}
	}
	f.GracefulStops = gracefulStops(h)
	sort.SliceStable(vs, func(i, j int) bool {
		ai, aj := vs[i].At, vs[j].At
		if ai < 0 {
			ai = 1 << 62
		}
		if aj < 0 {
			aj = 1 << 62
		}
		return ai < aj
	})
	return vs, f
}

// gracefulStops classifies every graceful stop of the timeline, from its
// first SIGTERM to the exit: "exit 0", "cut short by a second SIGTERM",
// "exit ≠ 0 during a network fault", "exit ≠ 0 with no network fault", or
// "killed" (a SIGKILL ended it, no exit was recorded).
func gracefulStops(h *history) map[string]int {
	out := map[string]int{}
	netEps := networkEpisodes(h.events)
	type stop struct {
		from   time.Duration
		second bool
	}
	open := map[string]*stop{}
	for _, e := range h.events {
		if len(e.Nodes) != 1 {
			continue
		}
		n := e.Nodes[0]
		switch e.Kind {
		case evTerm:
			if s, ok := open[n]; ok {
				s.second = true
			} else {
				open[n] = &stop{from: e.At}
			}
		case evKill:
			if _, ok := open[n]; ok {
				out["killed"]++
				delete(open, n)
			}
		case evExit:
			s, ok := open[n]
			if !ok {
				continue
			}
			delete(open, n)
			var code int
			if _, err := fmt.Sscanf(e.Detail, "exit code %d", &code); err != nil {
				continue
			}
			switch {
			case code == 0:
				out["exit 0"]++
			case s.second:
				out["cut short by a second SIGTERM"]++
			case overlaps(netEps, interval{s.from, e.At}):
				out["exit ≠ 0 during a network fault"]++
			default:
				out["exit ≠ 0 with no network fault"]++
			}
		}
	}
	return out
}

// networkEpisodes returns the network lane's episodes of the timeline; one
// still open lasts forever.
func networkEpisodes(evs []event) []interval {
	var out []interval
	open := time.Duration(-1)
	for _, e := range evs {
		if e.Lane != laneNetwork {
			continue
		}
		if e.Kind == evEpisode {
			open = e.At
		} else if e.Kind == evEpisodeE && open >= 0 {
			out = append(out, interval{open, e.At})
			open = -1
		}
	}
	if open >= 0 {
		out = append(out, interval{open, 1 << 62})
	}
	return out
}

func overlaps(ivs []interval, iv interval) bool {
	for _, x := range ivs {
		if iv.from < x.to && x.from < iv.to {
			return true
		}
	}
	return false
}

// checkProcesses: no node process exits unless the nemesis stopped it.
func checkProcesses(h *history) []violation {
	var vs []violation
	for _, e := range h.events {
		if e.Kind == evCrash {
			vs = append(vs, violation{Invariant: "no-crash", At: e.At,
				Summary: fmt.Sprintf("node %s exited on its own (%s)", strings.Join(e.Nodes, ","), e.Detail)})
		}
	}
	return vs
}

// checkDelivered: every acknowledged row is delivered; every row sent is
// acknowledged before the load's deadline; nothing never appended is
// delivered.
func checkDelivered(h *history, f *figures) []violation {
	var vs []violation
	delivered := make([]int, len(h.rows))
	for _, d := range h.deliveries {
		if !d.ok {
			f.Abandoned++
			continue
		}
		f.Deliveries++
		if d.seq < 0 || d.seq >= len(h.rows) || h.rows[d.seq].tries == 0 {
			vs = append(vs, violation{Invariant: "no-phantom", At: d.start,
				Summary: fmt.Sprintf("row #%d delivered but never appended by the load", d.seq)})
			continue
		}
		delivered[d.seq]++
	}
	for _, s := range h.strays {
		vs = append(vs, violation{Invariant: "no-phantom", At: -1, Summary: fmt.Sprintf("delivery of dispatch_key %q, not a key of this run", s)})
	}
	var missing, unacked []int
	for seq, r := range h.rows {
		if r.tries == 0 {
			continue
		}
		f.RowsSent++
		f.ByAck[r.ack]++
		if r.ack == ackNone {
			unacked = append(unacked, seq)
			continue
		}
		f.RowsAcked++
		if delivered[seq] == 0 {
			missing = append(missing, seq)
		}
	}
	if len(missing) > 0 {
		sort.Slice(missing, func(i, j int) bool { return h.rows[missing[i]].acked < h.rows[missing[j]].acked })
		vs = append(vs, violation{Invariant: "acknowledged-delivered", At: h.rows[missing[0]].acked,
			Summary: fmt.Sprintf("%d of %d acknowledged rows were never delivered", len(missing), f.RowsAcked),
			Seqs:    firstInts(missing, 8)})
	}
	if len(unacked) > 0 {
		vs = append(vs, violation{Invariant: "appends-acknowledged", At: h.rows[unacked[0]].sent,
			Summary: fmt.Sprintf("%d of %d rows sent were never acknowledged before the load's deadline", len(unacked), f.RowsSent),
			Seqs:    firstInts(unacked, 8)})
	}
	return vs
}

// procEvent is a kill or a pause of a node, for duplicate attribution.
type procEvent struct {
	at   time.Duration
	kind eventKind // evKill, evStop or evTerm
	node string
	// explained counts the repeat deliveries it explains.
	explained int
}

// checkDuplicates attributes every repeat delivery of a row (a second
// delivery answered 200) to a cause the README allows, and bounds each:
//
//   - a SIGKILL (or a pause) of the node that made the previous delivery,
//     between its start and the repeat, within SettleLag of its answer: the
//     node had claimed the row and not committed done (README "Crash": its
//     claims are re-armed). Per kill or pause, at most the rows it could
//     have had claimed: the sum of its per-node ceilings, each at most the
//     namespace's quota.
//   - an append that failed and was retried, or was answered "accepted"
//     (the receiving node held the row because the owner did not answer;
//     the owner may have stored it too): each such attempt may leave a copy
//     that is delivered (README "Network partition": at-least-once, the
//     target deduplicates).
//   - a partition between the two delivering nodes: with replicated shards
//     both sides hold the row and each side's primary delivers what it
//     holds (README "Replicated shards": at-least-once under a partition;
//     repair merges the copies after the heal). The split must overlap the
//     span between the two deliveries, widened by SettleLag on each side
//     (failure detection before, shipping and repair after). Such pairs may
//     also overlap in time: two claimers, one per side. A split is a cut
//     the nemesis installed, a pause (the paused node is failed over, and
//     acts on its old view for a moment after SIGCONT), or two running
//     nodes the monitor saw not listing each other as members (a false
//     suspicion under load splits the membership just the same).
//
// A repeat a partition explains is counted as the partition's, before a
// kill or a pause of the first deliverer is considered, so only the
// repeats nothing else explains count against a kill's or a pause's
// bound. Anything else is a violation, as are two concurrent deliveries
// of a row appended once (two claimers).
func checkDuplicates(h *history, o checkOpts, f *figures) []violation {
	var vs []violation
	perNode := map[string][]*procEvent{}
	for _, e := range h.events {
		if e.Kind == evKill || e.Kind == evStop || e.Kind == evTerm {
			for _, n := range e.Nodes {
				perNode[n] = append(perNode[n], &procEvent{at: e.At, kind: e.Kind, node: n})
			}
		}
	}
	sumQuota := 0
	for _, ns := range h.namespaces {
		sumQuota += ns.Quota
	}
	bySeq := map[int][]delivery{}
	for _, d := range h.deliveries {
		if d.ok && d.seq >= 0 && d.seq < len(h.rows) {
			bySeq[d.seq] = append(bySeq[d.seq], d)
		}
	}
	splits := splitsOf(h, o)
	var unexplained, concurrent []int
	var firstUnexplained, firstConcurrent time.Duration = -1, -1
	for seq, ds := range bySeq {
		if len(ds) < 2 {
			continue
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i].start < ds[j].start })
		r := h.rows[seq]
		allowance := int(r.failed)
		if r.ack == ackAccepted {
			allowance++
		}
		for j := 1; j < len(ds); j++ {
			prev, cur := ds[j-1], ds[j]
			f.Duplicates++
			split := false
			for _, c := range splits {
				if c.from-o.SettleLag <= cur.start && prev.start <= c.to+o.SettleLag &&
					c.separates(h.nodeName(prev.node), h.nodeName(cur.node)) {
					split = true
					break
				}
			}
			if cur.start < prev.end && allowance == 0 && !split {
				concurrent = append(concurrent, seq)
				if firstConcurrent < 0 || cur.start < firstConcurrent {
					firstConcurrent = cur.start
				}
			}
			cause := ""
			var first *procEvent
			for _, pe := range perNode[h.nodeName(prev.node)] {
				if pe.at >= prev.start {
					first = pe
					break
				}
			}
			// A partition between the two deliverers explains the repeat
			// first: each side delivers what it holds, whatever else
			// happened to the first deliverer meanwhile, so such repeats do
			// not count against a kill's or a pause's bound.
			if split {
				cause = "partition"
			} else if first != nil && first.kind != evTerm && first.at < cur.start && first.at-prev.end <= o.SettleLag {
				first.explained++
				cause = map[eventKind]string{evKill: "kill", evStop: "pause"}[first.kind]
			} else if allowance > 0 {
				allowance--
				cause = "retried append"
				if r.failed == 0 {
					cause = "accepted (held on a failed forward)"
				}
			}
			if cause == "" {
				unexplained = append(unexplained, seq)
				if firstUnexplained < 0 || cur.start < firstUnexplained {
					firstUnexplained = cur.start
				}
				cause = "unexplained"
			}
			f.DupByCause[cause]++
		}
	}
	if len(unexplained) > 0 {
		sort.Ints(unexplained)
		vs = append(vs, violation{Invariant: "duplicates-explained", At: firstUnexplained,
			Summary: fmt.Sprintf("%d repeat deliveries of %d rows not explained by a kill, a pause, a retried append or a partition", f.DupByCause["unexplained"], len(unexplained)),
			Seqs:    firstInts(unexplained, 8)})
	}
	if len(concurrent) > 0 {
		sort.Ints(concurrent)
		vs = append(vs, violation{Invariant: "one-claimer", At: firstConcurrent,
			Summary: fmt.Sprintf("%d rows appended once were in flight twice at the same time (two claimers)", len(concurrent)),
			Seqs:    firstInts(concurrent, 8)})
	}
	for _, pes := range perNode {
		for _, pe := range pes {
			if pe.explained > sumQuota {
				vs = append(vs, violation{Invariant: "duplicates-bounded", At: pe.at,
					Summary: fmt.Sprintf("%s of %s explains %d repeat deliveries; it could have had at most %d rows claimed (the sum of the quotas)",
						pe.kind, pe.node, pe.explained, sumQuota)})
			}
		}
	}
	return vs
}

// splitsOf returns every membership split of the run: the nemesis's cuts,
// each pause (the paused node against every other), and each stretch of
// the monitor's samples in which one running node did not list another
// as a member (widened by a poll period on each side, the samples' blind
// spots).
func splitsOf(h *history, o checkOpts) []cut {
	out := slices.Clone(h.cuts)
	stopped := map[string]time.Duration{}
	for _, e := range h.events {
		for _, n := range e.Nodes {
			switch e.Kind {
			case evStop:
				stopped[n] = e.At
			case evCont, evKill:
				if from, ok := stopped[n]; ok {
					out = append(out, cut{from: from, to: e.At, sideA: []string{n}, sideB: othersThan(h, n)})
					delete(stopped, n)
				}
			}
		}
	}
	type pair struct{ a, b string }
	open := map[pair]time.Duration{}
	last := map[pair]time.Duration{}
	for _, s := range h.samples {
		seen := map[pair]bool{}
		for a, v := range s.Views {
			for _, b := range s.Expect {
				if b != a && !strings.Contains(","+v.Members, ","+b+":") {
					p := pair{a, b}
					seen[p] = true
					if _, ok := open[p]; !ok {
						open[p] = s.At
					}
					last[p] = s.At
				}
			}
		}
		for p, from := range open {
			if !seen[p] {
				out = append(out, cut{from: from - o.PollEvery, to: last[p] + o.PollEvery, sideA: []string{p.a}, sideB: []string{p.b}})
				delete(open, p)
			}
		}
	}
	for p, from := range open {
		out = append(out, cut{from: from - o.PollEvery, to: last[p] + o.PollEvery, sideA: []string{p.a}, sideB: []string{p.b}})
	}
	return out
}

// othersThan returns every node of the run but n.
func othersThan(h *history, n string) []string {
	var out []string
	for _, m := range h.nodes {
		if m != "" && m != n {
			out = append(out, m)
		}
	}
	return out
}

// interval is [from, to).
type interval struct{ from, to time.Duration }

// calmRegion is a stretch where every node agreed on one view of n members.
type calmRegion struct {
	interval
	n int
}

// calmRegions derives, from the monitor's samples and the nemesis
// episodes, where the calm bound applies: between two consecutive samples
// in which every expected node answered with the same member set (all of
// them, active) and an unchanged ownership version, outside every
// episode, from CalmSettle after such a stretch begins.
func calmRegions(h *history, settle time.Duration) []calmRegion {
	var episodes []interval
	open := map[string]time.Duration{}
	for _, e := range h.events {
		switch e.Kind {
		case evEpisode:
			open[e.Lane] = e.At
		case evEpisodeE:
			if at, ok := open[e.Lane]; ok {
				episodes = append(episodes, interval{at, e.At})
				delete(open, e.Lane)
			}
		}
	}
	for _, at := range open {
		episodes = append(episodes, interval{at, 1 << 62})
	}
	inEpisode := func(iv interval) bool {
		for _, ep := range episodes {
			if iv.from < ep.to && ep.from < iv.to {
				return true
			}
		}
		return false
	}
	var out []calmRegion
	var cur *calmRegion
	for i := 0; i+1 < len(h.samples); i++ {
		a, b := h.samples[i], h.samples[i+1]
		iv := interval{a.At, b.At}
		ok := a.agreed() && b.agreed() && strings.Join(a.Expect, ",") == strings.Join(b.Expect, ",") && !inEpisode(iv)
		if ok {
			for n, va := range a.Views {
				if vb, found := b.Views[n]; !found || vb.Version != va.Version {
					ok = false
				}
			}
		}
		if !ok {
			cur = nil
			continue
		}
		if cur != nil && cur.to == a.At {
			cur.to = b.At
			out[len(out)-1] = *cur
			continue
		}
		out = append(out, calmRegion{interval{a.At, b.At}, len(a.Expect)})
		cur = &out[len(out)-1]
	}
	// Claims made under the previous view finish within settle.
	var settled []calmRegion
	for _, r := range out {
		if r.to-r.from > settle {
			r.from += settle
			settled = append(settled, r)
		}
	}
	return settled
}

// maxProcesses is the most node processes alive at once in the run.
func maxProcesses(h *history) int {
	alive := map[string]bool{}
	best := 0
	for _, e := range h.events {
		switch e.Kind {
		case evStart:
			for _, n := range e.Nodes {
				alive[n] = true
			}
		case evKill, evExit, evCrash:
			for _, n := range e.Nodes {
				delete(alive, n)
			}
		}
		best = max(best, len(alive))
	}
	return best
}

// checkInFlight bounds concurrent deliveries per namespace at the target
// (a request counts from its arrival until the target starts its answer:
// delivery.busyUntil): from one node never above the quota (a node's ceiling is at most the
// quota); from the whole cluster never above InFlightBound (calm while
// every node agrees, otherwise the disturbed bound at the most processes
// the run had at once).
func checkInFlight(h *history, o checkOpts, f *figures) []violation {
	var vs []violation
	calm := calmRegions(h, o.CalmSettle)
	nmax := maxProcesses(h)
	type edge struct {
		at    time.Duration
		delta int
		i     int // index into h.deliveries
	}
	for nsi, ns := range h.namespaces {
		var edges []edge
		for i, d := range h.deliveries {
			if int(d.ns) != nsi {
				continue
			}
			edges = append(edges, edge{d.start, +1, i}, edge{d.busyUntil(), -1, i})
		}
		// Ends before starts at the same instant: a request answered as
		// another arrives is not concurrent with it.
		sort.Slice(edges, func(a, b int) bool {
			if edges[a].at != edges[b].at {
				return edges[a].at < edges[b].at
			}
			return edges[a].delta < edges[b].delta
		})
		open := map[int]bool{}
		perNode := map[nodeIdx]int{}
		ci := 0
		var clusterV, nodeV *violation
		for _, e := range edges {
			d := h.deliveries[e.i]
			if e.delta < 0 {
				delete(open, e.i)
				perNode[d.node]--
				continue
			}
			open[e.i] = true
			perNode[d.node]++
			n := len(open)
			f.MaxInFlight[ns.Name] = max(f.MaxInFlight[ns.Name], n)
			f.MaxNodeInFlight[ns.Name] = max(f.MaxNodeInFlight[ns.Name], perNode[d.node])
			for ci < len(calm) && calm[ci].to <= e.at {
				ci++
			}
			isCalm := ci < len(calm) && calm[ci].from <= e.at
			var bound int
			if isCalm {
				bound = o.InFlightBound(ns.Quota, calm[ci].n, true)
				f.MaxInFlightCalm[ns.Name] = max(f.MaxInFlightCalm[ns.Name], n)
			} else {
				bound = o.InFlightBound(ns.Quota, nmax, false)
			}
			if n > bound && clusterV == nil {
				what := fmt.Sprintf("disturbed: a fault or an ownership change, up to %d processes", nmax)
				if isCalm {
					what = fmt.Sprintf("calm: %d nodes agreeing on one view since %.3fs", calm[ci].n, calm[ci].from.Seconds())
				}
				clusterV = &violation{Invariant: "in-flight-bound", At: e.at,
					Summary: fmt.Sprintf("namespace %s (quota %d): %d deliveries in flight at the target, bound %d (%s)", ns.Name, ns.Quota, n, bound, what),
					Seqs:    openSeqs(h, open, 8), Detail: inFlightBySender(h, open)}
			}
			if perNode[d.node] > ns.Quota && nodeV == nil {
				nodeV = &violation{Invariant: "node-in-flight-bound", At: e.at,
					Summary: fmt.Sprintf("namespace %s (quota %d): %d deliveries in flight from %s alone (a node's ceiling is at most the quota)",
						ns.Name, ns.Quota, perNode[d.node], h.nodeName(d.node)),
					Seqs: openSeqs(h, open, 8), Detail: inFlightBySender(h, open)}
			}
		}
		for _, v := range []*violation{clusterV, nodeV} {
			if v != nil {
				vs = append(vs, *v)
			}
		}
	}
	return vs
}

func openSeqs(h *history, open map[int]bool, n int) []int {
	var out []int
	for i := range open {
		out = append(out, h.deliveries[i].seq)
	}
	sort.Ints(out)
	return firstInts(out, n)
}

func inFlightBySender(h *history, open map[int]bool) string {
	by := map[string]int{}
	for i := range open {
		by[h.nodeName(h.deliveries[i].node)]++
	}
	var parts []string
	for n, c := range by {
		parts = append(parts, fmt.Sprintf("%s %d", n, c))
	}
	sort.Strings(parts)
	return "in flight by sender: " + strings.Join(parts, ", ")
}

// checkConvergence: after the last fault heals, every node agrees on one
// shard table within ConvergeBound.
func checkConvergence(h *history, o checkOpts, f *figures) []violation {
	f.Converged = -1
	// Per episode that ended with the other lane idle: from its end to the
	// first sample where all agree (a figure, not an invariant).
	open := map[string]bool{}
	for _, e := range h.events {
		switch e.Kind {
		case evEpisode:
			open[e.Lane] = true
			continue
		case evEpisodeE:
			delete(open, e.Lane)
		default:
			continue
		}
		if len(open) > 0 {
			continue
		}
		for _, s := range h.samples {
			if s.At >= e.At && s.agreed() {
				f.MaxEpisodeConverg = max(f.MaxEpisodeConverg, s.At-e.At)
				break
			}
		}
	}
	if h.converged <= 0 {
		return []violation{{Invariant: "convergence", At: h.finalHeal,
			Summary: "the nodes never agreed on one shard table after the last fault healed"}}
	}
	took := h.converged - h.finalHeal
	f.Converged = took
	if took > o.ConvergeBound {
		return []violation{{Invariant: "convergence", At: h.finalHeal,
			Summary: fmt.Sprintf("the nodes agreed on one shard table %v after the last fault healed; bound %v", took.Round(time.Millisecond), o.ConvergeBound)}}
	}
	return nil
}

// checkProgress: during every calm region and after the final heal, a
// namespace with acknowledged rows waiting (acknowledged, the first
// delivery not yet ended; a row delivered before its acknowledgement never
// waits) has a delivery end at least every ProgressBound, counted from the
// later of the waiting's start and the region's: with every node agreeing
// on one view, some node claims its rows (lease grants rotate between the
// nodes that want them). One violation per namespace names its first
// stall. The longest stall inside calm regions and the longest any row
// waited are figures.
func checkProgress(h *history, o checkOpts, f *figures) []violation {
	var regions []interval
	calm := calmRegions(h, o.CalmSettle)
	for _, c := range calm {
		regions = append(regions, c.interval)
	}
	if end := h.end(); end > h.finalHeal {
		regions = append(regions, interval{h.finalHeal, end})
	}
	regions = unionIntervals(regions)
	firstEnd := map[int]time.Duration{}
	ends := make([][]time.Duration, len(h.namespaces))
	for _, d := range h.deliveries {
		if !d.ok || int(d.ns) >= len(h.namespaces) {
			continue
		}
		ends[d.ns] = append(ends[d.ns], d.end)
		if d.seq >= 0 && d.seq < len(h.rows) {
			if e, ok := firstEnd[d.seq]; !ok || d.end < e {
				firstEnd[d.seq] = d.end
			}
		}
	}
	const never = time.Duration(1 << 62)
	type wait struct {
		interval
		seq int
	}
	waits := make([][]wait, len(h.namespaces))
	for seq, r := range h.rows {
		if r.ack == ackNone || r.tries == 0 || int(r.ns) >= len(h.namespaces) {
			continue
		}
		e, ok := firstEnd[seq]
		if !ok {
			e = never
		}
		if e <= r.acked {
			continue
		}
		waits[r.ns] = append(waits[r.ns], wait{interval{r.acked, e}, seq})
		name := h.namespaces[r.ns].Name
		if ok && e-r.acked > f.LongestWait[name].Wait {
			f.LongestWait[name] = rowWait{Seq: seq, Wait: e - r.acked}
		}
	}
	var vs []violation
	for nsi, ns := range h.namespaces {
		ws := waits[nsi]
		sort.Slice(ws, func(i, j int) bool { return ws[i].from < ws[j].from })
		var spans []interval
		for _, w := range ws {
			spans = append(spans, w.interval)
		}
		spans = unionIntervals(spans)
		es := ends[nsi]
		slices.Sort(es)
		waiting := func(iv interval) (n int, seqs []int) {
			for _, w := range ws {
				if w.from < iv.to && w.to > iv.from {
					n++
					if len(seqs) < 8 {
						seqs = append(seqs, w.seq)
					}
				}
			}
			return n, seqs
		}
		var longest interval
		for _, c := range calm {
			for _, g := range stallsIn(spans, es, c.interval) {
				if g.to-g.from > longest.to-longest.from {
					longest = g
				}
			}
		}
		if longest.to > longest.from {
			n, _ := waiting(longest)
			f.LongestStallCalm[ns.Name] = stall{longest, n}
		}
		var over []interval
		for _, reg := range regions {
			for _, g := range stallsIn(spans, es, reg) {
				if g.to-g.from > o.ProgressBound {
					over = append(over, g)
				}
			}
		}
		if len(over) == 0 {
			continue
		}
		g := over[0]
		n, seqs := waiting(g)
		where := "in a calm region"
		if g.from >= h.finalHeal {
			where = "after the final heal"
		}
		to := fmt.Sprintf("%.3fs", g.to.Seconds())
		if g.to >= h.end() {
			to = "the end of the run"
		}
		more := ""
		if len(over) > 1 {
			more = fmt.Sprintf(" (%d such stalls)", len(over))
		}
		vs = append(vs, violation{Invariant: "namespace-progress", At: g.from,
			Summary: fmt.Sprintf("namespace %s (quota %d): no delivery from %.3fs to %s (%v) %s with %d acknowledged rows waiting; bound %v%s",
				ns.Name, ns.Quota, g.from.Seconds(), to, (g.to - g.from).Round(time.Millisecond), where, n, o.ProgressBound, more),
			Seqs: seqs})
	}
	return vs
}

// stallsIn returns the gaps inside region in which a namespace had rows
// waiting (spans, disjoint and sorted) and no delivery of it ended (ends,
// sorted): from the later of the waiting's and the region's start, or a
// delivery's end, to the next delivery's end or the earlier of the
// waiting's and the region's end.
func stallsIn(spans []interval, ends []time.Duration, region interval) []interval {
	var out []interval
	i := sort.Search(len(spans), func(i int) bool { return spans[i].to > region.from })
	for ; i < len(spans) && spans[i].from < region.to; i++ {
		from, to := max(spans[i].from, region.from), min(spans[i].to, region.to)
		if from >= to {
			continue
		}
		j := sort.Search(len(ends), func(j int) bool { return ends[j] > from })
		for ; j < len(ends) && ends[j] < to; j++ {
			if ends[j] > from {
				out = append(out, interval{from, ends[j]})
				from = ends[j]
			}
		}
		out = append(out, interval{from, to})
	}
	return out
}

// unionIntervals returns the union of ivs as disjoint intervals, sorted.
func unionIntervals(ivs []interval) []interval {
	s := slices.Clone(ivs)
	sort.Slice(s, func(i, j int) bool { return s[i].from < s[j].from })
	var out []interval
	for _, iv := range s {
		if iv.to <= iv.from {
			continue
		}
		if n := len(out); n > 0 && iv.from <= out[n-1].to {
			out[n-1].to = max(out[n-1].to, iv.to)
			continue
		}
		out = append(out, iv)
	}
	return out
}

// exposure returns the longest stretch of the monitor's consecutive
// samples in which the answering nodes' under-replicated shards summed to
// more than 0, from its first such sample to the first after it that
// summed to 0 (or the last sample), and when it began. A sample no node
// answered tells nothing and is skipped. A figure, not an invariant: with
// R = 2 it is how long the run stood one lost disk from losing rows.
func exposure(h *history) (longest, at time.Duration) {
	open := time.Duration(-1)
	last := time.Duration(0)
	for _, s := range h.samples {
		if len(s.Views) == 0 {
			continue
		}
		sum := 0
		for _, v := range s.Views {
			sum += v.UnderReplicated
		}
		last = s.At
		switch {
		case sum > 0 && open < 0:
			open = s.At
		case sum == 0 && open >= 0:
			if s.At-open > longest {
				longest, at = s.At-open, open
			}
			open = -1
		}
	}
	if open >= 0 && last-open > longest {
		longest, at = last-open, open
	}
	return longest, at
}

// checkLeaks: a process that lived through the whole run holds no more
// goroutines than its open connections explain, no more non-socket fds,
// and no connection its peer closed, than before the faults (both samples
// on an idle cluster).
func checkLeaks(h *history, o checkOpts) []violation {
	var vs []violation
	for _, s := range h.leaks {
		b, a := s.Before, s.After
		ug := (a.Goroutines - a.explained()) - (b.Goroutines - b.explained())
		if ug > o.GoroutineSlack {
			vs = append(vs, violation{Invariant: "no-goroutine-leak", At: -1,
				Summary: fmt.Sprintf("%s: %d goroutines after the run (%d explained by connections), %d before (%d explained): %d more unexplained, slack %d",
					s.Node, a.Goroutines, a.explained(), b.Goroutines, b.explained(), ug, o.GoroutineSlack)})
		}
		if d := (a.FDs - a.SocketFDs) - (b.FDs - b.SocketFDs); d > o.FDSlack {
			vs = append(vs, violation{Invariant: "no-fd-leak", At: -1,
				Summary: fmt.Sprintf("%s: %d non-socket fds after the run, %d before (slack %d)", s.Node, a.FDs-a.SocketFDs, b.FDs-b.SocketFDs, o.FDSlack)})
		}
		conns := func(r resources) int {
			return r.Established.Server + r.Established.Client + r.Established.Gossip + r.CloseWait
		}
		if d := (a.SocketFDs - conns(a)) - (b.SocketFDs - conns(b)); d > o.FDSlack {
			vs = append(vs, violation{Invariant: "no-fd-leak", At: -1,
				Summary: fmt.Sprintf("%s: %d sockets that are neither listeners of the start nor open connections (before %d; slack %d)",
					s.Node, a.SocketFDs-conns(a), b.SocketFDs-conns(b), o.FDSlack)})
		}
		if a.CloseWait > 0 {
			vs = append(vs, violation{Invariant: "no-fd-leak", At: -1,
				Summary: fmt.Sprintf("%s: %d connections in CLOSE_WAIT (closed by the peer, never by the node) on an idle cluster", s.Node, a.CloseWait)})
		}
	}
	return vs
}

// formatFigures renders the figures for the log and BENCHMARKS.md.
func formatFigures(f figures, h *history) string {
	var kinds []string
	total := 0
	for k, n := range f.Faults {
		kinds = append(kinds, fmt.Sprintf("%s %d", k, n))
		total += n
	}
	sort.Strings(kinds)
	var ns []string
	for _, s := range h.namespaces {
		ns = append(ns, fmt.Sprintf("%s q=%d: max %d at the target (%d while calm, %d from one node)",
			s.Name, s.Quota, f.MaxInFlight[s.Name], f.MaxInFlightCalm[s.Name], f.MaxNodeInFlight[s.Name]))
	}
	var causes []string
	for c, n := range f.DupByCause {
		causes = append(causes, fmt.Sprintf("%s %d", c, n))
	}
	sort.Strings(causes)
	var stops []string
	for k, n := range f.GracefulStops {
		stops = append(stops, fmt.Sprintf("%s: %d", k, n))
	}
	sort.Strings(stops)
	conv := "never"
	if f.Converged >= 0 {
		conv = f.Converged.Round(time.Millisecond).String()
	}
	var stalls, waits []string
	for _, s := range h.namespaces {
		st := "none"
		if g, ok := f.LongestStallCalm[s.Name]; ok {
			st = fmt.Sprintf("%v from %.3fs (%d rows waiting)", (g.to - g.from).Round(time.Millisecond), g.from.Seconds(), g.Waiting)
		}
		stalls = append(stalls, s.Name+" "+st)
		w := "none"
		if rw, ok := f.LongestWait[s.Name]; ok {
			w = fmt.Sprintf("%v (%s, acknowledged at %.3fs)", rw.Wait.Round(time.Millisecond), rowKey(s.Name, rw.Seq), h.rows[rw.Seq].acked.Seconds())
		}
		waits = append(waits, s.Name+" "+w)
	}
	drain := "not recorded"
	switch d := f.Drain; {
	case d.done:
		drain = (d.to - d.from).Round(time.Millisecond).String()
	case d.to > 0:
		drain = fmt.Sprintf("gave up after %v (%s), %d acknowledged rows undelivered", (d.to - d.from).Round(time.Millisecond), d.why, d.missing)
	}
	exposed := "none"
	if f.Exposure > 0 {
		exposed = fmt.Sprintf("%.1f s, at %.3fs", f.Exposure.Seconds(), f.ExposureAt.Seconds())
	}
	return fmt.Sprintf("  faults: %d (%s)\n  rows: %d sent, %d acknowledged (%d created, %d duplicate, %d accepted)\n"+
		"  deliveries: %d answered, %d abandoned by the sender; repeat deliveries %d (%s)\n"+
		"  in flight: %s\n  convergence after the final heal: %s (slowest after any fault healed with no other active: %v)\n"+
		"  graceful stops: %s\n"+
		"  longest stall of a namespace with rows waiting, while calm: %s\n  longest wait of a row for its first delivery: %s\n"+
		"  drain after the final heal: %s\n  R = 2 exposure: longest under-replicated stretch %s",
		total, strings.Join(kinds, ", "), f.RowsSent, f.RowsAcked, f.ByAck[ackCreated], f.ByAck[ackDuplicate], f.ByAck[ackAccepted],
		f.Deliveries, f.Abandoned, f.Duplicates, strings.Join(causes, ", "),
		strings.Join(ns, "; "), conv, f.MaxEpisodeConverg.Round(time.Millisecond), strings.Join(stops, ", "),
		strings.Join(stalls, "; "), strings.Join(waits, "; "), drain, exposed)
}

func (h *history) nodeName(i nodeIdx) string {
	if int(i) < len(h.nodes) && h.nodes[i] != "" {
		return h.nodes[i]
	}
	return fmt.Sprintf("?%d", i)
}

func firstInts(s []int, n int) []int { return append([]int(nil), s[:min(len(s), n)]...) }

// describeRow tells everything the run knows of row seq: its append
// history and every delivery.
func describeRow(h *history, seq int) string {
	if seq < 0 || seq >= len(h.rows) {
		return fmt.Sprintf("row #%d: not made by the load", seq)
	}
	r := h.rows[seq]
	ns := "?"
	if int(r.ns) < len(h.namespaces) {
		ns = h.namespaces[r.ns].Name
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s: first sent %.3fs, %d tries (%d failed), %s", rowKey(ns, seq), r.sent.Seconds(), r.tries, r.failed, r.ack)
	if r.ack != ackNone {
		fmt.Fprintf(&b, " by %s at %.3fs (shard %d)", h.nodeName(r.ackNode), r.acked.Seconds(), r.ackShard)
	}
	for _, a := range h.attempts[seq] {
		fmt.Fprintf(&b, "\n      append via %s failed at %.3fs: %s", h.nodeName(a.node), a.at.Seconds(), a.err)
	}
	n := 0
	for _, d := range h.deliveries {
		if d.seq != seq {
			continue
		}
		n++
		res := "200"
		if !d.ok {
			res = "abandoned by the sender"
		}
		fmt.Fprintf(&b, "\n      delivery from %s, attempt %d, %.3fs–%.3fs: %s", h.nodeName(d.node), d.attempt, d.start.Seconds(), d.end.Seconds(), res)
	}
	if n == 0 {
		b.WriteString("\n      never delivered")
		return b.String()
	}
	// What happened to the senders around the deliveries.
	var from, to time.Duration = 1 << 62, 0
	senders := map[string]bool{}
	for _, d := range h.deliveries {
		if d.seq == seq {
			from, to = min(from, d.start), max(to, d.end)
			senders[h.nodeName(d.node)] = true
		}
	}
	for _, e := range h.events {
		if e.At < from-2*time.Second || e.At > to+2*time.Second {
			continue
		}
		for _, nd := range e.Nodes {
			if senders[nd] && e.Kind != evNote {
				fmt.Fprintf(&b, "\n      meanwhile %s", strings.TrimSpace(e.String()))
				break
			}
		}
	}
	return b.String()
}

// formatViolation renders v with its rows.
func formatViolation(h *history, v violation) string {
	var b strings.Builder
	at := "at the end"
	if v.At >= 0 {
		at = fmt.Sprintf("at %.3fs", v.At.Seconds())
	}
	fmt.Fprintf(&b, "[%s] %s: %s", v.Invariant, at, v.Summary)
	if v.Detail != "" {
		b.WriteString("\n  " + v.Detail)
	}
	if len(v.Seqs) > 0 {
		b.WriteString("\n  rows involved:")
		for _, s := range v.Seqs {
			b.WriteString("\n    " + describeRow(h, s))
		}
	}
	return b.String()
}
