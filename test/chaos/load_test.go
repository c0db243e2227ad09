package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// loadNode is a node the load generator may append through.
type loadNode struct {
	Idx nodeIdx
	URL string
}

// loader appends rows of several namespaces through random nodes at a
// bursty rate and retries every failed batch (on another random node, with
// backoff) until it is acknowledged or the run's hard deadline passes. It
// records every row's fate in a ledger the checkers read. Safe for
// concurrent use.
type loader struct {
	start      time.Time
	client     *http.Client
	namespaces []nsSpec
	nodes      func() []loadNode // every node not gone for good, running or not
	nodeIndex  func(name string) nodeIdx
	batchMax   int
	workers    int
	timeout    time.Duration // one append call
	rng        *rand.Rand    // the pacer's bursts (pacer goroutine only)

	queue chan int // row sequence numbers waiting for a worker

	mu       sync.Mutex
	rows     []rowRec
	attempts map[int][]attempt
	bad      []string // non-retryable answers (4xx): a bug of the run or the product
	errCount map[string]int
	batches  int

	factor atomic.Uint64 // math.Float64bits of the rate multiplier (setFactor)

	stopPacer context.CancelFunc
	wg        sync.WaitGroup
}

// maxAttemptsKept bounds the failed attempts remembered per row (the count
// is always exact).
const maxAttemptsKept = 4

func newLoader(start time.Time, client *http.Client, seed uint64, namespaces []nsSpec, nodes func() []loadNode, nodeIndex func(string) nodeIdx) *loader {
	l := &loader{
		start: start, client: client, namespaces: namespaces, nodes: nodes, nodeIndex: nodeIndex,
		batchMax: 50, workers: 8, timeout: 20 * time.Second,
		rng:      rand.New(rand.NewPCG(seed, 0x6c6f6164)), // "load"
		queue:    make(chan int, 20_000),
		attempts: map[int][]attempt{}, errCount: map[string]int{},
	}
	l.setFactor(1)
	return l
}

// setFactor multiplies every namespace's rate by f (0 pauses row making;
// the workers go on with what is queued).
func (l *loader) setFactor(f float64) { l.factor.Store(math.Float64bits(f)) }

// run starts the pacer and the workers. Rows are made until stop; workers
// keep retrying until every queued row is acknowledged or hard ends.
func (l *loader) run(hard context.Context) {
	pctx, cancel := context.WithCancel(hard)
	l.stopPacer = cancel
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer close(l.queue)
		l.pace(pctx)
	}()
	for range l.workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.work(hard)
		}()
	}
}

// stop ends row making; wait returns once the workers are done.
func (l *loader) stop() { l.stopPacer() }
func (l *loader) wait() { l.wg.Wait() }

// pace makes rows at each namespace's rate times a burst factor that
// switches between 0.2 and 2 every 2–6 s (so small quotas sit at their
// ceiling some of the time and drain some of the time).
func (l *loader) pace(ctx context.Context) {
	type state struct {
		factor float64
		until  time.Time
		owed   float64
	}
	st := make([]state, len(l.namespaces))
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-tick.C:
			dt := now.Sub(last).Seconds()
			last = now
			for i, ns := range l.namespaces {
				s := &st[i]
				if now.After(s.until) {
					s.factor = 0.2
					if l.rng.IntN(2) == 0 {
						s.factor = 2
					}
					s.until = now.Add(2*time.Second + time.Duration(l.rng.Int64N(int64(4*time.Second))))
				}
				s.owed += ns.Rate * s.factor * dt * math.Float64frombits(l.factor.Load())
				for ; s.owed >= 1; s.owed-- {
					l.mu.Lock()
					seq := len(l.rows)
					l.rows = append(l.rows, rowRec{ns: uint8(i)})
					l.mu.Unlock()
					select {
					case l.queue <- seq:
					default:
						// The workers are stuck (a paused node holds their calls):
						// this row is never sent; mark it so the checkers skip it.
						l.mu.Lock()
						l.rows[seq].tries = 0
						l.rows[seq].failed = 0
						l.mu.Unlock()
						s.owed = 0
					}
				}
			}
		}
	}
}

// work sends batches of up to batchMax queued rows until the queue closes.
func (l *loader) work(hard context.Context) {
	batch := make([]int, 0, l.batchMax)
	for {
		seq, ok := <-l.queue
		if !ok {
			return
		}
		batch = append(batch[:0], seq)
	fill:
		for len(batch) < l.batchMax {
			select {
			case s, ok := <-l.queue:
				if !ok {
					break fill
				}
				batch = append(batch, s)
			default:
				break fill
			}
		}
		l.send(hard, batch)
	}
}

// send appends one batch until it is acknowledged, refused as bad input,
// or hard ends.
func (l *loader) send(hard context.Context, batch []int) {
	rows := make([]appendRow, len(batch))
	now := time.Now()
	for i, seq := range batch {
		l.mu.Lock()
		ns := l.namespaces[l.rows[seq].ns].Name
		l.mu.Unlock()
		rows[i] = appendRow{
			DispatchKey: rowKey(ns, seq),
			Namespace:   ns,
			TaskQueue:   fmt.Sprintf("q%d", seq%3),
			Payload:     json.RawMessage(fmt.Sprintf(`{"t":%d,"seq":%d}`, now.UnixNano(), seq)),
		}
	}
	backoff := 50 * time.Millisecond
	for {
		nodes := l.nodes()
		if len(nodes) == 0 {
			return
		}
		n := nodes[rand.IntN(len(nodes))]
		at := time.Since(l.start)
		l.mu.Lock()
		for _, seq := range batch {
			r := &l.rows[seq]
			if r.tries == 0 {
				r.sent = at
			}
			r.tries++
		}
		l.mu.Unlock()
		res, err := appendRows(hard, l.client, n.URL, rows, l.timeout)
		if err == nil {
			l.record(batch, res)
			return
		}
		var ae *appendError
		errors.As(err, &ae)
		l.fail(batch, n.Idx, ae)
		if !ae.Retryable {
			return
		}
		select {
		case <-hard.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

func (l *loader) record(batch []int, res []appendResult) {
	at := time.Since(l.start)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batches++
	for i, seq := range batch {
		r := &l.rows[seq]
		st, ok := parseAck(res[i].Status)
		if !ok {
			l.bad = append(l.bad, fmt.Sprintf("row %s: unknown append status %q", rowKey(l.namespaces[r.ns].Name, seq), res[i].Status))
			continue
		}
		r.ack, r.acked, r.ackShard = st, at, res[i].Shard
		r.ackNode = l.nodeIndex(res[i].Node)
	}
}

func (l *loader) fail(batch []int, node nodeIdx, ae *appendError) {
	at := time.Since(l.start)
	msg := ae.Error()
	if len(msg) > 160 {
		msg = msg[:160] + "…"
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.errCount[errClass(ae)]++
	if !ae.Retryable {
		l.bad = append(l.bad, fmt.Sprintf("batch of %d rows (first %s) refused by node #%d: %s",
			len(batch), rowKey(l.namespaces[l.rows[batch[0]].ns].Name, batch[0]), node, msg))
	}
	for _, seq := range batch {
		l.rows[seq].failed++
		if len(l.attempts[seq]) < maxAttemptsKept {
			l.attempts[seq] = append(l.attempts[seq], attempt{at: at, node: node, err: msg})
		}
	}
}

// errClass is a short name for an append failure, for the run's summary.
func errClass(ae *appendError) string {
	switch {
	case ae.Status != 0:
		return fmt.Sprintf("HTTP %d", ae.Status)
	case strings.Contains(ae.Msg, "connection refused"):
		return "connection refused"
	case strings.Contains(ae.Msg, "deadline exceeded") || strings.Contains(ae.Msg, "Timeout"):
		return "timeout"
	case strings.Contains(ae.Msg, "reset by peer") || strings.Contains(ae.Msg, "EOF"):
		return "connection reset"
	}
	return "other"
}

// ledger returns copies of the rows and failed attempts recorded so far.
func (l *loader) ledger() ([]rowRec, map[int][]attempt) {
	l.mu.Lock()
	defer l.mu.Unlock()
	at := make(map[int][]attempt, len(l.attempts))
	for k, v := range l.attempts {
		at[k] = append([]attempt(nil), v...)
	}
	return append([]rowRec(nil), l.rows...), at
}

// progress returns rows made, rows acknowledged and batches acknowledged.
func (l *loader) progress() (made, acked, batches int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.rows {
		if r.ack != ackNone {
			acked++
		}
	}
	return len(l.rows), acked, l.batches
}

func (l *loader) errors() (map[string]int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := map[string]int{}
	for k, v := range l.errCount {
		m[k] = v
	}
	return m, append([]string(nil), l.bad...)
}
