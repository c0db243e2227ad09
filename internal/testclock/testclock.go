// Package testclock is the manual clock the packages' tests inject where
// a component takes a Now func (boltstore.Options.Now, dispatch, lease,
// kv, quota): time moves only when the test says, so expiry, backoff and
// lease rules are checked by count and order, not by sleeping.
package testclock

import (
	"sync"
	"time"
)

// Clock is a manual clock, safe for concurrent use: Now returns the time
// it was started or last set at, moved on by every Advance.
type Clock struct {
	mu sync.Mutex
	t  time.Time
}

// New returns a Clock reading start.
func New(start time.Time) *Clock { return &Clock{t: start} }

// Now returns the clock's time (pass c.Now where a Now func is taken).
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock on by d (a negative d moves it back).
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// Set makes the clock read t.
func (c *Clock) Set(t time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = t
}
