//go:build !race

package boltstore

// raceEnabled: this test binary was built with -race.
const raceEnabled = false
