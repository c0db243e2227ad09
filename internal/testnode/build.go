package testnode

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Build runs `go build [-race] ./cmd/node` in the module root and writes
// the binary into dir (fairshard, or fairshard-race with race).
func Build(dir string, race bool) (string, error) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	root, err := moduleRoot(goBin)
	if err != nil {
		return "", err
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
	cmd.Dir = root
	start := time.Now()
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %s ./cmd/node: %v\n%s", strings.Join(args, " "), err, b)
	}
	fmt.Fprintf(os.Stderr, "testnode: built %s (race detector: %v) in %v\n", out, race, time.Since(start).Round(time.Millisecond))
	return out, nil
}

// RaceNodesEnv names the environment variable that asks BuildForRace for
// race-built node processes: "1" (and a test binary built with -race).
const RaceNodesEnv = "FAIRSHARD_RACE_NODES"

// RaceNodes reports whether BuildForRace builds race-built nodes: this
// test binary has the race detector (Race) and RaceNodesEnv is "1". The
// gate (make test) runs node processes plain-built, as users run them,
// the race detector covering the same code in every package's in-process
// tests (node's run whole nodes in one process); make test-long runs the
// multi-process scenarios again with race-built nodes.
func RaceNodes() bool { return Race && os.Getenv(RaceNodesEnv) == "1" }

// BuildForRace builds the binaries of a test binary's node processes into
// dir: bin is race-built when RaceNodes, so the nodes are checked for data
// races as well as the test process; plain is a build without -race, for
// scenarios that measure time, memory or volume (the same file as bin
// when RaceNodes is false).
func BuildForRace(dir string) (bin, plain string, err error) {
	bin, err = Build(dir, RaceNodes())
	if err != nil || !RaceNodes() {
		return bin, bin, err
	}
	plain, err = Build(dir, false)
	return bin, plain, err
}

// moduleRoot is the directory of the go.mod of the package under test.
func moduleRoot(goBin string) (string, error) {
	b, err := exec.Command(goBin, "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMOD: %v", err)
	}
	mod := strings.TrimSpace(string(b))
	if mod == "" || mod == os.DevNull {
		return "", fmt.Errorf("go env GOMOD: not in a module")
	}
	return filepath.Dir(mod), nil
}
