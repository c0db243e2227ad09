//go:build race

package dispatch

// raceEnabled: the race detector slows memory access several times over;
// wall-clock bounds widen (assertions counted in sweeps do not).
const raceEnabled = true
