package testnode

import "os"

// LongEnv names the variable that turns the volume scenarios on (millions
// of rows, 1 MiB rows by the hundred, long soaks): `make test-long` sets it
// to 1; `make test`, the gate CI runs, does not.
const LongEnv = "FAIRSHARD_LONG"

// Long reports whether this run includes the volume scenarios
// (FAIRSHARD_LONG=1). A test that runs in both tiers uses it to pick its
// volume: the gate's must still break the rule it checks, the long tier's
// is the figure recorded in docs/BENCHMARKS.md.
func Long() bool { return os.Getenv(LongEnv) == "1" }
