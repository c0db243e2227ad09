package replication

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/outbox"
)

// fakeBackup is the send function of an appendBatcher under test: it
// records every call's keys, answers created for keys whose name ends in
// "c" and duplicate for the others, and holds calls while held is set. A
// fake: the test needs calls in flight on cue, which a real backup cannot
// be made to show.
type fakeBackup struct {
	mu      sync.Mutex
	calls   [][]string
	held    chan struct{} // closed: calls go on
	started chan struct{} // one send per call started
	fail    error
}

func newFakeBackup() *fakeBackup {
	return &fakeBackup{held: make(chan struct{}), started: make(chan struct{}, 64)}
}

func (f *fakeBackup) send(ctx context.Context, _ string, rows []outbox.Row) ([]outbox.AppendOutcome, error) {
	keys := make([]string, len(rows))
	for i := range rows {
		keys[i] = rows[i].DispatchKey
	}
	f.mu.Lock()
	f.calls = append(f.calls, keys)
	f.mu.Unlock()
	f.started <- struct{}{}
	select {
	case <-f.held:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if f.fail != nil {
		return nil, f.fail
	}
	outs := make([]outbox.AppendOutcome, len(rows))
	for i, k := range keys {
		outs[i] = outbox.AppendDuplicate
		if k[len(k)-1] == 'c' {
			outs[i] = outbox.AppendCreated
		}
	}
	return outs, nil
}

func (f *fakeBackup) callKeys() [][]string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.calls)
}

// sortedCalls is every call's keys joined by spaces, sorted (calls that
// end together may go in either order).
func (f *fakeBackup) sortedCalls() []string {
	var out []string
	for _, c := range f.callKeys() {
		out = append(out, strings.Join(c, " "))
	}
	slices.Sort(out)
	return out
}

func keyedRows(keys ...string) []outbox.Row {
	rows := make([]outbox.Row, len(keys))
	for i, k := range keys {
		rows[i] = outbox.Row{DispatchKey: k}
	}
	return rows
}

type appendAnswer struct {
	outs []outbox.AppendOutcome
	err  error
}

// TestAppendBatcherMergesWhileCallsRun: with maxAppendCalls calls held in
// flight, the Writes that arrive meanwhile go out as one call when a call
// ends, and each gets the outcomes of its own rows, in order; a batch
// that repeats a key already in the merged call waits for the call after.
func TestAppendBatcherMergesWhileCallsRun(t *testing.T) {
	f := newFakeBackup()
	b := newAppendBatcher(f.send, 5*time.Second)
	ctx := context.Background()
	answers := make([]chan appendAnswer, 0)
	start := func(keys ...string) chan appendAnswer {
		ch := make(chan appendAnswer, 1)
		go func() {
			outs, err := b.append(ctx, "backup:1", keyedRows(keys...))
			ch <- appendAnswer{outs, err}
		}()
		answers = append(answers, ch)
		return ch
	}
	// Two calls in flight, held.
	start("a1c", "a2d")
	<-f.started
	start("b1c")
	<-f.started
	// Three more Writes queue; the third repeats a queued key.
	start("c1c", "c2c")
	waitQueued(t, b, "backup:1", 1)
	start("d1d")
	waitQueued(t, b, "backup:1", 2)
	start("c1c")
	waitQueued(t, b, "backup:1", 3)
	close(f.held)
	for i, want := range [][]outbox.AppendOutcome{
		{outbox.AppendCreated, outbox.AppendDuplicate},
		{outbox.AppendCreated},
		{outbox.AppendCreated, outbox.AppendCreated},
		{outbox.AppendDuplicate},
		{outbox.AppendCreated},
	} {
		got := <-answers[i]
		if got.err != nil || !slices.Equal(got.outs, want) {
			t.Fatalf("write %d: outcomes %v (err %v), want %v", i, got.outs, got.err, want)
		}
	}
	b.calls.Wait()
	// The two held calls end together, so the last two calls may go in
	// either order.
	calls := f.sortedCalls()
	want := []string{"a1c a2d", "b1c", "c1c", "c1c c2c d1d"}
	if !slices.Equal(calls, want) {
		t.Fatalf("calls %q, want %q (the queued Writes merged, the repeated key in a call of its own)", calls, want)
	}
	if n := b.tracked(); n != 0 {
		t.Fatalf("%d addresses still tracked after every call ended", n)
	}
}

// TestAppendBatcherErrorsAndDeadlines: a call's error reaches every Write
// merged into it; a Write whose context ends stops waiting while the call
// goes on for the others.
func TestAppendBatcherErrorsAndDeadlines(t *testing.T) {
	f := newFakeBackup()
	f.fail = errors.New("backup refused")
	b := newAppendBatcher(f.send, 5*time.Second)
	ctx := context.Background()
	first := make(chan error, 1)
	go func() {
		_, err := b.append(ctx, "backup:1", keyedRows("x1"))
		first <- err
	}()
	<-f.started
	go func() {
		_, err := b.append(ctx, "backup:1", keyedRows("x2"))
		first <- err
	}()
	<-f.started
	short, cancel := context.WithCancel(ctx)
	gone := make(chan error, 1)
	go func() {
		_, err := b.append(short, "backup:1", keyedRows("y1"))
		gone <- err
	}()
	waitQueued(t, b, "backup:1", 1)
	merged := make(chan error, 1)
	go func() {
		_, err := b.append(ctx, "backup:1", keyedRows("y2"))
		merged <- err
	}()
	waitQueued(t, b, "backup:1", 2)
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("a Write whose context ended got %v, want context.Canceled", err)
	}
	close(f.held)
	for range 2 {
		if err := <-first; err == nil || err.Error() != "backup refused" {
			t.Fatalf("a held call's Write got %v, want the call's error", err)
		}
	}
	if err := <-merged; err == nil || err.Error() != "backup refused" {
		t.Fatalf("the Write merged beside the cancelled one got %v, want the call's error", err)
	}
	b.calls.Wait()
	if calls := f.callKeys(); len(calls) != 3 || !slices.Equal(calls[2], []string{"y2"}) {
		t.Fatalf("calls %v: want the cancelled Write's rows left out of the next call", calls)
	}
}

// TestAppendBatcherBoundsBytesAndCloses: merged calls stay within
// appendBatchBytes (a backup refuses bodies over MaxBodyBytes; found in
// review: seven queued 10 MiB Writes made one 73 MB call), while a single
// Write larger than that still goes alone; close cancels the calls in
// flight and later appends go straight to the backup.
func TestAppendBatcherBoundsBytesAndCloses(t *testing.T) {
	f := newFakeBackup()
	b := newAppendBatcher(f.send, 5*time.Second)
	ctx := context.Background()
	payload := make([]byte, 12<<20)
	big := func(key string) []outbox.Row { return []outbox.Row{{DispatchKey: key, Payload: payload}} }
	answers := make(chan error, 8)
	start := func(rows []outbox.Row) {
		go func() {
			_, err := b.append(ctx, "backup:1", rows)
			answers <- err
		}()
	}
	start(big("h1c"))
	<-f.started
	start(big("h2c"))
	<-f.started
	for i, k := range []string{"q1c", "q2c", "q3c"} {
		start(big(k))
		waitQueued(t, b, "backup:1", i+1)
	}
	close(f.held)
	for range 5 {
		if err := <-answers; err != nil {
			t.Fatal(err)
		}
	}
	b.calls.Wait()
	calls := f.sortedCalls()
	if want := []string{"h1c", "h2c", "q1c q2c", "q3c"}; !slices.Equal(calls, want) {
		t.Fatalf("calls %q, want %q: two 12 MiB Writes per merged call (%d bytes at most)", calls, want, appendBatchBytes)
	}

	// close: a held call is cancelled, later appends go straight out.
	g := newFakeBackup()
	b = newAppendBatcher(g.send, 5*time.Second)
	held := make(chan error, 1)
	go func() {
		_, err := b.append(ctx, "backup:1", keyedRows("held"))
		held <- err
	}()
	<-g.started
	b.close()
	if err := <-held; !errors.Is(err, context.Canceled) {
		t.Fatalf("a call in flight at close answered %v, want context.Canceled", err)
	}
	close(g.held)
	if outs, err := b.append(ctx, "backup:1", keyedRows("afterc")); err != nil || !slices.Equal(outs, []outbox.AppendOutcome{outbox.AppendCreated}) {
		t.Fatalf("append after close: %v %v, want one created row sent directly", outs, err)
	}
	if n := b.tracked(); n != 0 {
		t.Fatalf("after close %d addresses tracked, want the direct path", n)
	}
}

// tracked is how many addresses have calls in flight or queued.
func (b *appendBatcher) tracked() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.addrs)
}

// waitQueued polls until n requests queue for addr.
func waitQueued(t *testing.T, b *appendBatcher, addr string, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		b.mu.Lock()
		got := 0
		if a := b.addrs[addr]; a != nil {
			got = len(a.queue)
		}
		b.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d requests queued for %s after 5s, want %d", got, addr, n)
		}
		time.Sleep(time.Millisecond)
	}
}
