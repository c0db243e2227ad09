package chaos

import (
	"context"
	"net/http"
	"sync"
	"time"

	"github.com/fairshard/fairshard/client"
	"github.com/fairshard/fairshard/loadgen"
)

// loadNode is a node the load generator may append through.
type loadNode struct {
	Idx nodeIdx
	URL string
}

// loader is the run's load: a paced loadgen.Generator that appends rows of
// several namespaces through random nodes at bursty rates and sends every
// failed batch again (on other nodes, with backoff) until it is
// acknowledged or the run's hard deadline passes. Its loadgen.Ledger holds
// every row's fate; ledger turns it into the checkers' rows and attempts.
type loader struct {
	g          *loadgen.Generator
	led        *loadgen.Ledger
	namespaces []nsSpec
	nodeIndex  func(name string) nodeIdx
	done       chan struct{}

	mu    sync.Mutex
	byURL map[string]nodeIdx // every node the load was offered, by base URL
}

func newLoader(start time.Time, hc *http.Client, seed uint64, namespaces []nsSpec, nodes func() []loadNode, nodeIndex func(string) nodeIdx) *loader {
	l := &loader{led: loadgen.NewLedger(start), namespaces: namespaces, nodeIndex: nodeIndex, done: make(chan struct{}), byURL: map[string]nodeIdx{}}
	spec := make([]loadgen.Namespace, len(namespaces))
	for i, ns := range namespaces {
		spec[i] = loadgen.Namespace{Name: ns.Name, Rate: ns.Rate, TaskQueues: 3}
	}
	g, err := loadgen.NewGenerator(loadgen.Config{
		NodesNow: func() []string {
			ns := nodes()
			urls := make([]string, len(ns))
			l.mu.Lock()
			for i, n := range ns {
				urls[i] = n.URL
				l.byURL[n.URL] = n.Idx
			}
			l.mu.Unlock()
			return urls
		},
		Namespaces: spec,
		// Each namespace alternates between a fifth and twice its rate every
		// 2-6 s (nsSpec.Rate).
		Bursts:      loadgen.Bursts{Low: 0.2, High: 2, Min: 2 * time.Second, Max: 6 * time.Second},
		Seed:        seed,
		BatchSize:   50,
		Concurrency: 8,
		Key:         func(ns string, n int64) string { return rowKey(ns, int(n)) },
		Client:      hc,
		Timeout:     20 * time.Second,
		// Backoff between attempts from 50 ms to 1 s; a node's Retry-After
		// does not slow the load down.
		Retry:      client.RetryConfig{BaseDelay: 50 * time.Millisecond, MaxDelay: time.Second, MaxRetryAfter: -1},
		KeepTrying: true,
		Ledger:     l.led,
	})
	if err != nil {
		panic(err) // the config above is valid
	}
	l.g = g
	return l
}

// setFactor multiplies every namespace's rate by f (0 pauses row making;
// the workers go on with what is queued).
func (l *loader) setFactor(f float64) { l.g.SetRateFactor(f) }

// run starts the load. Rows are made until stop; batches are sent until
// every queued row is acknowledged or hard ends.
func (l *loader) run(hard context.Context) {
	go func() {
		defer close(l.done)
		_, _ = l.g.Run(hard)
	}()
}

// stop ends row making; wait returns once the workers are done.
func (l *loader) stop() { l.g.Stop() }
func (l *loader) wait() { <-l.done }

// ledger returns the rows and failed attempts recorded so far, in the
// checkers' terms.
func (l *loader) ledger() ([]rowRec, map[int][]attempt) {
	fates, fails := l.led.Rows(), l.led.FailedAttempts()
	l.mu.Lock()
	defer l.mu.Unlock()
	rows := make([]rowRec, len(fates))
	for i, f := range fates {
		r := rowRec{ns: uint8(max(f.Namespace, 0)), tries: uint16(f.Tries), failed: uint16(f.Failed), sent: f.Sent, acked: f.Acked, ackShard: int32(f.Shard)}
		if st, ok := parseAck(string(f.Status)); ok {
			r.ack, r.ackNode = st, l.nodeIndex(f.Node)
		}
		rows[i] = r
	}
	at := make(map[int][]attempt, len(fails))
	for seq, fs := range fails {
		for _, f := range fs {
			at[seq] = append(at[seq], attempt{at: f.At, node: l.byURL[f.Node], err: f.Err})
		}
	}
	return rows, at
}

// progress returns rows made, rows acknowledged and batches acknowledged.
func (l *loader) progress() (made, acked, batches int) { return l.led.Progress() }

// errors returns the failed attempts by class and the refusals (answers no
// retry can change: a bug of the run or the product).
func (l *loader) errors() (map[string]int, []string) { return l.led.Errors() }
