package lease_test

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fairshard/fairshard/shards"
)

func shardOf(key string, n uint32) uint32 { return shards.ShardOf(key, n) }

// clock is a manual clock shared by coordinators and clients in a test.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *clock { return &clock{now: time.Unix(1_000_000, 0)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// Refresh runs calls on goroutines of its own; none may outlive it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
