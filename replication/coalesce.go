package replication

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/fairshard/fairshard/outbox"
)

// Backup appends of concurrent writes travel together. Every Write sends
// its rows' copies to each backup of their sets and waits for the answers;
// under load a coordinator runs many Writes at once, and one HTTP call per
// Write and backup spent the CPU the commits needed (append at R = 2 ran
// at half the rate of R = 1 on 2 cores). So the copies for one backup
// address go through an appendBatcher: a Write whose backup has fewer than
// maxAppendCalls calls in flight sends at once (no added wait when idle);
// otherwise its rows queue, and the next call to finish takes the whole
// queue (up to appendBatchRows rows) in one call, the way a group commit
// takes the writes that arrived during the previous fsync. Each Write gets
// back the outcomes of its own rows, or the call's error.
//
// Batches whose rows share a dispatch_key are not merged into one call
// (the backup would answer the second copy "duplicate"): such a Write
// waits for the next call.

const (
	// maxAppendCalls is how many append calls run at once to one backup.
	maxAppendCalls = 2
	// appendBatchRows bounds the rows of a merged call (a single Write's
	// batch may be larger and is sent alone).
	appendBatchRows = 4096
)

// appendBatcher merges the backup appends of concurrent Writes per backup
// address. The zero value is not usable; see newAppendBatcher.
type appendBatcher struct {
	send func(ctx context.Context, addr string, rows []outbox.Row) ([]outbox.AppendOutcome, error)
	// timeout bounds a merged call that no caller's deadline bounds.
	timeout time.Duration

	mu    sync.Mutex
	addrs map[string]*addrAppends
	calls sync.WaitGroup // merged calls in flight (Wait: none left)
}

type addrAppends struct {
	inflight int
	queue    []*appendReq
}

type appendReq struct {
	rows     []outbox.Row
	deadline time.Time // zero: none
	done     chan appendResult
}

type appendResult struct {
	outs []outbox.AppendOutcome
	err  error
}

func newAppendBatcher(send func(context.Context, string, []outbox.Row) ([]outbox.AppendOutcome, error), timeout time.Duration) *appendBatcher {
	return &appendBatcher{send: send, timeout: timeout, addrs: map[string]*addrAppends{}}
}

// append stores rows on the backup at addr, in one call with other
// Writes' rows for it when calls to it are already in flight. It returns
// one outcome per row, in order, or the call's error; if ctx ends first it
// returns ctx's error (the call goes on for the others).
func (b *appendBatcher) append(ctx context.Context, addr string, rows []outbox.Row) ([]outbox.AppendOutcome, error) {
	req := &appendReq{rows: rows, done: make(chan appendResult, 1)}
	if dl, ok := ctx.Deadline(); ok {
		req.deadline = dl
	}
	b.mu.Lock()
	a := b.addrs[addr]
	if a == nil {
		a = &addrAppends{}
		b.addrs[addr] = a
	}
	a.queue = append(a.queue, req)
	var batch []*appendReq
	if a.inflight < maxAppendCalls {
		a.inflight++
		batch = a.takeLocked()
		b.calls.Add(1)
	}
	b.mu.Unlock()
	if batch != nil {
		go b.run(addr, batch)
	}
	select {
	case res := <-req.done:
		return res.outs, res.err
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// takeLocked removes from the queue the requests of the next call: the
// first, then the following ones while the call stays within
// appendBatchRows rows and no dispatch_key repeats. b.mu held.
func (a *addrAppends) takeLocked() []*appendReq {
	if len(a.queue) == 0 {
		return nil
	}
	n, rows := 1, len(a.queue[0].rows)
	keys := make(map[string]struct{}, rows)
	for _, r := range a.queue[0].rows {
		keys[r.DispatchKey] = struct{}{}
	}
next:
	for ; n < len(a.queue); n++ {
		q := a.queue[n]
		if rows+len(q.rows) > appendBatchRows {
			break
		}
		for _, r := range q.rows {
			if _, dup := keys[r.DispatchKey]; dup {
				break next
			}
		}
		for _, r := range q.rows {
			keys[r.DispatchKey] = struct{}{}
		}
		rows += len(q.rows)
	}
	batch := a.queue[:n:n]
	a.queue = a.queue[n:]
	return batch
}

// run sends batch, answers its requests, and goes on with what queued
// meanwhile until the queue is empty.
func (b *appendBatcher) run(addr string, batch []*appendReq) {
	defer b.calls.Done()
	for batch != nil {
		b.call(addr, batch)
		b.mu.Lock()
		a := b.addrs[addr]
		batch = a.takeLocked()
		if batch == nil {
			if a.inflight--; a.inflight == 0 && len(a.queue) == 0 {
				delete(b.addrs, addr)
			}
		}
		b.mu.Unlock()
	}
}

// call is one append call for batch's rows; the deadline is the latest of
// the callers' (each caller stops waiting at its own).
func (b *appendBatcher) call(addr string, batch []*appendReq) {
	var rows []outbox.Row
	if len(batch) == 1 {
		rows = batch[0].rows
	} else {
		total := 0
		for _, q := range batch {
			total += len(q.rows)
		}
		rows = make([]outbox.Row, 0, total)
		for _, q := range batch {
			rows = append(rows, q.rows...)
		}
	}
	deadline := time.Time{}
	for _, q := range batch {
		if q.deadline.IsZero() {
			deadline = time.Now().Add(b.timeout)
			break
		}
		if q.deadline.After(deadline) {
			deadline = q.deadline
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	outs, err := b.send(ctx, addr, rows)
	cancel()
	if err == nil && len(outs) != len(rows) {
		err = fmt.Errorf("answered %d outcomes for %d rows", len(outs), len(rows))
	}
	off := 0
	for _, q := range batch {
		res := appendResult{err: err}
		if err == nil {
			res.outs = outs[off : off+len(q.rows) : off+len(q.rows)]
		}
		off += len(q.rows)
		q.done <- res
	}
}

// wait returns once no merged call is in flight.
func (b *appendBatcher) wait() { b.calls.Wait() }
