package pause

import (
	"context"
	"fmt"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A gap longer than the threshold is a pause: Allow is false for the old
// generation and while the watch is overdue, OnPause is told the gap.
func TestWatchFencesAcrossAGap(t *testing.T) {
	var pauses atomic.Int64
	w := New(50*time.Millisecond, func(gap time.Duration) {
		if gap <= 50*time.Millisecond {
			t.Errorf("OnPause called with a gap of %v, at or below the threshold", gap)
		}
		pauses.Add(1)
	})
	gen := w.Gen()
	if !w.Allow(gen) {
		t.Fatal("a fresh watch does not allow its own generation")
	}
	time.Sleep(80 * time.Millisecond) // the watch did not tick: overdue
	if w.Allow(gen) {
		t.Fatal("an overdue watch allows an action before it ticked")
	}
	w.Check()
	if pauses.Load() != 1 || w.Gen() == gen {
		t.Fatalf("after the gap: %d pauses, gen %d (was %d); want one pause and a new generation", pauses.Load(), w.Gen(), gen)
	}
	if w.Allow(gen) {
		t.Fatal("an action of the generation before the pause is still allowed")
	}
	if !w.Allow(w.Gen()) {
		t.Fatal("an action of the new generation is not allowed right after the tick")
	}
	w.Check() // no gap now
	if pauses.Load() != 1 {
		t.Fatalf("a tick without a gap counted as a pause (%d)", pauses.Load())
	}
}

// A real SIGSTOP of the process is seen as a pause by a running Watch:
// the monotonic clock counts the stopped time.
func TestWatchSeesAStop(t *testing.T) {
	var gaps atomic.Int64
	w := New(100*time.Millisecond, func(gap time.Duration) { gaps.Store(int64(gap)) })
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	defer func() { cancel(); <-done }()
	time.Sleep(50 * time.Millisecond)
	stopFor(t, 400*time.Millisecond)
	deadline := time.Now().Add(5 * time.Second)
	for gaps.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if g := time.Duration(gaps.Load()); g < 300*time.Millisecond {
		t.Fatalf("pause seen with a gap of %v, want about the 400 ms stop", g)
	}
}

// stopFor stops this process with SIGSTOP and has a helper process send
// SIGCONT after d.
func stopFor(t *testing.T, d time.Duration) {
	t.Helper()
	pid := syscall.Getpid()
	attr := &syscall.ProcAttr{Files: []uintptr{0, 1, 2}}
	script := fmt.Sprintf("sleep %.3f; kill -CONT %d", d.Seconds(), pid)
	if _, err := syscall.ForkExec("/bin/sh", []string{"sh", "-c", script}, attr); err != nil {
		t.Skipf("cannot start a helper to resume the process: %v", err)
	}
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
}
