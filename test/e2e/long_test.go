package e2e

import (
	"testing"

	"github.com/fairshard/fairshard/internal/testnode"
)

// longScenario skips a volume scenario (millions of rows, 1 MiB rows,
// hundreds of MiB of dead letters: minutes of both cores) unless
// FAIRSHARD_LONG=1, and under -short. What they assert stays asserted;
// their figures are in docs/BENCHMARKS.md.
func longScenario(t *testing.T) {
	t.Helper()
	if testing.Short() || !long() {
		t.Skipf("a volume scenario: runs with %s=1 (make test-long)", testnode.LongEnv)
	}
}

// long reports whether this run includes the volume scenarios
// (testnode.Long): a scenario that runs in both tiers may use it for its
// volume.
func long() bool { return testnode.Long() }
