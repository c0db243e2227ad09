package testclock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/testclock"
)

// The clock reads what it was started at, moves only by Advance and Set,
// and concurrent Advances all count.
func TestClockMovesOnlyWhenTold(t *testing.T) {
	start := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	c := testclock.New(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("Now = %v, want %v", got, start)
	}
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() { c.Advance(time.Second) })
	}
	wg.Wait()
	if got := c.Now(); !got.Equal(start.Add(100 * time.Second)) {
		t.Fatalf("after 100 concurrent one-second Advances: %v, want %v", got, start.Add(100*time.Second))
	}
	c.Set(start)
	if got := c.Now(); !got.Equal(start) {
		t.Fatalf("after Set: %v, want %v", got, start)
	}
}
