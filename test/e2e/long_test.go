package e2e

import (
	"os"
	"testing"
)

// longEnv names the variable that turns the volume scenarios on: `make
// test-long` sets it; `make test`, the gate CI runs, does not.
const longEnv = "FAIRSHARD_LONG"

// longScenario skips a volume scenario (millions of rows, 1 MiB rows,
// hundreds of MiB of dead letters: minutes of both cores) unless
// FAIRSHARD_LONG=1, and under -short. What they assert stays asserted;
// their figures are in docs/BENCHMARKS.md.
func longScenario(t *testing.T) {
	t.Helper()
	if testing.Short() || !long() {
		t.Skipf("a volume scenario: runs with %s=1 (make test-long)", longEnv)
	}
}

// long reports whether this run includes the volume scenarios
// (FAIRSHARD_LONG=1): a scenario that runs in both tiers may use it for
// its volume.
func long() bool { return os.Getenv(longEnv) == "1" }
