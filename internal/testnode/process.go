package testnode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Spec is one start of a node process.
type Spec struct {
	// Name is the node's name, for messages and the log's start line.
	Name string
	// Path and Args are the command: the node binary with `serve` and its
	// flags, or a wrapper (ip netns exec) that execs it in place.
	Path string
	Args []string
	// LogPath is the file the process's stdout and stderr are appended to,
	// after a line saying which start of Name this is and its command.
	LogPath string
	// Start numbers this start of the node (1 for the first).
	Start int
	// OnExit, if set, is called with the exit code once the process has
	// exited, before Done closes.
	OnExit func(code int)
}

// Process is one run of a node process, from Launch to its exit.
type Process struct {
	spec Spec
	cmd  *exec.Cmd
	done chan struct{}

	mu       sync.Mutex
	exitCode int
}

// live holds every running Process, so KillAll can end what a test left.
var live sync.Map // *Process → struct{}

// KillAll kills every node process still running (TestMain, after the
// tests).
func KillAll() {
	live.Range(func(k, _ any) bool {
		k.(*Process).Kill()
		return true
	})
}

// ChildEnv is this process's environment without FAIRSHARD_* variables,
// so a developer's shell settings cannot change a node under test.
func ChildEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "FAIRSHARD_") {
			env = append(env, kv)
		}
	}
	return env
}

// Launch starts s's command with ChildEnv, its output appended to
// s.LogPath, and watches for its exit. The kernel kills it if the test
// process dies (on Linux).
func Launch(s Spec) (*Process, error) {
	logf, err := os.OpenFile(s.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(logf, "=== start #%d of %s at %s: %s %s\n", s.Start, s.Name, time.Now().Format(time.RFC3339Nano), s.Path, strings.Join(s.Args, " "))
	cmd := exec.Command(s.Path, s.Args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = ChildEnv()
	cmd.SysProcAttr = childProcAttr()
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, fmt.Errorf("start %s: %w", s.Name, err)
	}
	p := &Process{spec: s, cmd: cmd, done: make(chan struct{}), exitCode: -1}
	live.Store(p, struct{}{})
	go func() {
		err := cmd.Wait()
		code := 0
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			code = ee.ExitCode() // -1 when killed by a signal
		} else if err != nil {
			code = -2
		}
		_ = logf.Close()
		p.mu.Lock()
		p.exitCode = code
		p.mu.Unlock()
		live.Delete(p)
		if s.OnExit != nil {
			s.OnExit(code)
		}
		close(p.done)
	}()
	return p, nil
}

// Pid is the process id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Running reports whether the process has not exited yet.
func (p *Process) Running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// ExitCode is the exit code: -1 while running or when killed by a signal,
// -2 when waiting for it failed.
func (p *Process) ExitCode() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exitCode
}

// Signal sends sig unless the process has exited; it reports whether it
// was still running.
func (p *Process) Signal(sig syscall.Signal) bool {
	if !p.Running() {
		return false
	}
	_ = p.cmd.Process.Signal(sig)
	return true
}

// Kill sends SIGKILL (a crash: no drain, no leave) and waits for the exit.
func (p *Process) Kill() {
	if p.Signal(syscall.SIGKILL) {
		<-p.done
	}
}

// Stop sends SIGTERM (a graceful stop: drain, hand off, leave) and waits up
// to timeout for the exit. If the process is still running then, Stop
// kills it and returns false.
func (p *Process) Stop(timeout time.Duration) bool {
	if !p.Signal(syscall.SIGTERM) {
		return true
	}
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		p.Kill()
		return false
	}
}

// WaitExit waits up to timeout for the process to exit and reports whether
// it did.
func (p *Process) WaitExit(timeout time.Duration) bool {
	select {
	case <-p.done:
		return true
	case <-time.After(timeout):
		return false
	}
}

// WaitReady asks baseURL/readyz through client every 20 ms until it
// answers 200. It returns an error at once if the process exits, or after
// timeout; either names the node and ends with the tail of its log.
func (p *Process) WaitReady(client *http.Client, baseURL string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		if !p.Running() {
			return fmt.Errorf("%s exited (code %d) before it was ready; log:\n%s", p.spec.Name, p.ExitCode(), TailFile(p.spec.LogPath, 40))
		}
		code, err := get(client, baseURL+"/readyz")
		if err == nil && code == http.StatusOK {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v (HTTP %d, %v); log:\n%s", p.spec.Name, timeout, code, err, TailFile(p.spec.LogPath, 40))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// get returns the status of a GET of u (at most 5 s).
func get(client *http.Client, u string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode, nil
}

// TailFile returns the last n lines of the file (at most 64 KiB of it).
func TailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	defer f.Close()
	st, _ := f.Stat()
	off := max(st.Size()-64<<10, 0)
	b, _ := io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
