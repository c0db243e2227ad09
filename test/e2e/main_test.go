package e2e

import (
	"flag"
	"fmt"
	"os"
	"testing"

	"github.com/fairshard/fairshard/internal/testnode"
)

// fairshardBin is the binary TestMain built; empty under -short.
var fairshardBin string

// fairshardPlainBin is the binary built without -race, for the scenarios
// that measure time, memory or volume (clusterOpts.PlainBuild); the same
// file as fairshardBin when this test binary has no race detector.
var fairshardPlainBin string

// TestMain builds the fairshard binary once for every scenario (with -race
// when testnode.RaceNodes, so the nodes are checked for data races as
// well as the test process; then also a plain build for the scenarios
// that ask for one), runs the tests and kills any node process a test left
// behind.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run()) // every scenario skips itself
	}
	dir, err := os.MkdirTemp("", "fairshard-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e: temp dir:", err)
		os.Exit(1)
	}
	fairshardBin, fairshardPlainBin, err = testnode.BuildForRace(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	testnode.KillAll()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}
