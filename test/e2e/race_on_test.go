//go:build race

package e2e

// slowdown: race-built nodes (testnode.RaceNodes: this test binary has
// the race detector and FAIRSHARD_RACE_NODES=1) take 3-5× longer per
// sweep, commit and gossip round, and the test process's own target and
// load under -race are slower too; every wait's deadline is scaled by it
// (deadline).
const slowdown = 4
