//go:build !race

package e2e

// raceEnabled: this test binary was built without -race; the nodes are
// plain builds too.
const raceEnabled = false

// slowdown: plain builds; deadlines as written (deadline).
const slowdown = 1
