package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/fairshard/fairshard/internal/testnode"
)

// TestLoadUsage: bad arguments exit 2 with a message naming the problem,
// before any request is sent.
func TestLoadUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"load", "extra"}, "unexpected arguments"},
		{[]string{"load", "--api-token-file", filepath.Join(t.TempDir(), "missing")}, "--api-token-file"},
		{[]string{"load", "--rows", "0", "--duration", "0"}, "set --rows or --duration"},
	} {
		code, _, stderr := runCmd(t, nil, tc.args...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want 2 mentioning %q", tc.args, code, stderr, tc.want)
		}
	}
}

// TestLoadReportsAgainstARealNode: load appends its rows to a running node
// (token read from a file), reports appends and latency, and with
// --target-addr the deliveries; exit 0 once a row was appended, 1 when none
// could be.
func TestLoadReportsAgainstARealNode(t *testing.T) {
	httpAddr := freeAddr(t)
	gossipIP, _, _ := net.SplitHostPort(freeAddr(t))
	args := []string{"serve", "--http-addr", httpAddr, "--gossip-addr", gossipIP + ":0", "--gossip-profile", testnode.GossipProfile,
		"--shutdown-grace", "5s", "--data-dir", t.TempDir(), "--node-name", "load-node"}
	base := "http://" + httpAddr
	done, serveErr := startServe(t, "serve", args, nil, base)
	defer stopServe(t, done, serveErr)

	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("unused-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	code, stdout, stderr := runCmd(t, nil, "load", "--nodes", base, "--api-token-file", tokenFile, "--rows", "20", "--duration", "0",
		"--batch", "10", "--concurrency", "1", "--namespaces", "a:1,b:2", "--target-addr", freeAddr(t), "--wait", "100ms")
	if code != 0 {
		t.Fatalf("load: exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	for _, want := range []string{"appended 20 rows in ", "append request latency ms: p50 ", "delivered "} {
		if !strings.Contains(stdout, want) {
			t.Errorf("load output lacks %q:\n%s", want, stdout)
		}
	}

	code, stdout, _ = runCmd(t, nil, "load", "--nodes", "http://"+freeAddr(t), "--rows", "5", "--duration", "300ms")
	if code != 1 || !strings.Contains(stdout, "appended 0 rows") || !strings.Contains(stdout, "last error: ") {
		t.Errorf("load against no node: exit %d, stdout %q; want 1, 0 rows and the last error", code, stdout)
	}
}
