package chaos

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// history is everything a run recorded, on one clock (offsets from the
// run's start): what the load generator sent and was told, what the target
// received, what the nemesis did and what the cluster said about itself.
// The checkers read only this, so they can be tested on histories built by
// hand.
type history struct {
	namespaces []nsSpec
	nodes      []string // node index → name (index 0 is "?", an unknown sender)

	rows     []rowRec          // by row sequence number (the key's suffix)
	attempts map[int][]attempt // failed append attempts of a row, by sequence number

	deliveries []delivery
	strays     []string // delivered keys the load generator never made

	events  []event      // the nemesis timeline, in order
	samples []viewSample // the cluster monitor's polls, in order
	leaks   []leakSample // per surviving process: before and after

	finalHeal time.Duration // when the last fault was healed
	converged time.Duration // when every node agreed on one table after it (0: never)
	drain     drainRec      // the drain after the final heal (zero: none recorded)

	cuts []cut // partitions (isolate, split), in order
}

// cut is one partition: from its rules' install to their removal, the two
// sides that could not reach each other.
type cut struct {
	from, to     time.Duration
	sideA, sideB []string
}

// drainRec is how the drain after the final heal went: from the start of
// the wait (the load stopped, its workers done) to every acknowledged row
// delivered and nothing pending or claimed (done), or to the harness
// giving up (why).
type drainRec struct {
	from, to time.Duration
	done     bool
	missing  int // acknowledged rows still undelivered when it gave up
	why      string
}

// end is the end of what the history covers: the drain's end, or for a
// history without one the latest instant it records.
func (h *history) end() time.Duration {
	if h.drain.to > 0 {
		return h.drain.to
	}
	end := h.finalHeal
	for _, d := range h.deliveries {
		end = max(end, d.end)
	}
	for _, r := range h.rows {
		end = max(end, r.acked)
	}
	for _, e := range h.events {
		end = max(end, e.At)
	}
	for _, s := range h.samples {
		end = max(end, s.At)
	}
	return end
}

// separates reports whether the cut put nodes a and b on different sides.
func (c cut) separates(a, b string) bool {
	return slices.Contains(c.sideA, a) && slices.Contains(c.sideB, b) ||
		slices.Contains(c.sideA, b) && slices.Contains(c.sideB, a)
}

// nsSpec is one load namespace and its quota (max_in_flight).
type nsSpec struct {
	Name  string
	Quota int
	// Rate is the mean append rate in rows/s; the load alternates between
	// a fifth and twice it in bursts of a few seconds.
	Rate float64
}

// nodeIdx numbers the nodes of a run: node n<i> is i; 0 is unknown.
type nodeIdx uint16

// ackStatus is the append answer for a row.
type ackStatus uint8

const (
	ackNone ackStatus = iota // never acknowledged
	ackCreated
	ackDuplicate
	ackAccepted // stored on the receiving node: the owner did not answer the forward
)

func (a ackStatus) String() string {
	return [...]string{"unacknowledged", "created", "duplicate", "accepted"}[a]
}

func parseAck(s string) (ackStatus, bool) {
	switch s {
	case "created":
		return ackCreated, true
	case "duplicate":
		return ackDuplicate, true
	case "accepted":
		return ackAccepted, true
	}
	return ackNone, false
}

// rowRec is the load generator's record of one row.
type rowRec struct {
	ns       uint8
	ack      ackStatus
	ackNode  nodeIdx // the node that answered the successful append
	tries    uint16
	failed   uint16        // attempts that failed (the row may be stored anyway)
	sent     time.Duration // first attempt
	acked    time.Duration // successful answer
	ackShard int32
}

// attempt is one failed append attempt of a row.
type attempt struct {
	at   time.Duration
	node nodeIdx
	err  string
}

// delivery is one request the target received.
type delivery struct {
	seq     int // row sequence number (-1: not a key of this run)
	ns      uint8
	node    nodeIdx // sender, by source address (0: unknown)
	attempt uint16
	start   time.Duration
	end     time.Duration
	// answered is when the target was done with the request and started
	// writing its answer (0: at end); the answer reaches the sender only
	// after it, and end is taken once it is flushed.
	answered time.Duration
	ok       bool // answered 200; false: the sender went away first
}

// busyUntil is when the request stopped occupying the target: its answer
// was being written (answered), or the sender went away (end). Only a
// request still being worked on counts against the quota at the target.
func (d delivery) busyUntil() time.Duration {
	if d.answered > 0 {
		return d.answered
	}
	return d.end
}

// rowKey is the dispatch_key of row seq in namespace ns: "<ns>-<seq>".
func rowKey(ns string, seq int) string { return ns + "-" + strconv.Itoa(seq) }

// seqOfKey parses the sequence number of a key made by rowKey (-1 if none).
func seqOfKey(key string) int {
	i := strings.LastIndexByte(key, '-')
	if i < 0 {
		return -1
	}
	n, err := strconv.Atoi(key[i+1:])
	if err != nil || n < 0 {
		return -1
	}
	return n
}

// eventKind names the nemesis actions recorded in the timeline.
type eventKind string

const (
	evKill     eventKind = "kill"     // SIGKILL (a crash)
	evWipe     eventKind = "wipe"     // a killed node's data dir deleted
	evTerm     eventKind = "term"     // SIGTERM sent (graceful stop)
	evExit     eventKind = "exit"     // a stopped node's process exited
	evStart    eventKind = "start"    // a node process started (first start, restart, join)
	evReady    eventKind = "ready"    // it answered /readyz
	evStop     eventKind = "stop"     // SIGSTOP (pause)
	evCont     eventKind = "cont"     // SIGCONT (resume)
	evCut      eventKind = "cut"      // a partition installed
	evLoss     eventKind = "loss"     // packet loss installed
	evHeal     eventKind = "heal"     // network rules removed
	evCrash    eventKind = "crash"    // a node process exited on its own
	evNote     eventKind = "note"     // anything else worth a line
	evEpisode  eventKind = "episode"  // a nemesis step began (Detail says which)
	evEpisodeE eventKind = "episode-" // it ended (every fault it caused healed)
)

// event is one line of the timeline.
type event struct {
	At     time.Duration
	Kind   eventKind
	Nodes  []string
	Detail string
	// Lane is the nemesis lane of an episode ("process" or "network").
	Lane string
}

func (e event) String() string {
	s := fmt.Sprintf("%8.3fs  %-8s", e.At.Seconds(), e.Kind)
	if len(e.Nodes) > 0 {
		s += " " + strings.Join(e.Nodes, ",")
	}
	if e.Detail != "" {
		s += "  " + e.Detail
	}
	return s
}

// viewSample is one poll of every reachable node's /v1/cluster.
type viewSample struct {
	At    time.Duration
	Views map[string]nodeView // by node name; a node that did not answer is absent
	// Expect is the set of nodes whose process was running and not paused
	// when the poll started.
	Expect []string
}

// nodeView is what one node said about the cluster.
type nodeView struct {
	Version uint64 // its ownership_version
	Members string // "name:state,…" sorted
	// UnderReplicated is its replication.under_replicated_shards: its
	// primary shards with fewer than R synced copies.
	UnderReplicated int
}

// agreed reports whether every expected node answered and all list exactly
// the expected nodes, all active.
func (s viewSample) agreed() bool {
	want := make([]string, len(s.Expect))
	for i, n := range s.Expect {
		want[i] = n + ":active"
	}
	sort.Strings(want)
	w := strings.Join(want, ",")
	for _, n := range s.Expect {
		v, ok := s.Views[n]
		if !ok || v.Members != w {
			return false
		}
	}
	return len(s.Expect) > 0
}

// leakSample is one process's resources before the faults and after the
// final heal, both on an idle cluster.
type leakSample struct {
	Node          string
	Before, After resources
}

// resources is what a leak check reads of a live node process.
type resources struct {
	Goroutines  int // go_goroutines from /metrics
	FDs         int // entries of /proc/<pid>/fd
	SocketFDs   int // of which sockets
	Established struct {
		Server int // accepted connections on the API port (1 goroutine each)
		Client int // HTTP connections it opened (2 goroutines each)
		Gossip int // memberlist TCP streams
	}
	CloseWait int // sockets the peer closed and this process did not
}

// explained is the number of goroutines its open connections account for.
func (r resources) explained() int {
	return r.Established.Server + 2*r.Established.Client + r.Established.Gossip
}

// timeline collects events from every goroutine of a run.
type timeline struct {
	start time.Time
	mu    sync.Mutex
	evs   []event
	logf  func(string, ...any)
}

func (tl *timeline) now() time.Duration { return time.Since(tl.start) }

// add records an event now and echoes it to the test log.
func (tl *timeline) add(kind eventKind, nodes []string, format string, args ...any) event {
	e := event{At: tl.now(), Kind: kind, Nodes: nodes, Detail: fmt.Sprintf(format, args...)}
	tl.mu.Lock()
	tl.evs = append(tl.evs, e)
	tl.mu.Unlock()
	if tl.logf != nil {
		tl.logf("%s", e)
	}
	return e
}

func (tl *timeline) addEpisode(lane string, begin bool, detail string) {
	kind := evEpisode
	if !begin {
		kind = evEpisodeE
	}
	e := event{At: tl.now(), Kind: kind, Detail: detail, Lane: lane}
	tl.mu.Lock()
	tl.evs = append(tl.evs, e)
	tl.mu.Unlock()
	if tl.logf != nil {
		tl.logf("%s", e)
	}
}

func (tl *timeline) events() []event {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return append([]event(nil), tl.evs...)
}

// formatTimeline renders events, one per line.
func formatTimeline(evs []event) string {
	var b strings.Builder
	for _, e := range evs {
		b.WriteString(e.String())
		b.WriteByte('\n')
	}
	return b.String()
}
