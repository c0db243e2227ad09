//go:build race

package e2e

// raceEnabled: this test binary was built with -race, so TestMain builds
// the node binary with -race too and every scenario fails on a data race
// reported by any node (see checkRaces).
const raceEnabled = true
