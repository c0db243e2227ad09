package poll

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// fakeT records a Fatalf and stops the calling goroutine as testing.T does.
type fakeT struct {
	testing.TB
	msg string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	panic(f)
}

// run calls fn with a fakeT and returns the failure message ("" if none).
func run(fn func(t testing.TB)) (msg string) {
	f := &fakeT{}
	defer func() {
		if r := recover(); r != nil && r != any(f) {
			panic(r)
		}
		msg = f.msg
	}()
	fn(f)
	return ""
}

func TestEventuallyReturnsOnceTheConditionHolds(t *testing.T) {
	n := 0
	took := Eventually(t, time.Second, "three asks", func() (bool, string) {
		n++
		return n == 3, fmt.Sprint(n)
	})
	if n != 3 || took > 500*time.Millisecond {
		t.Errorf("asked %d times in %v, want 3 in a few ms", n, took)
	}
}

func TestEventuallyFailsWithWhatAndTheLastExplanation(t *testing.T) {
	n := 0
	msg := run(func(t testing.TB) {
		Eventually(t, 30*time.Millisecond, "the impossible", func() (bool, string) {
			n++
			return false, fmt.Sprintf("ask %d", n)
		})
	})
	if !strings.Contains(msg, "waiting for the impossible: ask "+fmt.Sprint(n)) {
		t.Errorf("failure %q does not name what and the last explanation (ask %d)", msg, n)
	}
	if msg = run(func(t testing.TB) {
		Eventually(t, 0, "nothing said", func() (bool, string) { return false, "" })
	}); !strings.HasSuffix(msg, "waiting for nothing said") {
		t.Errorf("failure without an explanation = %q", msg)
	}
}

func TestConsistentlyFailsTheFirstTimeItDoesNotHold(t *testing.T) {
	n := 0
	msg := run(func(t testing.TB) {
		Consistently(t, time.Second, "a streak", func() (bool, string) {
			n++
			return n < 2, "broken"
		})
	})
	if n != 2 || msg != "a streak stopped holding: broken" {
		t.Errorf("asked %d times, failure %q", n, msg)
	}
	if msg := run(func(t testing.TB) {
		Consistently(t, 150*time.Millisecond, "always", func() (bool, string) { return true, "" })
	}); msg != "" {
		t.Errorf("a condition that holds failed: %q", msg)
	}
}
