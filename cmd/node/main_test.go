package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/cluster/clustertest"
	"github.com/fairshard/fairshard/internal/testnode"
	"github.com/fairshard/fairshard/loadgen"
	"github.com/fairshard/fairshard/node"
	"github.com/fairshard/fairshard/outbox"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"
)

// runCmd runs the binary's run in-process and returns its exit code,
// stdout and stderr.
func runCmd(t *testing.T, environ []string, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := run(args, environ, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// wantClean requires output without a Go panic or stack trace (a
// message saying that a library panicked and was contained is fine).
func wantClean(t *testing.T, out string) {
	t.Helper()
	for _, bad := range []string{"panic: ", "goroutine ", ".go:"} {
		if strings.Contains(out, bad) {
			t.Errorf("output contains %q (a panic or stack trace?):\n%s", bad, out)
		}
	}
}

func TestEnvName(t *testing.T) {
	for flagName, env := range map[string]string{
		"node-name":             "FAIRSHARD_NODE_NAME",
		"data-dir":              "FAIRSHARD_DATA_DIR",
		"default-max-in-flight": "FAIRSHARD_DEFAULT_MAX_IN_FLIGHT",
		"log-level":             "FAIRSHARD_LOG_LEVEL",
	} {
		if got := node.EnvName(flagName); got != env {
			t.Errorf("EnvName(%q) = %q, want %q", flagName, got, env)
		}
	}
}

// TestEveryDocumentedSettingHasAFlag: the names the issue fixes (scripts,
// compose files and docs rely on them) are all flags, so each has its
// FAIRSHARD_* variable.
func TestEveryDocumentedSettingHasAFlag(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	var cfg node.Config
	cfg.RegisterFlags(fs)
	for _, name := range []string{"node-name", "data-dir", "http-addr", "advertise-http", "gossip-addr", "advertise-gossip",
		"join", "shards", "default-max-in-flight", "default-target", "api-token", "gossip-key", "gossip-key-file", "log-level", "log-format",
		"cluster-secret", "poll-interval", "batch-size", "delivery-timeout", "visibility-timeout", "retry-base",
		"retry-factor", "retry-cap", "max-attempts", "handoff-interval", "handoff-batch", "shutdown-grace", "tombstone-retention",
		"cluster-secret-file", "insecure", "target-allow", "metrics-namespaces"} {
		if fs.Lookup(name) == nil {
			t.Errorf("no flag --%s (env %s)", name, node.EnvName(name))
		}
	}
	d := node.DefaultConfig()
	if d.DataDir != "./data" || d.HTTPAddr != "127.0.0.1:8080" || d.GossipAddr != "127.0.0.1:7946" || d.Shards != 1024 || d.Insecure || d.ClusterSecret != "" ||
		d.DefaultMaxInFlight != 1024 || d.LogLevel != "info" || d.LogFormat != "text" || d.DefaultTarget != "" || d.APIToken != "" {
		t.Errorf("defaults differ from the documented ones: %+v", d)
	}
}

// TestEnvMapping: every FAIRSHARD_* variable sets its flag, flags win,
// unknown FAIRSHARD_* variables are reported and others ignored.
func TestEnvMapping(t *testing.T) {
	key := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{7}, 16))
	key2 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{8}, 32))
	environ := []string{
		"FAIRSHARD_NODE_NAME=from-env",
		"FAIRSHARD_DATA_DIR=/tmp/env-data",
		"FAIRSHARD_JOIN=10.0.0.1:7946, 10.0.0.2:7946",
		"FAIRSHARD_SHARDS=64",
		"FAIRSHARD_DEFAULT_MAX_IN_FLIGHT=9",
		"FAIRSHARD_DEFAULT_TARGET=http://t:9/{namespace}",
		"FAIRSHARD_API_TOKEN=tok",
		"FAIRSHARD_CLUSTER_SECRET=cluster-secret-from-env", // a token with --join needs one
		"FAIRSHARD_GOSSIP_KEY=" + key + ", " + key2,
		"FAIRSHARD_POLL_INTERVAL=5ms",
		"FAIRSHARD_LOG_FORMAT=json",
		"FAIRSHARD_HTTP_ADDR=:1111",
		"FAIRSHARD_BOGUS=1",
		"FAIRSHARD_NODENAME=typo",
		"HOME=/root",
		"NOT_FAIRSHARD_X=1",
		"FAIRSHARD_NOVALUE",
	}
	cfg, unknown, err := parseServeFlags([]string{"--http-addr", "127.0.0.1:2222", "--log-format=text"}, environ, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := node.DefaultConfig()
	want.NodeName, want.DataDir, want.Join, want.Shards = "from-env", "/tmp/env-data", []string{"10.0.0.1:7946", "10.0.0.2:7946"}, 64
	want.DefaultMaxInFlight, want.DefaultTarget, want.APIToken = 9, "http://t:9/{namespace}", "tok" // the cluster secret never defaults to the token
	want.ClusterSecret = "cluster-secret-from-env"
	want.GossipKeys, want.Dispatch.PollInterval = [][]byte{bytes.Repeat([]byte{7}, 16), bytes.Repeat([]byte{8}, 32)}, 5*time.Millisecond
	want.HTTPAddr, want.LogFormat = "127.0.0.1:2222", "text" // flags win
	if err := want.Validate(); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("config from env and flags:\n got %+v\nwant %+v", cfg, want)
	}
	if fmt.Sprint(unknown) != "[FAIRSHARD_BOGUS FAIRSHARD_NODENAME]" {
		t.Errorf("unknown variables %v, want [FAIRSHARD_BOGUS FAIRSHARD_NODENAME]", unknown)
	}
}

// TestInvalidConfigExits2: a bad flag or variable exits 2 with a message
// naming the flag (or variable), before anything starts.
func TestInvalidConfigExits2(t *testing.T) {
	keyFile := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(keyFile, []byte("# primary first\nCAgICAgICAgICAgICAgICA==\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		environ []string
		args    []string
		want    []string
	}{
		{nil, []string{"serve", "--shards", "0"}, []string{"--shards"}},
		{nil, []string{"--log-format", "xml", "--log-level", "loud"}, []string{"--log-format", "--log-level"}},
		{nil, []string{"--shards", "-1"}, []string{"-shards"}},
		{nil, []string{"--gossip-key", "c2hvcnQ="}, []string{"-gossip-key", "want 16, 24 or 32"}},
		{nil, []string{"--gossip-key", "BwcHBwcHBwcHBwcHBwcHBw==,BwcHBwcHBwcHBwcHBwcHBw=="}, []string{"-gossip-key", "keys 1 and 2 are the same key"}},
		{nil, []string{"--gossip-key-file", "/nonexistent/keys"}, []string{"--gossip-key-file", "no such file"}},
		{nil, []string{"--gossip-key-file", "/dev/null"}, []string{"--gossip-key-file", "no key"}},
		{nil, []string{"--gossip-key-file", keyFile, "--gossip-key", "BwcHBwcHBwcHBwcHBwcHBw=="}, []string{"--gossip-key-file", "both set"}},
		{nil, []string{"--nope"}, []string{"-nope"}},
		{nil, []string{"serve", "extra"}, []string{"unexpected arguments"}},
		{nil, []string{"--advertise-gossip", "host.example:7946"}, []string{"--advertise-gossip"}},
		{nil, []string{"--visibility-timeout", "5s", "--delivery-timeout", "10s"}, []string{"--visibility-timeout"}},
		{nil, []string{"--join", "nohostport"}, []string{"--join"}},
		{[]string{"FAIRSHARD_SHARDS=abc"}, nil, []string{"FAIRSHARD_SHARDS"}},
		{[]string{"FAIRSHARD_POLL_INTERVAL=fast"}, nil, []string{"FAIRSHARD_POLL_INTERVAL"}},
		{[]string{"FAIRSHARD_LOG_LEVEL=loud"}, nil, []string{"--log-level"}},
		{nil, []string{"target", "--signing-secret", "whsec_c2hvcnQ="}, []string{"--signing-secret", "secret 0", "5 bytes"}},
		{nil, []string{"target", "--signing-secret", "plain-password"}, []string{"--signing-secret", "whsec_"}},
		// Secure defaults: beyond loopback without both secrets the node
		// refuses to start, naming what is missing.
		{nil, []string{"--http-addr", "0.0.0.0:0"}, []string{"--http-addr 0.0.0.0:0", "--cluster-secret", "--gossip-key", "--insecure"}},
		{nil, []string{"--gossip-addr", ":0", "--cluster-secret", "cluster-secret-0123456789"}, []string{"--gossip-addr :0", "--gossip-key", "--insecure"}},
		{[]string{"FAIRSHARD_HTTP_ADDR=10.1.2.3:8080", "FAIRSHARD_GOSSIP_KEY=BwcHBwcHBwcHBwcHBwcHBw=="}, nil, []string{"--cluster-secret"}},
		{nil, []string{"--advertise-http", "node.example:8080"}, []string{"--advertise-http", "--insecure"}},
		{nil, []string{"--cluster-secret", "short"}, []string{"--cluster-secret", "at least 16"}},
		{nil, []string{"--api-token", "same-token-0123456789", "--cluster-secret", "same-token-0123456789"}, []string{"--cluster-secret", "must differ from --api-token"}},
		{nil, []string{"--target-allow", "10.0.0.0/33"}, []string{"--target-allow"}},
		// A cluster guarded by an API token signs its node-to-node calls:
		// joining without a cluster secret is refused.
		{[]string{"FAIRSHARD_API_TOKEN=api-token-0123456789"}, []string{"--join", "127.0.0.1:7946"}, []string{"--cluster-secret", "--api-token", "--join"}},
		// Profiles: always behind the API token, never beyond loopback
		// without --pprof-insecure (the reproducer's 0.0.0.0 start).
		{nil, []string{"--pprof-addr", "0.0.0.0:6060"}, []string{"--pprof-addr", "--api-token"}},
		{nil, []string{"--pprof-addr", "127.0.0.1:6060"}, []string{"--pprof-addr", "--api-token"}},
		{[]string{"FAIRSHARD_API_TOKEN=api-token-0123456789"}, []string{"--pprof-addr", "0.0.0.0:6060"}, []string{"--pprof-addr", "beyond loopback", "--pprof-insecure"}},
		{[]string{"FAIRSHARD_API_TOKEN=api-token-0123456789"}, []string{"--pprof-addr", ":6060"}, []string{"--pprof-addr", "--pprof-insecure"}},
		{nil, []string{"--api-token-file", "/nonexistent/token"}, []string{"--api-token-file", "no such file"}},
		{nil, []string{"--api-token-file", "/dev/null"}, []string{"--api-token-file", "empty"}},
	} {
		code, _, stderr := runCmd(t, c.environ, c.args...)
		if code != 2 {
			t.Errorf("%v %v: exit %d, want 2; stderr:\n%s", c.environ, c.args, code, stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("%v %v: stderr does not mention %q:\n%s", c.environ, c.args, w, stderr)
			}
		}
		wantClean(t, stderr)
	}
}

func TestHelpVersionAndUnknownCommand(t *testing.T) {
	code, stdout, _ := runCmd(t, nil, "serve", "--help")
	if code != 0 || !strings.Contains(stdout, "-node-name") || !strings.Contains(stdout, "FAIRSHARD_NODE_NAME") {
		t.Errorf("serve --help: exit %d, want 0 and the flags and their variables on stdout:\n%s", code, stdout)
	}
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		code, stdout, _ := runCmd(t, nil, args...)
		if code != 0 || !strings.HasPrefix(stdout, "fairshard dev (module github.com/fairshard/fairshard") || !strings.Contains(stdout, ", revision ") {
			t.Errorf("%v: exit %d, %q; want 0, the version, module and revision", args, code, stdout)
		}
	}
	code, _, stderr := runCmd(t, nil, "frobnicate")
	if code != 2 || !strings.Contains(stderr, `"frobnicate"`) || !strings.Contains(stderr, "probe") {
		t.Errorf("unknown command: exit %d, stderr %q; want 2, naming it and every command", code, stderr)
	}
	code, _, stderr = runCmd(t, nil, "help", "frobnicate")
	if code != 2 || !strings.Contains(stderr, `"frobnicate"`) {
		t.Errorf("help of an unknown command: exit %d, stderr %q; want 2", code, stderr)
	}
}

// TestHelpListsEveryCommand: fairshard --help (and -h, help) lists every
// subcommand on one line with its summary, on stdout, exit 0.
func TestHelpListsEveryCommand(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		code, stdout, stderr := runCmd(t, nil, args...)
		if code != 0 || stderr != "" {
			t.Errorf("%v: exit %d, stderr %q; want 0 and nothing on stderr", args, code, stderr)
		}
		for _, c := range commands() {
			line := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(c.name) + ` +` + regexp.QuoteMeta(c.summary) + `$`)
			if c.summary == "" || strings.Contains(c.summary, "\n") || !line.MatchString(stdout) {
				t.Errorf("%v does not list %q on one line with its summary %q:\n%s", args, c.name, c.summary, stdout)
			}
		}
	}
}

// TestEverySubcommandHelpExits0: every subcommand's --help, -h and
// "help NAME" print its usage on stdout and exit 0, starting nothing.
func TestEverySubcommandHelpExits0(t *testing.T) {
	for _, c := range commands() {
		for _, args := range [][]string{{c.name, "--help"}, {c.name, "-h"}, {"help", c.name}} {
			if c.name == "help" && args[0] == "help" && len(args) == 2 && args[1] == "help" {
				continue // "help help" is refused like any other non-command
			}
			code, stdout, stderr := runCmd(t, nil, args...)
			if code != 0 || stderr != "" || !strings.Contains(stdout, "fairshard") {
				t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit 0 and the usage on stdout", args, code, stdout, stderr)
			}
			if c.name != "help" && !strings.Contains(stdout, "usage: fairshard "+c.name) {
				t.Errorf("%v: the usage does not start with \"usage: fairshard %s\":\n%s", args, c.name, stdout)
			}
		}
	}
	// A bad flag is still an error: exit 2, the message and the usage on
	// stderr.
	for _, c := range commands() {
		if c.name == "help" {
			continue
		}
		code, _, stderr := runCmd(t, nil, c.name, "--no-such-flag")
		if code != 2 || !strings.Contains(stderr, "no-such-flag") {
			t.Errorf("%s --no-such-flag: exit %d, stderr %q; want 2 naming the flag", c.name, code, stderr)
		}
	}
}

// duplicateKeys returns the keys repeated within any object of one JSON
// text.
func duplicateKeys(text []byte) ([]string, error) {
	dec := json.NewDecoder(bytes.NewReader(text))
	var dups []string
	var walk func() error
	walk = func() error {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		switch tok {
		case json.Delim('{'):
			seen := map[string]bool{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return err
				}
				k := kt.(string)
				if seen[k] {
					dups = append(dups, k)
				}
				seen[k] = true
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		case json.Delim('['):
			for dec.More() {
				if err := walk(); err != nil {
					return err
				}
			}
			_, err = dec.Token()
			return err
		}
		return nil
	}
	return dups, walk()
}

// TestJSONLogsHaveNoRepeatedKeysAndDurationStrings: the process logger
// writes each key once per object (last value wins: a memberlist bridge's
// "component" over the cluster's, a call's "node" over a With's), merges
// repeated groups, keeps slog's own keys, and writes durations as strings.
func TestJSONLogsHaveNoRepeatedKeysAndDurationStrings(t *testing.T) {
	var buf bytes.Buffer
	cfg := node.DefaultConfig()
	cfg.LogFormat, cfg.LogLevel = "json", "debug"
	log := newLogger(cfg, &buf)
	log.With("component", "cluster", "node", "n1").With("component", "memberlist").
		WithGroup("peer").With("addr", "a", "rtt", 3*time.Millisecond).
		Info("hello", "addr", "b", "grace", 2500*time.Millisecond, slog.Group("sub", "d", time.Second, "d", time.Minute))
	log.Info("builtin keys", "msg", "mine", "level", 3, "time", "now", "attr_msg", "x")
	log.Info("groups", slog.Group("g", "a", 1), slog.Group("g", "b", 2), slog.Group("", "inline", true, "inline", false))
	lines := bytes.Split(bytes.TrimSpace(buf.Bytes()), []byte("\n"))
	if len(lines) != 3 {
		t.Fatalf("%d lines, want 3:\n%s", len(lines), buf.String())
	}
	for _, l := range lines {
		if dups, err := duplicateKeys(l); err != nil || len(dups) > 0 {
			t.Errorf("repeated keys %v (err %v) in %s", dups, err, l)
		}
	}
	var first struct {
		Msg       string `json:"msg"`
		Component string `json:"component"`
		Node      string `json:"node"`
		Peer      struct {
			Addr  string `json:"addr"`
			RTT   string `json:"rtt"`
			Grace string `json:"grace"`
			Sub   struct {
				D string `json:"d"`
			} `json:"sub"`
		} `json:"peer"`
	}
	if err := json.Unmarshal(lines[0], &first); err != nil {
		t.Fatalf("%v: %s", err, lines[0])
	}
	if first.Msg != "hello" || first.Component != "memberlist" || first.Node != "n1" || first.Peer.Addr != "b" ||
		first.Peer.RTT != "3ms" || first.Peer.Grace != "2.5s" || first.Peer.Sub.D != "1m0s" {
		t.Errorf("first line decoded as %+v from %s", first, lines[0])
	}
	var second map[string]any
	_ = json.Unmarshal(lines[1], &second)
	if second["msg"] != "builtin keys" || second["level"] != "INFO" || second["attr_msg"] != "x" || second["attr_level"] != float64(3) {
		t.Errorf("second line %s: slog's keys must stay slog's, ours renamed attr_* (then the later \"attr_msg\" wins)", lines[1])
	}
	var third struct {
		G      map[string]int `json:"g"`
		Inline bool           `json:"inline"`
	}
	_ = json.Unmarshal(lines[2], &third)
	if third.G["a"] != 1 || third.G["b"] != 2 || third.Inline {
		t.Errorf("third line %s: want g merged to {a:1,b:2} and inline=false", lines[2])
	}
}

// durationKey matches keys that name a duration; in JSON logs their
// values must be strings such as "5s".
var durationKey = regexp.MustCompile(`(?i)(grace|timeout|interval|duration|took|elapsed|wait|delay|backoff|age|after|rtt)$`)

// checkJSONLog fails on any log line of a JSON log that is not JSON, that
// repeats a key, or that writes a duration-named value as a number.
func checkJSONLog(t *testing.T, log string) {
	t.Helper()
	n := 0
	for _, l := range strings.Split(strings.TrimSpace(log), "\n") {
		if !strings.HasPrefix(l, "{") {
			continue
		}
		n++
		if dups, err := duplicateKeys([]byte(l)); err != nil || len(dups) > 0 {
			t.Errorf("log line with repeated keys %v (err %v): %s", dups, err, l)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Errorf("log line is not JSON: %v: %s", err, l)
			continue
		}
		var walk func(map[string]any)
		walk = func(m map[string]any) {
			for k, v := range m {
				switch v := v.(type) {
				case float64:
					if durationKey.MatchString(k) {
						t.Errorf("log line writes duration %q as the number %v: %s", k, v, l)
					}
				case map[string]any:
					walk(v)
				}
			}
		}
		walk(m)
	}
	if n == 0 {
		t.Errorf("no JSON log lines in:\n%s", log)
	}
}

// newStoreFile creates a data dir holding a store with one row.
func newStoreFile(t *testing.T) (dir string) {
	t.Helper()
	dir = t.TempDir()
	s, err := boltstore.Open(filepath.Join(dir, node.DataFileName), boltstore.Options{ShardCount: 1024})
	if err != nil {
		t.Fatal(err)
	}
	var rows []outbox.Row
	for i := range 200 {
		rows = append(rows, outbox.Row{DispatchKey: fmt.Sprintf("k-%d", i), Namespace: "ns", TaskQueue: "q", Payload: bytes.Repeat([]byte("p"), 500)})
	}
	if _, err := s.Append(context.Background(), rows); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCheck: `fairshard check DATA_DIR` exits 0 on a consistent store and
// 1 with a clear message (no panic) on a missing, locked, mismatched or
// corrupt one; 2 on bad usage.
func TestCheck(t *testing.T) {
	dir := newStoreFile(t)
	code, stdout, stderr := runCmd(t, nil, "check", dir)
	if code != 0 || !strings.Contains(stdout, "ok") {
		t.Fatalf("check of a good store: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	// --digests prints each shard's digest, as the store maintains it.
	code, stdout, stderr = runCmd(t, nil, "check", "--digests", dir)
	s, err := boltstore.Open(filepath.Join(dir, node.DataFileName), boltstore.Options{ShardCount: 1024})
	if err != nil {
		t.Fatal(err)
	}
	digests, err := s.ShardDigests(context.Background())
	_ = s.Close()
	if err != nil || len(digests) == 0 {
		t.Fatalf("digests of the test store: %v %v", digests, err)
	}
	for _, d := range digests {
		if line := fmt.Sprintf("shard %d rows %d sum %016x\n", d.Shard, d.Rows, d.Sum); code != 0 || !strings.Contains(stdout, line) {
			t.Fatalf("check --digests: exit %d, stdout %q lacks %q (stderr %q)", code, stdout, line, stderr)
		}
	}
	// A digest that disagrees with the rows is found.
	tamperDigest(t, dir)
	if code, _, stderr := runCmd(t, nil, "check", dir); code != 1 || !strings.Contains(stderr, "digest of shard") {
		t.Fatalf("check of a store with a wrong digest: exit %d, stderr %q", code, stderr)
	}
	dir = newStoreFile(t)

	for _, args := range [][]string{{"check"}, {"check", "a", "b"}, {"check", "--shards", "x", dir}} {
		if code, _, _ := runCmd(t, nil, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}

	code, _, stderr = runCmd(t, nil, "check", filepath.Join(t.TempDir(), "missing"))
	if code != 1 || !strings.Contains(stderr, "no such file") {
		t.Errorf("check of a missing dir: exit %d, stderr %q", code, stderr)
	}

	code, _, stderr = runCmd(t, nil, "check", "--shards", "16", dir)
	if code != 1 || !strings.Contains(stderr, "shard") {
		t.Errorf("check with another shard count: exit %d, stderr %q; want 1 naming the shard count", code, stderr)
	}
	wantClean(t, stderr)

	// Locked: a running node (here: the store opened in this process)
	// holds the file lock.
	s, err = boltstore.Open(filepath.Join(dir, node.DataFileName), boltstore.Options{ShardCount: 1024})
	if err != nil {
		t.Fatal(err)
	}
	code, _, stderr = runCmd(t, nil, "check", dir)
	_ = s.Close()
	if code != 1 || !strings.Contains(stderr, "in use by another process") {
		t.Errorf("check of a locked store: exit %d, stderr %q", code, stderr)
	}
	wantClean(t, stderr)

	// Corrupt: not a bbolt file at all, a truncated file, and a real file
	// with garbage over its data pages.
	garbage := t.TempDir()
	writeFile(t, filepath.Join(garbage, node.DataFileName), bytes.Repeat([]byte("garbage!"), 4096))
	truncated := newStoreFile(t)
	truncate(t, filepath.Join(truncated, node.DataFileName), 5000)
	clobbered := newStoreFile(t)
	clobber(t, filepath.Join(clobbered, node.DataFileName), 4*4096)
	for name, d := range map[string]string{"garbage": garbage, "truncated": truncated, "clobbered pages": clobbered} {
		code, stdout, stderr := runCmd(t, nil, "check", d)
		if code != 1 || !strings.Contains(stderr, "corrupt") {
			t.Errorf("check of a %s file: exit %d, stdout %q, stderr %q; want 1 saying corrupt", name, code, stdout, stderr)
		}
		wantClean(t, stderr)
	}
}

// TestCompact: `fairshard compact DATA_DIR` shrinks a drained data file
// and leaves a store that passes check with the same rows; a locked dir
// (a running node) and a corrupt file exit 1 with a clear message and are
// left as they were; bad usage exits 2.
func TestCompact(t *testing.T) {
	dir := newStoreFile(t)
	path := filepath.Join(dir, node.DataFileName)
	// Drain it: cancel all but one row and let their tombstones expire.
	now := time.Now()
	s, err := boltstore.Open(path, boltstore.Options{ShardCount: 1024, TombstoneRetention: time.Nanosecond,
		DeadLetterRetention: time.Nanosecond, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i < 200; i++ {
		if _, err := s.Cancel(context.Background(), outbox.CancelParams{DispatchKey: fmt.Sprintf("k-%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	now = now.Add(time.Second)
	if n, err := s.ExpireTombstones(context.Background()); err != nil || n != 199 {
		t.Fatalf("expired %d: %v", n, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}

	// Locked by a running node: refused, unchanged.
	s, err = boltstore.Open(path, boltstore.Options{ShardCount: 1024})
	if err != nil {
		t.Fatal(err)
	}
	held, _ := os.ReadFile(path)
	code, _, stderr := runCmd(t, nil, "compact", dir)
	now2, _ := os.ReadFile(path)
	_ = s.Close()
	if code != 1 || !strings.Contains(stderr, "in use by another process (stop the node first)") {
		t.Errorf("compact of a locked dir: exit %d, stderr %q", code, stderr)
	}
	if !bytes.Equal(held, now2) {
		t.Error("compact changed a locked file")
	}
	wantClean(t, stderr)

	code, stdout, stderr := runCmd(t, nil, "compact", dir)
	if code != 0 || !strings.Contains(stdout, "compacted from") || !strings.Contains(stdout, "(1 rows, verified)") {
		t.Fatalf("compact: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	after, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if after.Size() >= before.Size() {
		t.Errorf("compact left the file at %d bytes (was %d)", after.Size(), before.Size())
	}
	if code, stdout, stderr := runCmd(t, nil, "check", dir); code != 0 || !strings.Contains(stdout, "(1 rows in 1 shards") {
		t.Errorf("check after compact: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	if code, stdout, _ := runCmd(t, nil, "compact", "--keep-original", dir); code != 0 || !strings.Contains(stdout, ".orig") {
		t.Errorf("compact --keep-original: exit %d, stdout %q", code, stdout)
	}
	if _, err := os.Stat(path + ".orig"); err != nil {
		t.Errorf("--keep-original kept nothing: %v", err)
	}

	for _, args := range [][]string{{"compact"}, {"compact", "a", "b"}} {
		if code, _, _ := runCmd(t, nil, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
	code, _, stderr = runCmd(t, nil, "compact", filepath.Join(t.TempDir(), "missing"))
	if code != 1 || !strings.Contains(stderr, "no such file") {
		t.Errorf("compact of a missing dir: exit %d, stderr %q", code, stderr)
	}
	clobbered := newStoreFile(t)
	clobber(t, filepath.Join(clobbered, node.DataFileName), 4*4096)
	code, _, stderr = runCmd(t, nil, "compact", clobbered)
	if code != 1 || !strings.Contains(stderr, "corrupt") {
		t.Errorf("compact of a corrupt file: exit %d, stderr %q; want 1 saying corrupt", code, stderr)
	}
	wantClean(t, stderr)
	if _, err := os.Stat(filepath.Join(clobbered, node.DataFileName+boltstore.CompactSuffix)); !os.IsNotExist(err) {
		t.Errorf("a copy of the corrupt file was left: %v", err)
	}
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

func truncate(t *testing.T, path string, size int64) {
	t.Helper()
	if err := os.Truncate(path, size); err != nil {
		t.Fatal(err)
	}
}

// clobber overwrites everything after the first off bytes (the meta pages
// and the first pages stay) with a repeating pattern.
func clobber(t *testing.T, path string, off int64) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if st.Size() <= off {
		t.Fatalf("%s is only %d bytes", path, st.Size())
	}
	if _, err := f.WriteAt(bytes.Repeat([]byte{0xA5}, int(st.Size()-off)), off); err != nil {
		t.Fatal(err)
	}
}

func TestProbe(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer ok.Close()
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(503) }))
	defer bad.Close()
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()

	if code, _, stderr := runCmd(t, nil, "probe", ok.URL); code != 0 {
		t.Errorf("probe of a 200: exit %d, %s", code, stderr)
	}
	if code, _, stderr := runCmd(t, nil, "probe", bad.URL); code != 1 || !strings.Contains(stderr, "503") {
		t.Errorf("probe of a 503: exit %d, stderr %q", code, stderr)
	}
	if code, _, stderr := runCmd(t, nil, "probe", gone.URL); code != 1 || stderr == "" {
		t.Errorf("probe of a closed server: exit %d, stderr %q", code, stderr)
	}
	for _, args := range [][]string{{"probe"}, {"probe", "a", "b"}} {
		if code, _, _ := runCmd(t, nil, args...); code != 2 {
			t.Errorf("%v: exit %d, want 2", args, code)
		}
	}
}

func TestParseNamespaces(t *testing.T) {
	got, err := loadgen.ParseNamespaces("a:2:3, b ,c.d:1", node.ValidName)
	if err != nil || fmt.Sprint(got) != "[{a 2 3 0} {b 1 1 0} {c.d 1 1 0}]" {
		t.Errorf("parseNamespaces = %v, %v", got, err)
	}
	for _, bad := range []string{"bad name:1", "a:0", "a:x", "a:1:0", "a:1:2:3"} {
		if _, err := loadgen.ParseNamespaces(bad, node.ValidName); err == nil {
			t.Errorf("parseNamespaces(%q) accepted", bad)
		}
	}
	if code, _, stderr := runCmd(t, nil, "load", "--namespaces", "a:0"); code != 2 || !strings.Contains(stderr, "--namespaces") {
		t.Errorf("load with a bad --namespaces: exit %d, stderr %q", code, stderr)
	}
}

// startServe runs `fairshard <args>` in-process with environ and waits until
// base answers /readyz (fairshard probe); what names the command in
// failures. It returns the exit code's channel and the command's stderr.
func startServe(t *testing.T, what string, args, environ []string, base string) (chan int, *testnode.LogBuffer) {
	t.Helper()
	stderr := &testnode.LogBuffer{}
	done := make(chan int, 1)
	go func() { done <- run(args, environ, io.Discard, stderr) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if code, _, _ := runCmd(t, nil, "probe", base+"/readyz"); code == 0 {
			return done, stderr
		}
		select {
		case code := <-done:
			t.Fatalf("%s exited %d before it was ready:\n%s", what, code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready after 10 s:\n%s", what, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stopServe sends this process SIGTERM, which serve's
// signal.NotifyContext turns into a stop of the node instead of the test
// binary's end, and expects serve to exit 0 within 15 s.
func stopServe(t *testing.T, done chan int, stderr *testnode.LogBuffer) {
	t.Helper()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("serve exited %d after SIGTERM, want 0:\n%s", code, stderr.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("serve did not stop within 15 s of SIGTERM:\n%s", stderr.String())
	}
}

// freeAddr returns a free host:port on a fresh loopback IP.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(clustertest.TakeIP(), "0"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestServeStartsAndStopsOnSIGTERM runs `fairshard serve` in-process from
// flags and FAIRSHARD_* variables: it reports the unknown variable, serves,
// is ready, and on SIGTERM drains and exits 0 (then `check` passes on its
// data dir).
func TestServeStartsAndStopsOnSIGTERM(t *testing.T) {
	httpAddr := freeAddr(t)
	gossipIP, _, _ := net.SplitHostPort(freeAddr(t))
	dir := t.TempDir()
	environ := []string{"FAIRSHARD_NODE_NAME=env-node", "FAIRSHARD_DATA_DIR=" + dir, "FAIRSHARD_BOGUS=1"}
	args := []string{"serve", "--http-addr", httpAddr, "--gossip-addr", gossipIP + ":0", "--gossip-profile", testnode.GossipProfile,
		"--shutdown-grace", "5s", "--log-format", "json"}
	base := "http://" + httpAddr
	done, stderr := startServe(t, "serve", args, environ, base)
	resp, err := http.Get(base + "/v1/cluster")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Node string `json:"node"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	if c.Node != "env-node" {
		t.Errorf("node name %q, want env-node from FAIRSHARD_NODE_NAME", c.Node)
	}
	if !strings.Contains(stderr.String(), "FAIRSHARD_BOGUS") {
		t.Errorf("the unknown variable FAIRSHARD_BOGUS was not reported:\n%s", stderr.String())
	}

	stopServe(t, done, stderr)
	if !strings.Contains(stderr.String(), "draining") || !strings.Contains(stderr.String(), "stopped gracefully") {
		t.Errorf("no drain and graceful stop in the log:\n%s", stderr.String())
	}
	checkJSONLog(t, stderr.String())
	if !strings.Contains(stderr.String(), `"grace":"5s"`) {
		t.Errorf("the drain line does not log the grace as \"5s\":\n%s", stderr.String())
	}
	if code, _, errOut := runCmd(t, nil, "check", dir); code != 0 {
		t.Errorf("check of the stopped node's data dir: exit %d: %s", code, errOut)
	}
}

// runMainEnv makes the test binary run main's command line instead of
// the tests: a test starts it as a child process, so the child's process
// arguments are a real fairshard's.
const runMainEnv = "FAIRSHARD_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
	}
	// serve, check and probe run in-process: nothing they start may
	// outlive them.
	goleak.VerifyTestMain(m)
}

// tamperDigest flips a bit of one shard's digest in a stopped node's data
// file (the digests bucket of boltstore's layout), leaving its rows alone.
func tamperDigest(t *testing.T, dir string) {
	t.Helper()
	db, err := bolt.Open(filepath.Join(dir, node.DataFileName), 0o600, &bolt.Options{Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	err = db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket([]byte("digests"))
		if b == nil {
			return fmt.Errorf("no digests bucket")
		}
		k, v := b.Cursor().First()
		if k == nil {
			return fmt.Errorf("no digest")
		}
		nv := append([]byte(nil), v...)
		nv[len(nv)-1] ^= 1
		return b.Put(append([]byte(nil), k...), nv)
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestVersionOfBuiltBinary: a binary built from a git clone of this
// checkout prints the VCS revision the toolchain recorded (the clone's
// HEAD, over a link-time main.revision) with `version` and `--version`;
// built with -buildvcs=false it prints the link-time revision (make
// build, the Dockerfile). It builds in a fresh local clone because the
// toolchain records no VCS information in a git worktree.
func TestVersionOfBuiltBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("clones the checkout and builds the binary")
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		t.Skipf("not a git checkout (git rev-parse: %v): no revision to compare", err)
	}
	clone := filepath.Join(t.TempDir(), "src")
	if out, err := exec.Command("git", "clone", "-q", strings.TrimSpace(string(top)), clone).CombinedOutput(); err != nil {
		t.Fatalf("git clone: %v\n%s", err, out)
	}
	head, err := exec.Command("git", "-C", clone, "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "fairshard")
	build := exec.Command("go", "build", "-buildvcs=true", "-ldflags", "-X main.version=7.7.7 -X main.revision=linked", "-o", bin, "./cmd/node")
	build.Dir = clone
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	for _, arg := range []string{"version", "--version"} {
		out, err := exec.Command(bin, arg).Output()
		if err != nil {
			t.Fatalf("fairshard %s: %v", arg, err)
		}
		// The module version is the toolchain's: a pseudo-version of the
		// revision, or (devel).
		rev := ", revision " + strings.TrimSpace(string(head)) + " at "
		if !strings.HasPrefix(string(out), "fairshard 7.7.7 (module github.com/fairshard/fairshard ") || !strings.Contains(string(out), rev) {
			t.Errorf("fairshard %s = %q, want the release 7.7.7, the module and %q", arg, out, rev)
		}
	}
	unstamped := filepath.Join(t.TempDir(), "fairshard")
	build = exec.Command("go", "build", "-buildvcs=false", "-ldflags", "-X main.revision=feedface", "-o", unstamped, "./cmd/node")
	build.Dir = clone
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build -buildvcs=false: %v\n%s", err, out)
	}
	if out, err := exec.Command(unstamped, "version").Output(); err != nil || !strings.Contains(string(out), ", revision feedface, ") {
		t.Errorf("fairshard version of a -buildvcs=false build = %q (%v), want the link-time revision feedface", out, err)
	}
}

// TestInsecureOnPurpose: --insecure lets a node listen beyond loopback
// without secrets; it then warns (INSECURE, at start) and says so in
// /v1/cluster ("security") and fairshard_insecure. Without the flag the
// same command exits 2 (TestInvalidConfigExits2).
func TestInsecureOnPurpose(t *testing.T) {
	_, port, _ := net.SplitHostPort(freeAddr(t))
	gossipIP, _, _ := net.SplitHostPort(freeAddr(t))
	args := []string{"serve", "--http-addr", "0.0.0.0:" + port, "--advertise-http", "127.0.0.1:" + port,
		"--gossip-addr", gossipIP + ":0", "--gossip-profile", testnode.GossipProfile, "--insecure",
		"--shutdown-grace", "5s", "--data-dir", t.TempDir(), "--node-name", "insecure-node"}
	if code, _, stderr := runCmd(t, nil, slices.DeleteFunc(slices.Clone(args), func(a string) bool { return a == "--insecure" })...); code != 2 {
		t.Fatalf("without --insecure: exit %d, want 2: %s", code, stderr)
	}
	base := "http://127.0.0.1:" + port
	done, stderr := startServe(t, "serve --insecure", args, nil, base)
	resp, err := http.Get(base + "/v1/cluster")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Security struct {
			Insecure     bool     `json:"insecure"`
			InsecureFlag bool     `json:"insecure_flag"`
			NodeAuth     bool     `json:"node_auth"`
			Exposed      []string `json:"exposed"`
		} `json:"security"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&c)
	resp.Body.Close()
	if !c.Security.Insecure || !c.Security.InsecureFlag || c.Security.NodeAuth || len(c.Security.Exposed) == 0 {
		t.Errorf("/v1/cluster security %+v: want insecure, the flag, no node auth, the exposed address", c.Security)
	}
	resp, err = http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), "\nfairshard_insecure 1\n") {
		t.Error("fairshard_insecure is not 1 on an --insecure node")
	}
	if !strings.Contains(stderr.String(), "INSECURE") {
		t.Errorf("no INSECURE warning at start:\n%s", stderr.String())
	}
	stopServe(t, done, stderr)
}

// TestSecrets: `fairshard secrets --dir` generates a cluster secret, a
// gossip key and an API token once, keeps them on later runs, writes
// values the environment gives, prints the token alone with
// --print-api-token, and serve reads them through --cluster-secret-file,
// --gossip-key-file and --api-token-file (compose's init service).
func TestSecrets(t *testing.T) {
	dir := t.TempDir()
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	if code, out, errOut := runCmd(t, nil, "secrets", "--dir", dir); code != 0 || strings.Count(out, "generated") != 3 {
		t.Fatalf("first run: exit %d: %s %s", code, out, errOut)
	}
	sec, key, tok := read("cluster-secret"), read("gossip-key"), read("api-token")
	if code, out, _ := runCmd(t, nil, "secrets", "--dir", dir); code != 0 || strings.Count(out, "kept") != 3 ||
		read("cluster-secret") != sec || read("gossip-key") != key || read("api-token") != tok {
		t.Fatalf("second run did not keep the secrets: %s", out)
	}
	for name, v := range map[string]string{"cluster secret": sec, "API token": tok} {
		if strings.Contains(v, "\n\n") || len(strings.TrimSpace(v)) < 32 {
			t.Errorf("%s %q", name, v)
		}
	}
	if strings.TrimSpace(sec) == strings.TrimSpace(tok) {
		t.Error("the API token is the cluster secret")
	}
	for _, f := range []string{"cluster-secret", "gossip-key", "api-token"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v %v, want 0600", f, st.Mode().Perm(), err)
		}
	}
	// What the compose guide runs to learn the token: it alone on stdout.
	if code, out, errOut := runCmd(t, nil, "secrets", "--dir", dir, "--print-api-token"); code != 0 || out != tok {
		t.Errorf("--print-api-token: exit %d, stdout %q (stderr %q); want the kept token %q alone", code, out, errOut, tok)
	}
	if code, _, _ := runCmd(t, nil, "secrets", "--print-api-token"); code != 2 {
		t.Errorf("--print-api-token without --dir: exit %d, want 2", code)
	}
	cfg, _, err := parseServeFlags([]string{"--http-addr", "0.0.0.0:0", "--cluster-secret-file", filepath.Join(dir, "cluster-secret"),
		"--gossip-key-file", filepath.Join(dir, "gossip-key"), "--api-token-file", filepath.Join(dir, "api-token")}, nil, io.Discard)
	if err != nil || cfg.ClusterSecret != strings.TrimSpace(sec) || len(cfg.GossipKeys) != 1 || cfg.APIToken != strings.TrimSpace(tok) {
		t.Fatalf("serve with the generated files beyond loopback: %v (secret %d bytes, %d keys, token %d bytes)", err, len(cfg.ClusterSecret), len(cfg.GossipKeys), len(cfg.APIToken))
	}
	key2 := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{9}, 32))
	env := []string{"FAIRSHARD_CLUSTER_SECRET=from-env-secret-0123456789", "FAIRSHARD_GOSSIP_KEY=" + key2, "FAIRSHARD_API_TOKEN=from-env-token-0123"}
	if code, out, _ := runCmd(t, env, "secrets", "--dir", dir); code != 0 || strings.Count(out, "written from the environment") != 3 {
		t.Fatalf("run with env: exit %d: %s", code, out)
	}
	if strings.TrimSpace(read("cluster-secret")) != "from-env-secret-0123456789" || strings.TrimSpace(read("gossip-key")) != key2 ||
		strings.TrimSpace(read("api-token")) != "from-env-token-0123" {
		t.Error("the environment's values were not written")
	}
	if code, out, _ := runCmd(t, nil, "secrets"); code != 0 || !strings.Contains(out, "FAIRSHARD_CLUSTER_SECRET=") ||
		!strings.Contains(out, "FAIRSHARD_GOSSIP_KEY=") || !strings.Contains(out, "FAIRSHARD_API_TOKEN=") {
		t.Errorf("secrets without --dir: exit %d: %s", code, out)
	}
}
