//go:build race

package e2e

// slowdown: race-built nodes (testnode.Race: this test binary has the
// race detector, so TestMain builds the nodes with it) take 3-5× longer
// per sweep, commit and gossip round; every wait's deadline is scaled by
// it (deadline).
const slowdown = 4
