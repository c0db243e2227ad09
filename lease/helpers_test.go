package lease_test

import (
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fairshard/fairshard/internal/testclock"
	"github.com/fairshard/fairshard/shards"
)

func shardOf(key string, n uint32) uint32 { return shards.ShardOf(key, n) }

// clock is the manual clock shared by coordinators and clients in a test.
type clock = testclock.Clock

func newClock() *clock { return testclock.New(time.Unix(1_000_000, 0)) }

// Refresh runs calls on goroutines of its own; none may outlive it.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
