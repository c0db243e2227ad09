package compose

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// imageTag is the image docker-compose.yml's node and target services run.
	imageTag = "fairshard:local"
	// envRequireDocker, when set (.ci/run sets it), turns "no Docker engine"
	// from a skip into a failure.
	envRequireDocker = "FAIRSHARD_REQUIRE_DOCKER"
	// projectPrefix starts every compose project name this test creates.
	projectPrefix = "fairshard-composetest-"
)

// requireEngine skips the test where no Docker engine can be reached (and
// fails instead when FAIRSHARD_REQUIRE_DOCKER says the engine must be
// there). An engine without the Compose v2 plugin is a failure: the test
// cannot do its job, and skipping would hide it.
func requireEngine(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the compose end-to-end test runs a Docker engine for minutes")
	}
	if why := engineMissing(); why != "" {
		if os.Getenv(envRequireDocker) != "" {
			t.Fatalf("%s is set, so a Docker engine is required, but %s", envRequireDocker, why)
		}
		t.Skipf("skipped: no Docker engine can be reached (%s). To run it: start dockerd and install the Compose v2 plugin (README, \"The compose end-to-end test\")", why)
	}
	out, err := exec.Command("docker", "compose", "version", "--short").CombinedOutput()
	if err != nil {
		t.Fatalf("a Docker engine answers but the Compose v2 plugin does not (`docker compose version`: %v): %s\n"+
			"install it (.ci/run builds it from github.com/docker/compose/v2; README, \"The compose end-to-end test\")",
			err, strings.TrimSpace(string(out)))
	}
	t.Logf("docker compose %s", strings.TrimSpace(string(out)))
}

// engineMissing says why no Docker engine can be reached, or "".
func engineMissing() string {
	if _, err := exec.LookPath("docker"); err != nil {
		return "no docker command in PATH"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "docker", "version", "--format", "{{.Server.Version}}").CombinedOutput()
	if err != nil {
		return fmt.Sprintf("`docker version` found no daemon: %v: %s", err, lastLines(strings.TrimSpace(string(out)), 1))
	}
	return ""
}

// docker runs the docker CLI with env (nil: this process's) and returns its
// combined output; the error carries the command and the output's tail.
func docker(ctx context.Context, env []string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "docker", args...)
	cmd.Env = env
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("docker %s: %w\n%s", strings.Join(args, " "), err, lastLines(string(out), 30))
	}
	return string(out), nil
}

// mustDocker is docker with a timeout, failing the test on error.
func mustDocker(t *testing.T, timeout time.Duration, env []string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	out, err := docker(ctx, env, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// ---- the test image ----

// buildImage builds the static fairshard binary and the scratch image from
// Dockerfile.scratch, tags it fairshard:local and checks its config (user,
// entrypoint, volume). The returned func puts back the fairshard:local the
// developer had before (or removes the tag); call it once the containers
// are gone.
func buildImage(t *testing.T, root string) (restore func()) {
	t.Helper()
	dir := t.TempDir()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	start := time.Now()
	build := exec.Command(goBin, "build", "-trimpath", "-ldflags", "-s -w -X main.version=composetest",
		"-o", filepath.Join(dir, "fairshard"), "./cmd/node")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("static build of ./cmd/node: %v\n%s", err, out)
	}
	if err := os.Mkdir(filepath.Join(dir, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	df, err := os.ReadFile("Dockerfile.scratch")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), df, 0o644); err != nil {
		t.Fatal(err)
	}
	built := time.Since(start)

	prev, _ := docker(context.Background(), nil, "image", "inspect", "--format", "{{.Id}}", imageTag)
	prev = strings.TrimSpace(prev)
	if !strings.HasPrefix(prev, "sha256:") {
		prev = ""
	}
	// The legacy builder: it needs no buildx plugin and pulls nothing for
	// FROM scratch.
	env := append(os.Environ(), "DOCKER_BUILDKIT=0")
	idFile := filepath.Join(t.TempDir(), "image-id")
	mustDocker(t, 5*time.Minute, env, "build", "--quiet", "--iidfile", idFile, "--tag", imageTag, dir)
	b, err := os.ReadFile(idFile)
	if err != nil {
		t.Fatalf("docker build wrote no image id: %v", err)
	}
	id := strings.TrimSpace(string(b))
	t.Logf("image %s: binary built in %v, image in %v", imageTag, built.Round(time.Millisecond), (time.Since(start) - built).Round(time.Millisecond))
	restore = func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if prev != "" && prev != id {
			if _, err := docker(ctx, nil, "tag", prev, imageTag); err != nil {
				t.Logf("could not put back the previous %s (%s): %v", imageTag, prev, err)
				return
			}
		}
		if prev != id {
			// Untagged now (or still tagged when there was nothing to put
			// back): remove it.
			if _, err := docker(ctx, nil, "image", "rm", id); err != nil {
				t.Logf("could not remove the test image %s: %v", id, err)
			}
		}
	}

	var cfg []struct {
		Config struct {
			User       string
			Entrypoint []string
			Cmd        []string
			Volumes    map[string]struct{}
		}
	}
	out := mustDocker(t, time.Minute, nil, "image", "inspect", imageTag)
	if err := json.Unmarshal([]byte(out), &cfg); err != nil || len(cfg) != 1 {
		restore()
		t.Fatalf("docker image inspect %s: %v: %s", imageTag, err, out)
	}
	c := cfg[0].Config
	if c.User != "65532:65532" || strings.Join(c.Entrypoint, " ") != "/usr/local/bin/fairshard" || strings.Join(c.Cmd, " ") != "serve" {
		restore()
		t.Fatalf("%s: user %q entrypoint %q cmd %q; want 65532:65532, /usr/local/bin/fairshard, serve", imageTag, c.User, c.Entrypoint, c.Cmd)
	}
	if _, ok := c.Volumes["/data"]; !ok {
		restore()
		t.Fatalf("%s: volumes %v; want /data", imageTag, c.Volumes)
	}
	return restore
}

// ---- docker events ----

// event is one line of `docker events --format '{{json .}}'`.
type event struct {
	Action string `json:"Action"`
	Actor  struct {
		ID         string            `json:"ID"`
		Attributes map[string]string `json:"Attributes"`
	} `json:"Actor"`
	TimeNano int64 `json:"timeNano"`
}

func (e event) at() time.Time { return time.Unix(0, e.TimeNano) }

// eventLog records the container events of one compose project from the
// moment it was created (--since replays what came before the stream
// connected).
type eventLog struct {
	mu     sync.Mutex
	events []event
	stop   context.CancelFunc
	done   chan struct{}
}

func watchEvents(t *testing.T, project string) *eventLog {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	since := strconv.FormatInt(time.Now().Add(-time.Second).Unix(), 10)
	cmd := exec.CommandContext(ctx, "docker", "events", "--since", since,
		"--filter", "type=container", "--filter", "label=com.docker.compose.project="+project,
		"--format", "{{json .}}")
	cmd.WaitDelay = 5 * time.Second
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("docker events: %v", err)
	}
	l := &eventLog{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			var e event
			if json.Unmarshal(sc.Bytes(), &e) == nil && e.Action != "" {
				l.mu.Lock()
				l.events = append(l.events, e)
				l.mu.Unlock()
			}
		}
		_ = cmd.Wait()
	}()
	return l
}

// close stops the stream.
func (l *eventLog) close() {
	l.stop()
	<-l.done
}

// stopOf summarises how container id stopped after from: the signals it
// was sent ("kill" events), its exit code and the time from the first
// signal to its death ("die"). ok is false while it has not died.
type stopRecord struct {
	Signals  []string
	ExitCode string
	Took     time.Duration
	Died     bool
}

func (r stopRecord) String() string {
	return fmt.Sprintf("signals %v, exit code %s, %v from the first signal to exit", r.Signals, r.ExitCode, r.Took.Round(time.Millisecond))
}

func (l *eventLog) stopOf(id string, from time.Time) stopRecord {
	l.mu.Lock()
	defer l.mu.Unlock()
	var r stopRecord
	var first time.Time
	for _, e := range l.events {
		if e.Actor.ID != id || e.at().Before(from) {
			continue
		}
		switch e.Action {
		case "kill":
			if first.IsZero() {
				first = e.at()
			}
			r.Signals = append(r.Signals, e.Actor.Attributes["signal"])
		case "die":
			if !r.Died {
				r.Died = true
				r.ExitCode = e.Actor.Attributes["exitCode"]
				if !first.IsZero() {
					r.Took = e.at().Sub(first)
				}
			}
		}
	}
	return r
}

// waitStopped polls until container id has died after from.
func (l *eventLog) waitStopped(t *testing.T, id string, from time.Time, timeout time.Duration) stopRecord {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		r := l.stopOf(id, from)
		if r.Died {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("container %.12s: no die event within %v after %s (seen: %s)", id, timeout, from.Format(time.RFC3339), r)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// ---- container logs ----

// logFollower collects `docker logs -f` of one container until it stops,
// so the log of a replica that compose removes can still be read.
type logFollower struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	done chan struct{}
}

func (f *logFollower) Write(p []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.buf.Write(p)
}

func followLogs(t *testing.T, id string) *logFollower {
	t.Helper()
	f := &logFollower{done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	cmd := exec.CommandContext(ctx, "docker", "logs", "--follow", id)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("docker logs --follow %.12s: %v", id, err)
	}
	go func() {
		_ = cmd.Wait()
		cancel()
		close(f.done)
	}()
	return f
}

// text waits up to timeout for the container's log to end and returns it.
func (f *logFollower) text(timeout time.Duration) string {
	select {
	case <-f.done:
	case <-time.After(timeout):
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.buf.String()
}

// logRecords decodes a node's JSON log lines with the given msg.
func logRecords(log, msg string) []map[string]any {
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(log))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var rec map[string]any
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec["msg"] == msg {
			out = append(out, rec)
		}
	}
	return out
}

// ---- serialising runs ----

// lockHost takes the host-wide lock of this test: runs on one machine share
// one engine and the fairshard:local tag, so they go one at a time.
func lockHost(t *testing.T) (unlock func()) {
	t.Helper()
	path := filepath.Join(os.TempDir(), "fairshard-compose-test.lock")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
	if err != nil {
		t.Fatalf("open lock file %s: %v", path, err)
	}
	if !tryLock(f) {
		t.Logf("another compose test run holds %s; waiting for it", path)
		start := time.Now()
		if err := waitLock(f); err != nil {
			_ = f.Close()
			t.Fatalf("lock %s: %v", path, err)
		}
		t.Logf("waited %v for the lock", time.Since(start).Round(time.Second))
	}
	return func() {
		unlockFile(f)
		_ = f.Close()
	}
}
