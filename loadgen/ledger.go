package loadgen

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/fairshard/fairshard/client"
)

// Ledger records the fate of every row a Generator made, by the row's
// sequence number (the n of its key): its namespace, its attempts and
// their failures, and the answer that acknowledged it. A checker reads it
// after the run to tell rows the cluster acknowledged from rows it may or
// may not hold. Safe for concurrent use.
type Ledger struct {
	start time.Time

	mu       sync.Mutex
	rows     []RowFate
	attempts map[int][]FailedAttempt
	classes  map[string]int
	refused  []string
	batches  int
}

// RowFate is one row's entry in a Ledger.
type RowFate struct {
	// Namespace is the row's namespace, an index into Config.Namespaces.
	Namespace int
	// Tries counts the attempts that carried the row; 0: never sent (a
	// paced row made while the queue was full).
	Tries int
	// Failed counts the attempts that failed (the row may be stored
	// anyway: an attempt can fail after the node stored it).
	Failed int
	// Sent is when the first attempt went, Acked when the acknowledging
	// answer came, both since the ledger's start.
	Sent, Acked time.Duration
	// Status is the acknowledged append status; "" while unacknowledged.
	Status client.AppendStatus
	// Shard and Node are the acknowledging answer's shard and the node that
	// coordinated the write.
	Shard uint32
	Node  string
}

// FailedAttempt is one failed attempt of a row.
type FailedAttempt struct {
	At   time.Duration // since the ledger's start
	Node string        // the base URL it went to
	Err  string        // at most 160 bytes of the error
}

// MaxFailedAttemptsKept bounds the failed attempts a Ledger keeps per row
// (RowFate.Failed counts them all).
const MaxFailedAttemptsKept = 4

// NewLedger returns an empty ledger whose times count from start.
func NewLedger(start time.Time) *Ledger {
	return &Ledger{start: start, attempts: map[int][]FailedAttempt{}, classes: map[string]int{}}
}

// Rows returns a copy of every row's entry, indexed by sequence number.
func (l *Ledger) Rows() []RowFate {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]RowFate(nil), l.rows...)
}

// FailedAttempts returns a copy of the failed attempts kept, by sequence
// number.
func (l *Ledger) FailedAttempts() map[int][]FailedAttempt {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make(map[int][]FailedAttempt, len(l.attempts))
	for k, v := range l.attempts {
		out[k] = append([]FailedAttempt(nil), v...)
	}
	return out
}

// Progress returns rows made, rows acknowledged and batches acknowledged.
func (l *Ledger) Progress() (made, acked, batches int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.rows {
		if r.Status != "" {
			acked++
		}
	}
	return len(l.rows), acked, l.batches
}

// Errors returns the failed attempts counted by ErrorClass, and the
// refusals: answers no retry can change (bad input: a bug of the load or
// of the cluster).
func (l *Ledger) Errors() (map[string]int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := make(map[string]int, len(l.classes))
	for k, v := range l.classes {
		m[k] = v
	}
	return m, append([]string(nil), l.refused...)
}

// ErrorClass is a short name for an attempt's error, for a run's summary:
// "HTTP <status>", "connection refused", "timeout", "connection reset" or
// "other".
func ErrorClass(err error) string {
	var ae *client.Error
	if errors.As(err, &ae) {
		return fmt.Sprintf("HTTP %d", ae.StatusCode)
	}
	msg := err.Error()
	switch {
	case strings.Contains(msg, "connection refused"):
		return "connection refused"
	case strings.Contains(msg, "deadline exceeded") || strings.Contains(msg, "Timeout"):
		return "timeout"
	case strings.Contains(msg, "reset by peer") || strings.Contains(msg, "EOF"):
		return "connection reset"
	}
	return "other"
}

func (l *Ledger) since() time.Duration { return time.Since(l.start) }

// made records row seq of namespace ns.
func (l *Ledger) made(seq int64, ns int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for int64(len(l.rows)) <= seq {
		l.rows = append(l.rows, RowFate{Namespace: -1})
	}
	l.rows[seq].Namespace = ns
}

// attempt records an attempt carrying rows seqs (err nil: it succeeded).
func (l *Ledger) attempt(seqs []int64, node string, err error) {
	at := l.since()
	msg := ""
	if err != nil {
		msg = err.Error()
		if len(msg) > 160 {
			msg = msg[:160] + "…"
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		l.classes[ErrorClass(err)]++
	}
	for _, seq := range seqs {
		r := &l.rows[seq]
		if r.Tries == 0 {
			r.Sent = at
		}
		r.Tries++
		if err == nil {
			continue
		}
		r.Failed++
		if len(l.attempts[int(seq)]) < MaxFailedAttemptsKept {
			l.attempts[int(seq)] = append(l.attempts[int(seq)], FailedAttempt{At: at, Node: node, Err: msg})
		}
	}
}

// acked records the answer that acknowledged rows seqs.
func (l *Ledger) acked(seqs []int64, keys []string, res []client.AppendResult) {
	at := l.since()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.batches++
	for i, seq := range seqs {
		switch res[i].Status {
		case client.Created, client.Duplicate:
		default:
			l.refused = append(l.refused, fmt.Sprintf("row %s: unknown append status %q", keys[i], res[i].Status))
			continue
		}
		r := &l.rows[seq]
		r.Status, r.Acked, r.Shard, r.Node = res[i].Status, at, res[i].Shard, res[i].Node
	}
}

// refusal records a batch no retry can store.
func (l *Ledger) refusal(keys []string, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.refused = append(l.refused, fmt.Sprintf("batch of %d rows (first %s) refused: %v", len(keys), keys[0], err))
}
