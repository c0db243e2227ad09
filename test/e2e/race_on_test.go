//go:build race

package e2e

// raceEnabled: this test binary was built with -race, so TestMain builds
// the node binary with -race too and every scenario fails on a data race
// reported by any node (see checkRaces).
const raceEnabled = true

// slowdown: race-built nodes take 3-5× longer per sweep, commit and
// gossip round; every wait's deadline is scaled by it (deadline).
const slowdown = 4
