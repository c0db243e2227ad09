package e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// fairshardBin is the binary TestMain built; empty under -short.
var fairshardBin string

// fairshardPlainBin is the binary built without -race, for the scenarios
// that measure time, memory or volume (clusterOpts.PlainBuild); the same
// file as fairshardBin when this test binary has no race detector.
var fairshardPlainBin string

// TestMain builds the fairshard binary once for every scenario (with -race
// when this test binary has it, so the nodes are checked for data races as
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
	bin, err := buildBinary(dir, raceEnabled)
	plain := bin
	if err == nil && raceEnabled {
		plain, err = buildBinary(dir, false)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	fairshardBin, fairshardPlainBin = bin, plain
	code := m.Run()
	killLeftovers()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildBinary runs `go build [-race] ./cmd/node` from the module root into
// dir (fairshard, or fairshard-race with race).
func buildBinary(dir string, race bool) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "fairshard")
	if race {
		out += "-race"
	}
	args := []string{"build", "-o", out}
	if race {
		args = append(args, "-race")
	}
	cmd := exec.Command(goBin, append(args, "./cmd/node")...)
	cmd.Dir = filepath.Join("..", "..") // test/e2e → module root
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s ./cmd/node: %v\n%s", strings.Join(args, " "), err, b)
	}
	fmt.Fprintf(os.Stderr, "e2e: built %s (race detector: %v) in %v\n", out, race, time.Since(start).Round(time.Millisecond))
	return out, nil
}
