package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/testnode"
)

// TestPprofShowsNoSecrets: a profile never shows a secret. Input, the
// reproducer: a node started with --pprof-addr and its secrets as flags,
// asked for GET /debug/pprof/cmdline with the API token. The node runs as
// a real child process (this test binary, running main), so its process
// arguments hold the secrets as ps shows them; the profile shows the
// command line with each secret value redacted, the listener wants the
// API token, and serve warns that the flags are visible to ps. Secrets
// read from files or the environment are not in the arguments at all.
func TestPprofShowsNoSecrets(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a node as a child process")
	}
	const token, secret = "api-token-visible-0123", "cluster-secret-visible-0123"
	const gossipKey = "Z29zc2lwLWtleS12aXNpYmxlLTAxMjM0NTY3ODlhYmM=" // 32 bytes
	ip, _, _ := net.SplitHostPort(freeAddr(t))
	pprofAddr := freeAddr(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("api-token-from-file-0123\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		args    []string
		environ []string
		auth    string
		secrets []string // in the process arguments, never in the profile
	}{
		{"secrets as flags", []string{"--api-token", token, "--cluster-secret=" + secret, "-gossip-key", gossipKey},
			nil, token, []string{token, secret, gossipKey}},
		{"secrets from a file and the environment", []string{"--api-token-file", tokenFile},
			[]string{"FAIRSHARD_CLUSTER_SECRET=" + secret, "FAIRSHARD_GOSSIP_KEY=" + gossipKey}, "api-token-from-file-0123", nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"serve", "--pprof-addr", pprofAddr, "--http-addr", net.JoinHostPort(ip, "0"),
				"--gossip-addr", net.JoinHostPort(ip, "0"), "--gossip-profile", "fast", "--data-dir", t.TempDir(),
				"--node-name", "pprof-node", "--shutdown-grace", "5s", "--log-format", "json"}, c.args...)
			cmd := exec.Command(os.Args[0], args...)
			cmd.Env = append(append(os.Environ(), runMainEnv+"=1"), c.environ...)
			var stderr testnode.LogBuffer
			cmd.Stderr, cmd.Stdout = &stderr, io.Discard
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan struct{}) // closed when the child has exited
			var waitErr error
			go func() { waitErr = cmd.Wait(); close(exited) }()
			defer func() {
				_ = cmd.Process.Signal(syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(20 * time.Second):
					_ = cmd.Process.Kill()
					<-exited
				}
				if t.Failed() {
					t.Logf("serve's log:\n%s", stderr.String())
				}
			}()

			get := func(path, auth string) (int, []byte) {
				req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+pprofAddr+path, nil)
				if auth != "" {
					req.Header.Set("Authorization", "Bearer "+auth)
				}
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return 0, nil
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				return resp.StatusCode, b
			}
			var cmdline []byte
			deadline := time.Now().Add(30 * time.Second)
			for {
				st, b := get("/debug/pprof/cmdline", c.auth)
				if st == http.StatusOK {
					cmdline = b
					break
				}
				select {
				case <-exited:
					t.Fatalf("serve exited (%v) before its profiling listener answered", waitErr)
				default:
				}
				if time.Now().After(deadline) {
					t.Fatalf("no answer from the profiling listener after 30 s (last HTTP %d)", st)
				}
				time.Sleep(50 * time.Millisecond)
			}
			// The input really is the reproducer's: ps shows the secrets.
			if proc, err := os.ReadFile("/proc/" + strconv.Itoa(cmd.Process.Pid) + "/cmdline"); err == nil {
				for _, s := range c.secrets {
					if !bytes.Contains(proc, []byte(s)) {
						t.Errorf("/proc/PID/cmdline lacks %q: the child is not started as the reproducer's node", s)
					}
				}
			}
			for _, s := range []string{token, secret, gossipKey, "api-token-from-file-0123"} {
				if bytes.Contains(cmdline, []byte(s)) {
					t.Errorf("/debug/pprof/cmdline shows a secret: %q", cmdline)
				}
			}
			if got := bytes.Count(cmdline, []byte("REDACTED")); got != len(c.secrets) {
				t.Errorf("/debug/pprof/cmdline %q: %d values redacted, want %d", cmdline, got, len(c.secrets))
			}
			if !bytes.Contains(cmdline, []byte("--pprof-addr")) {
				t.Errorf("/debug/pprof/cmdline %q lost the other arguments", cmdline)
			}
			if st, _ := get("/debug/pprof/cmdline", ""); st != http.StatusUnauthorized {
				t.Errorf("/debug/pprof/cmdline without the token: HTTP %d, want 401", st)
			}
			if st, _ := get("/debug/pprof/heap", ""); st != http.StatusUnauthorized {
				t.Errorf("/debug/pprof/heap without the token: HTTP %d, want 401", st)
			}
			if st, _ := get("/debug/pprof/heap", c.auth); st != http.StatusOK {
				t.Errorf("/debug/pprof/heap with the token: HTTP %d, want 200", st)
			}
			warned := map[string]bool{}
			for _, line := range strings.Split(stderr.String(), "\n") {
				var l struct {
					Msg, Flag string
				}
				if json.Unmarshal([]byte(line), &l) == nil && strings.Contains(l.Msg, "secret is given on the command line") {
					warned[l.Flag] = true
				}
			}
			if len(warned) != len(c.secrets) {
				t.Errorf("warnings about secrets on the command line: %v, want one per secret flag (%d)", warned, len(c.secrets))
			}
		})
	}
}
