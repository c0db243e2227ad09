// Package poll waits in tests for a state the code reaches on its own
// time: a gossip round, a sweep, a node's start. It is test support:
// production code does not import it.
package poll

import (
	"testing"
	"time"
)

// First and MaxInterval bound the pause between two looks at a
// condition: the first pause is First, each next one twice the last, up
// to MaxInterval. A cheap condition is seen at once; one that calls every
// node of a cluster over HTTP is not asked more than 20 times a second.
const (
	First       = time.Millisecond
	MaxInterval = 50 * time.Millisecond
)

// Eventually asks cond until it holds and returns how long that took. Once
// timeout has passed it fails the test with what (the state waited for)
// and cond's last explanation.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) time.Duration {
	t.Helper()
	start := time.Now()
	pause := First
	for {
		ok, why := cond()
		if ok {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			if why == "" {
				t.Fatalf("timed out after %v waiting for %s", timeout, what)
			}
			t.Fatalf("timed out after %v waiting for %s: %s", timeout, what, why)
		}
		time.Sleep(pause)
		pause = min(2*pause, MaxInterval)
	}
}

// Consistently asks cond every 100 ms for d and fails the test the first
// time it does not hold, with what (the state that must last) and cond's
// explanation.
func Consistently(t testing.TB, d time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if ok, why := cond(); !ok {
			t.Fatalf("%s stopped holding: %s", what, why)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
