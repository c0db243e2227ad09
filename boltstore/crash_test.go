package boltstore

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/fairshard/fairshard/outbox"
)

const envCrashChild = "BOLTSTORE_TEST_CRASH_CHILD"

// crashChildMain is the child of TestCrashRecovery: four goroutines append,
// claim and settle in a loop until the process is killed. After each
// acknowledged Append the keys go to acked.log, fsync'd.
func crashChildMain(dir string) int {
	s, err := Open(filepath.Join(dir, "outbox.db"), Options{ShardCount: testShardCount, LockTimeout: 5 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash child open:", err)
		return 2
	}
	log, err := os.OpenFile(filepath.Join(dir, "acked.log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		fmt.Fprintln(os.Stderr, "crash child log:", err)
		return 2
	}
	var logMu sync.Mutex
	fmt.Println("ready")
	ctx := context.Background()
	pid := os.Getpid()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(pid), uint64(g)))
			for seq := 0; ; seq++ {
				n := 1 + rng.IntN(20)
				rows := make([]outbox.Row, n)
				for i := range rows {
					rows[i] = row(fmt.Sprintf("p%d-g%d-%d-%d", pid, g, seq, i), fmt.Sprintf("ns%d", rng.IntN(3)), fmt.Sprintf("q%d", rng.IntN(2)))
				}
				if _, err := s.Append(ctx, rows); err != nil {
					fmt.Fprintln(os.Stderr, "append:", err)
					os.Exit(3)
				}
				var buf bytes.Buffer
				for _, r := range rows {
					buf.WriteString(r.DispatchKey + "\n")
				}
				logMu.Lock()
				_, err1 := log.Write(buf.Bytes())
				err2 := log.Sync()
				logMu.Unlock()
				if err1 != nil || err2 != nil {
					os.Exit(4)
				}
				claimed, err := s.Claim(ctx, outbox.ClaimParams{Limit: 8, Now: time.Now()})
				if err != nil {
					os.Exit(5)
				}
				for _, c := range claimed {
					switch rng.IntN(4) {
					case 0:
						err = s.Complete(ctx, outbox.CompleteParams{DispatchKey: c.DispatchKey, Claim: c.Version, Now: time.Now()})
					case 1:
						err = s.Retry(ctx, outbox.RetryParams{DispatchKey: c.DispatchKey, Claim: c.Version, NextAttempt: c.Attempt + 1, VisibleAfter: time.Now(), LastError: "again"})
					case 2:
						err = s.Fail(ctx, outbox.FailParams{DispatchKey: c.DispatchKey, Claim: c.Version, LastError: "boom", Now: time.Now()})
					}
					if err != nil {
						os.Exit(6)
					}
				}
				if seq%10 == 0 {
					if _, err := s.RearmStale(ctx, outbox.RearmParams{OlderThan: time.Now().Add(-50 * time.Millisecond), VisibleAfter: time.Now(), Limit: 50}); err != nil {
						os.Exit(7)
					}
				}
			}
		}()
	}
	wg.Wait()
	return 0
}

// TestCrashRecovery SIGKILLs a writing child 20 times at random moments.
// After each kill: the file opens, Check passes (every row in exactly one
// status index, every counter right), and every acknowledged append is
// present.
func TestCrashRecovery(t *testing.T) {
	if testing.Short() {
		t.Skip("crash test skipped under -short")
	}
	t.Parallel() // mostly waits on its child: overlap it with the growth test
	dir := t.TempDir()
	rng := rand.New(rand.NewPCG(42, 42))
	start := time.Now()
	for round := range 20 {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), envCrashChild+"="+dir)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		stdout, err := cmd.StdoutPipe()
		must(t, err)
		must(t, cmd.Start())
		if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatalf("round %d: child did not start: %q %v\n%s", round, line, err, stderr.String())
		}
		time.Sleep(time.Duration(20+rng.IntN(400)) * time.Millisecond) // the random kill moment
		must(t, cmd.Process.Signal(syscall.SIGKILL))
		err = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() {
			t.Fatalf("round %d: child exited on its own (%v):\n%s", round, err, stderr.String())
		}

		s, err := Open(filepath.Join(dir, "outbox.db"), Options{ShardCount: testShardCount})
		if err != nil {
			t.Fatalf("round %d: reopen after SIGKILL: %v", round, err)
		}
		if err := s.Check(ctx); err != nil {
			s.Close()
			t.Fatalf("round %d: check after SIGKILL: %v", round, err)
		}
		acked := readAcked(t, filepath.Join(dir, "acked.log"))
		for _, k := range acked {
			if _, err := s.Get(ctx, k); err != nil {
				s.Close()
				t.Fatalf("round %d: acknowledged append %q lost: %v", round, k, err)
			}
		}
		stats, err := s.NamespaceStats(ctx)
		must(t, err)
		total := 0
		for _, st := range stats {
			total += st.Pending + st.Claimed + st.Done + st.Failed + st.Cancelled
		}
		if total < len(acked) {
			t.Fatalf("round %d: %d rows counted, %d acknowledged", round, total, len(acked))
		}
		t.Logf("round %d: %d acknowledged rows present, %d rows stored", round, len(acked), total)
		must(t, s.Close())
	}
	t.Logf("20 kill/reopen rounds in %s", time.Since(start).Round(time.Millisecond))
}

// readAcked returns the complete lines of the ack log (a torn last line was
// never acknowledged to anyone).
func readAcked(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	var out []string
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		out = append(out, string(b[:i]))
		b = b[i+1:]
	}
	return out
}
