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

// TestMain builds the fairshard binary once for every scenario (with -race
// when this test binary has it, so the nodes are checked for data races as
// well as the test process), runs the tests and kills any node process a
// test left behind.
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
	bin, err := buildBinary(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		_ = os.RemoveAll(dir)
		os.Exit(1)
	}
	fairshardBin = bin
	code := m.Run()
	killLeftovers()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// buildBinary runs `go build [-race] ./cmd/node` from the module root into
// dir.
func buildBinary(dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "fairshard")
	args := []string{"build", "-o", out}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.Command(goBin, append(args, "./cmd/node")...)
	cmd.Dir = filepath.Join("..", "..") // test/e2e → module root
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s ./cmd/node: %v\n%s", strings.Join(args, " "), err, b)
	}
	fmt.Fprintf(os.Stderr, "e2e: built %s (race detector: %v) in %v\n", out, raceEnabled, time.Since(start).Round(time.Millisecond))
	return out, nil
}
