package e2e

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// fairshardBin is the binary TestMain built; empty under -short.
var fairshardBin string

// TestMain builds the fairshard binary once for every scenario (a plain
// build: the race detector instruments this test process, not the nodes),
// runs the tests and kills any node process a test left behind.
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

// buildBinary runs `go build ./cmd/node` from the module root into dir.
func buildBinary(dir string) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	out := filepath.Join(dir, "fairshard")
	cmd := exec.Command(goBin, "build", "-o", out, "./cmd/node")
	cmd.Dir = filepath.Join("..", "..") // test/e2e → module root
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ./cmd/node: %v\n%s", err, b)
	}
	fmt.Fprintf(os.Stderr, "e2e: built %s in %v\n", out, time.Since(start).Round(time.Millisecond))
	return out, nil
}
