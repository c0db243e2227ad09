package node_test

import (
	"encoding/base64"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/node"
)

// TestValidateReportsEveryErrorInFlagOrder pins Validate's messages and the
// order it reports them in: operators read the first lines first.
func TestValidateReportsEveryErrorInFlagOrder(t *testing.T) {
	dir := t.TempDir()
	missing := filepath.Join(dir, "missing")
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte(" \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c := node.DefaultConfig()
	c.NodeName, c.DataDir = "", ""
	c.HTTPAddr, c.GossipAddr = "nohost", "nogossip"
	c.AdvertiseGossip, c.AdvertiseHTTP = "name:7946", "noport"
	c.Join, c.JoinWait = []string{"seed"}, 0
	c.Shards = 0
	c.DefaultTarget = "ftp://x/{namespace}"
	c.GossipKeyFile = missing
	c.GossipProfile = "wan"
	c.Dispatch.PollInterval, c.Dispatch.BatchSize, c.Dispatch.DeliveryTimeout = -time.Millisecond, -1, time.Second
	c.Dispatch.VisibilityTimeout = time.Second
	c.Dispatch.Retry.Base, c.Dispatch.Retry.Cap, c.Dispatch.Retry.Factor = 2*time.Second, time.Second, 0.5
	c.Dispatch.MaxConnsPerHost = -1
	c.ReplicationFactor, c.Replication.WriteCopies = 0, -1
	c.Replication.PollInterval, c.Replication.LeftoverInterval = -time.Second, -time.Second
	c.Replication.Limits.MaxRows, c.Replication.Limits.MaxBytes = -1, 64<<20
	c.ShutdownGrace, c.TombstoneRetention = 0, 0
	c.DefaultQuotaMode = "loose"
	c.Lease.LeaseLength, c.Lease.Refresh = time.Millisecond, time.Hour
	c.MaxNamespaces, c.MaxTargets, c.MaxHolds = 0, -1, 1<<30
	c.LogLevel, c.LogFormat = "loud", "xml"
	c.APITokenFile = empty
	c.PprofAddr = "nohostport"
	c.ClusterSecretFile = missing
	c.APIToken, c.ClusterSecret = "", "short"
	c.AllowOrigins = []string{"https://ok.example/", "admin.example"}
	c.AllowHosts = []string{"ok.example.", "http://x"}
	c.TargetAllow = []string{"::bad::"}
	c.HTTPReadTimeout, c.HTTPIdleTimeout, c.PeerCheckInterval = 0, 0, 0
	c.MetricsNamespaces = -1
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate accepted a config with every field wrong")
	}
	got := strings.ReplaceAll(err.Error(), dir, "DIR")
	if got != wantAllWrong {
		t.Errorf("Validate reported:\n%s\nwant:\n%s", got, wantAllWrong)
	}
}

// TestValidateFillsDefaultsAndResolvesFiles pins what Validate writes back:
// defaults derived from other fields, secrets read from their files and
// normalised allow lists; and the conflicts between a file and its flag.
func TestValidateFillsDefaultsAndResolvesFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key := make([]byte, 32)
	key[0] = 1
	keyFile := write("keys", "# gossip\n"+base64.StdEncoding.EncodeToString(key)+"\n")
	secret := strings.Repeat("s", 32)

	c := node.DefaultConfig()
	c.DataDir = dir
	c.HTTPAddr, c.GossipAddr = "127.0.0.1:0", "127.0.0.1:0"
	c.GossipKeyFile = keyFile
	c.APITokenFile = write("token", " tok \n")
	c.ClusterSecretFile = write("secret", secret+"\n")
	c.Dispatch.VisibilityTimeout, c.Dispatch.DeliveryTimeout = 0, 5*time.Second
	c.DefaultQuotaMode, c.Lease.LeaseLength, c.Lease.Refresh = "", 0, 0
	c.AllowOrigins = []string{"HTTPS://Admin.Example/"}
	c.AllowHosts = []string{"[::1]", "Api.Example."}
	c.PprofAddr = "127.0.0.1:6060"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if len(c.GossipKeys) != 1 || c.GossipKeys[0][0] != 1 {
		t.Errorf("GossipKeys = %v, want the file's key", c.GossipKeys)
	}
	if c.APIToken != "tok" || c.ClusterSecret != secret {
		t.Errorf("APIToken, ClusterSecret = %q, %q, want the files' contents", c.APIToken, c.ClusterSecret)
	}
	if c.Dispatch.VisibilityTimeout != 35*time.Second {
		t.Errorf("VisibilityTimeout = %v, want delivery timeout + 30s", c.Dispatch.VisibilityTimeout)
	}
	if c.DefaultQuotaMode != "exact" || c.Lease.LeaseLength <= 0 || c.Lease.Refresh <= 0 || c.Lease.Refresh > c.Lease.LeaseLength {
		t.Errorf("quota mode %q, lease %v refresh %v: want exact and the lease defaults", c.DefaultQuotaMode, c.Lease.LeaseLength, c.Lease.Refresh)
	}
	if strings.Join(c.AllowOrigins, ",") != "https://admin.example" || strings.Join(c.AllowHosts, ",") != "::1,api.example" {
		t.Errorf("AllowOrigins %q, AllowHosts %q: want them normalised", c.AllowOrigins, c.AllowHosts)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("a second Validate rejected what the first resolved: %v", err)
	}

	c.GossipKeys = [][]byte{make([]byte, 32)}
	c.APIToken, c.ClusterSecret = "other", strings.Repeat("o", 32)
	c.PprofAddr = "0.0.0.0:6060"
	c.Join = []string{"127.0.0.1:1"}
	err := c.Validate()
	if err == nil {
		t.Fatal("Validate accepted files that disagree with their flags")
	}
	if got := strings.ReplaceAll(err.Error(), dir, "DIR"); got != wantConflicts {
		t.Errorf("Validate reported:\n%s\nwant:\n%s", got, wantConflicts)
	}

	c = node.DefaultConfig()
	c.DataDir = dir
	c.HTTPAddr, c.GossipAddr = "0.0.0.0:8080", "127.0.0.1:0"
	c.APIToken = "tok"
	c.ClusterSecret = "tok" + strings.Repeat("x", 29)
	c.PprofAddr = "127.0.0.1:6060"
	err = c.Validate()
	if !errors.Is(err, node.ErrInsecure) {
		t.Fatalf("Validate of an exposed node without gossip keys = %v, want ErrInsecure", err)
	}
	if got := err.Error(); got != wantExposed {
		t.Errorf("Validate reported:\n%s\nwant:\n%s", got, wantExposed)
	}
	c.Insecure = true
	if err := c.Validate(); err != nil {
		t.Errorf("--insecure still refused: %v", err)
	}
	c.Insecure, c.ClusterSecret = false, "tok"
	c.APIToken = "tok"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--cluster-secret: must differ from --api-token") {
		t.Errorf("a cluster secret equal to the API token: %v", err)
	}

	for _, tc := range []struct {
		name string
		set  func(*node.Config)
		want string
	}{
		{"pprof without a token", func(c *node.Config) { c.PprofAddr = "127.0.0.1:6060" },
			"--pprof-addr: needs --api-token (or --api-token-file): profiles are served only behind it"},
		{"token and join without a secret", func(c *node.Config) { c.APIToken, c.Join = "tok", []string{"127.0.0.1:1"} },
			"--cluster-secret: is required with --api-token and --join"},
		{"negative delivery timeout", func(c *node.Config) { c.Dispatch.DeliveryTimeout = -time.Second },
			"--delivery-timeout: must be positive"},
	} {
		c := node.DefaultConfig()
		c.DataDir = dir
		c.HTTPAddr, c.GossipAddr = "127.0.0.1:0", "127.0.0.1:0"
		tc.set(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Validate = %v, want %q", tc.name, err, tc.want)
		}
	}
}

const wantAllWrong = "--node-name: is empty (and the hostname is unknown)\n--data-dir: is empty\n--http-addr: \"nohost\" is not host:port: address nohost: missing port in address\n--advertise-http: \"noport\" is not host:port\n--shards: must be at least 1\n--gossip-addr: \"nogossip\" is not host:port: address nogossip: missing port in address\n--advertise-gossip: \"name:7946\" must be ip:port with an IP literal\n--join: \"seed\" is not host:port\n--join-wait: must be positive\n--gossip-key-file: read gossip keys: open DIR/missing: no such file or directory\n--gossip-profile: \"wan\" is not lan, fast or shared-host\n--default-target: \"ftp://x/{namespace}\" is not an http(s) URL\n--poll-interval: must be positive, got -1ms\n--batch-size: must be at least 1 row, got -1\n--visibility-timeout: 1s must exceed --delivery-timeout 1s, or live deliveries get re-armed\n--retry-factor: must be at least 1, got 0.5\n--retry-cap: 1s must be at least --retry-base 2s\n--max-conns-per-host: must be at least 1, got -1\n--replication-factor: 0 is not between 1 and 5\n--write-copies: -1 is not between 0 (automatic) and 5\n--repair-interval: must be positive, got -1s\n--handoff-interval: must be positive, got -1s\n--handoff-batch: must be at least 1, got -1\n--handoff-batch-bytes: 67108864 is not between 1 and 33554432\n--shutdown-grace: must be positive\n--tombstone-retention: must be positive\n--default-quota-mode: \"loose\" is not exact or proportional\n--lease-length: 1ms is not between 10ms and 10m0s\n--lease-refresh: 1h0m0s is not between 1ms and --lease-length 1ms\n--max-namespaces: 0 is not between 1 and 25000 (the gossiped config's entry cap)\n--max-targets: -1 is not between 1 and 25000 (the gossiped config's entry cap)\n--max-holds: 1073741824 is not between 1 and 25000 (the gossiped config's entry cap)\n--log-level: \"loud\" is not debug, info, warn or error\n--log-format: \"xml\" is not text or json\n--api-token-file: DIR/empty is empty\n--pprof-addr: \"nohostport\" is not host:port: address nohostport: missing port in address\n--cluster-secret-file: open DIR/missing: no such file or directory\n--cluster-secret: is 5 bytes, at least 16 are required (e.g. openssl rand -hex 32)\n--allow-origin: \"admin.example\" is not an origin (scheme://host[:port], e.g. https://admin.example)\n--allow-host: \"http://x\" is not a host name or an IP (no port, no scheme)\n--target-allow: \"::bad::\" is not a CIDR, an IP or a host name\n--http-read-timeout: must be positive\n--http-idle-timeout: must be positive\n--peer-check-interval: must be positive\n--metrics-namespaces: -1 is not between 0 and 10000\nrefusing to start without secrets: --advertise-gossip name:7946 listens beyond loopback, so it needs --gossip-key (or --gossip-key-file); generate them with `fairshard secrets`, or pass --insecure to run unauthenticated on purpose (docs/operations.md \"Security\")"

const wantConflicts = `--gossip-key-file: and --gossip-key are both set: keep the keys in one place
--api-token-file: and --api-token are both set: keep the token in one place
--pprof-addr: "0.0.0.0:6060" listens beyond loopback: bind 127.0.0.1, or pass --pprof-insecure to expose profiles on purpose
--cluster-secret-file: and --cluster-secret are both set: keep the secret in one place`

const wantExposed = "refusing to start without secrets: --http-addr 0.0.0.0:8080 listens beyond loopback, so it needs --gossip-key (or --gossip-key-file); generate them with `fairshard secrets`, or pass --insecure to run unauthenticated on purpose (docs/operations.md \"Security\")"
