package replication

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/transfer"
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
// waits for the next call. A merged call stays within appendBatchBytes of
// encoded rows (the backup refuses bodies over MaxBodyBytes; a single
// Write's batch, bounded by the public API, goes alone whatever its size).
// A Write whose context ended before its call was taken is answered with
// its context's error and not sent. Once the Replicator's Run has ended
// (close), calls in flight are cancelled and Writes call the backup
// directly.

const (
	// maxAppendCalls is how many append calls run at once to one backup.
	maxAppendCalls = 2
	// appendBatchRows bounds the rows of a merged call (a single Write's
	// batch may be larger and is sent alone).
	appendBatchRows = 4096
	// appendBatchBytes bounds a merged call's encoded rows (bytes), half
	// of what a backup accepts in one body.
	appendBatchBytes = MaxBodyBytes / 2
)

// appendBatcher merges the backup appends of concurrent Writes per backup
// address. The zero value is not usable; see newAppendBatcher.
type appendBatcher struct {
	send func(ctx context.Context, addr string, rows []outbox.Row) ([]outbox.AppendOutcome, error)
	// timeout bounds a merged call that no caller's deadline bounds.
	timeout time.Duration

	// base parents every merged call; close cancels it.
	base   context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	addrs  map[string]*addrAppends
	closed bool           // after close: no new merged calls
	calls  sync.WaitGroup // merged calls in flight (Wait: none left)
}

type addrAppends struct {
	inflight int
	queue    []*appendReq
}

type appendReq struct {
	ctx   context.Context // the caller's: once done, the request is dropped
	rows  []outbox.Row
	bytes int // transfer.EncodedSize(rows)
	done  chan appendResult
}

type appendResult struct {
	outs []outbox.AppendOutcome
	err  error
}

func newAppendBatcher(send func(context.Context, string, []outbox.Row) ([]outbox.AppendOutcome, error), timeout time.Duration) *appendBatcher {
	base, cancel := context.WithCancel(context.Background())
	return &appendBatcher{send: send, timeout: timeout, base: base, cancel: cancel, addrs: map[string]*addrAppends{}}
}

// append stores rows on the backup at addr, in one call with other
// Writes' rows for it when calls to it are already in flight. It returns
// one outcome per row, in order, or the call's error; if ctx ends first it
// returns ctx's error (the call goes on for the others).
func (b *appendBatcher) append(ctx context.Context, addr string, rows []outbox.Row) ([]outbox.AppendOutcome, error) {
	req := &appendReq{ctx: ctx, rows: rows, bytes: transfer.EncodedSize(rows), done: make(chan appendResult, 1)}
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return b.send(ctx, addr, rows)
	}
	a := b.addrs[addr]
	if a == nil {
		a = &addrAppends{}
		b.addrs[addr] = a
	}
	a.queue = append(a.queue, req)
	var batch []*appendReq
	if a.inflight < maxAppendCalls {
		batch = a.takeLocked()
		if batch != nil {
			a.inflight++
			b.calls.Add(1)
		}
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
// first whose caller still waits, then the following ones while the call
// stays within appendBatchRows rows and appendBatchBytes bytes and no
// dispatch_key repeats. Requests whose caller's context ended are
// answered with its error and dropped. nil: nothing to send. b.mu held.
func (a *addrAppends) takeLocked() []*appendReq {
	live := a.queue[:0]
	for _, q := range a.queue {
		if err := q.ctx.Err(); err != nil {
			q.done <- appendResult{err: err}
			continue
		}
		live = append(live, q)
	}
	clear(a.queue[len(live):])
	a.queue = live
	if len(a.queue) == 0 {
		return nil
	}
	n, rows, size := 1, len(a.queue[0].rows), a.queue[0].bytes
	keys := make(map[string]struct{}, rows)
	for _, r := range a.queue[0].rows {
		keys[r.DispatchKey] = struct{}{}
	}
next:
	for ; n < len(a.queue); n++ {
		q := a.queue[n]
		if rows+len(q.rows) > appendBatchRows || size+q.bytes > appendBatchBytes {
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
		size += q.bytes
	}
	batch := slices.Clone(a.queue[:n])
	a.queue = slices.Delete(a.queue, 0, n)
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
	// The latest caller's deadline: each caller stops waiting at its own,
	// and the earliest would fail the later ones for nothing.
	deadline := time.Time{}
	for _, q := range batch {
		dl, ok := q.ctx.Deadline()
		if !ok {
			dl = time.Now().Add(b.timeout)
		}
		if dl.After(deadline) {
			deadline = dl
		}
	}
	ctx, cancel := context.WithDeadline(b.base, deadline)
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

// close cancels the merged calls in flight and sends later appends
// directly; it returns once no merged call is in flight.
func (b *appendBatcher) close() {
	b.mu.Lock()
	b.closed = true
	b.cancel()
	b.mu.Unlock()
	b.calls.Wait()
}
