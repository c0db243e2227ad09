package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"pgregory.net/rapid"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/kv"
)

// Internal tests: codecs, validation, admission and metrics. The config
// store's own laws are tested in package kv.
// The multi-node behaviour is tested in cluster_test.go with clustertest.

var internalIP atomic.Uint32

// testNode builds a FastConfig node on its own loopback address; edit may
// change the config. It is shut down at cleanup.
func testNode(t *testing.T, name string, edit func(*Config)) (*Cluster, *prometheus.Registry) {
	t.Helper()
	cfg := FastConfig()
	cfg.Name = name
	cfg.BindAddr = fmt.Sprintf("127.0.250.%d", 1+internalIP.Add(1)%250)
	cfg.APIAddr = cfg.BindAddr + ":8080"
	reg := prometheus.NewPedanticRegistry()
	cfg.Registerer = reg
	if edit != nil {
		edit(cfg)
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New(%s): %v", name, err)
	}
	t.Cleanup(func() { _ = c.Shutdown() })
	return c, reg
}

func TestConfigValidation(t *testing.T) {
	tests := []struct {
		name  string
		edit  func(*Config)
		field string // must appear in the error
	}{
		{"no memberlist config", func(c *Config) { c.Config = nil }, "Config"},
		{"empty name", func(c *Config) { c.Name = "" }, "Name"},
		{"long name", func(c *Config) { c.Name = strings.Repeat("n", MaxNodeNameBytes+1) }, "Name"},
		{"shard count too large", func(c *Config) { c.ShardCount = MaxShardCount + 1 }, "ShardCount"},
		{"bind address is a name", func(c *Config) { c.BindAddr = "localhost" }, "BindAddr"},
		{"bind port out of range", func(c *Config) { c.BindPort = 70000 }, "BindPort"},
		{"advertise address is a name", func(c *Config) { c.AdvertiseAddr = "node.example" }, "AdvertiseAddr"},
		{"advertise port negative", func(c *Config) { c.AdvertisePort = -1 }, "AdvertisePort"},
		{"secret key of 10 bytes", func(c *Config) { c.SecretKey = make([]byte, 10) }, "SecretKey"},
		{"gossip key of 20 bytes", func(c *Config) { c.GossipKeys = [][]byte{make([]byte, 16), make([]byte, 20)} }, "GossipKeys: key 2 is 20 bytes"},
		{"gossip key twice", func(c *Config) { c.GossipKeys = [][]byte{make([]byte, 16), make([]byte, 16)} }, "GossipKeys: keys 1 and 2"},
		{"too many gossip keys", func(c *Config) {
			for i := range MaxGossipKeys + 1 {
				c.GossipKeys = append(c.GossipKeys, bytes.Repeat([]byte{byte(i)}, 16))
			}
		}, "GossipKeys"},
		{"secret key and gossip keys", func(c *Config) { c.SecretKey, c.GossipKeys = make([]byte, 16), [][]byte{make([]byte, 32)} }, "SecretKey and GossipKeys"},
		{"own keyring", func(c *Config) { c.Keyring = &memberlist.Keyring{} }, "Keyring"},
		{"api address without port", func(c *Config) { c.APIAddr = "node-1" }, "APIAddr"},
		{"api address with port 0", func(c *Config) { c.APIAddr = "node-1:0" }, "APIAddr"},
		{"api address too long", func(c *Config) { c.APIAddr = strings.Repeat("a", MaxAPIAddrBytes) + ":1" }, "APIAddr"},
		{"join address without port", func(c *Config) { c.Join = []string{"10.0.0.1:7946", "seed"} }, "Join[1]"},
		{"negative rejoin interval", func(c *Config) { c.RejoinInterval = -time.Second }, "RejoinInterval"},
		{"negative leave delay", func(c *Config) { c.LeavePropagateDelay = -time.Second }, "LeavePropagateDelay"},
		{"own delegate", func(c *Config) { c.Delegate = &delegate{} }, "Delegate"},
		{"own events", func(c *Config) { c.Events = &events{} }, "Events"},
		{"own alive delegate", func(c *Config) { c.Alive = &delegate{} }, "Alive"},
		{"own merge delegate", func(c *Config) { c.Merge = &delegate{} }, "Merge"},
		{"own conflict delegate", func(c *Config) { c.Conflict = &delegate{} }, "Conflict"},
		{"initial entry without key", func(c *Config) {
			c.KV.Initial = []kv.Entry{{Value: []byte("x"), Version: kv.Version{Clock: 1, Node: "n"}}}
		}, "KV: kv: invalid config: Initial[0]"},
		{"initial entry without version", func(c *Config) { c.KV.Initial = []kv.Entry{{Key: "k"}} }, "Initial[0]"},
		{"initial entry value too big", func(c *Config) {
			c.KV.Initial = []kv.Entry{{Key: "k", Value: make([]byte, kv.MaxValueBytes+1), Version: kv.Version{Clock: 1, Node: "n"}}}
		}, "Initial[0]"},
		{"tombstone TTL below its minimum age", func(c *Config) { c.KV.TombstoneTTL = time.Second }, "TombstoneTTL"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := FastConfig()
			cfg.Name = "node-1"
			tc.edit(cfg)
			c, err := New(cfg)
			if err == nil {
				_ = c.Shutdown()
				t.Fatal("New accepted the config")
			}
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
				t.Fatalf("err = %v, want ErrInvalidConfig naming %s", err, tc.field)
			}
		})
	}
	if _, err := New(nil); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("New(nil) = %v", err)
	}
}

func TestNewDoesNotModifyTheConfig(t *testing.T) {
	cfg := FastConfig()
	cfg.Name = "node-1"
	cfg.BindAddr = "127.0.250.254"
	cfg.SecretKey = bytes.Repeat([]byte{7}, 16)
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Shutdown()
	if cfg.BindPort != 0 || cfg.Delegate != nil || cfg.Keyring != nil || cfg.Logger != nil || cfg.ShardCount != DefaultShardCount {
		t.Fatalf("New modified its config: port %d delegate %v keyring %v", cfg.BindPort, cfg.Delegate, cfg.Keyring)
	}
	if !strings.HasPrefix(c.GossipAddr(), "127.0.250.254:") || strings.HasSuffix(c.GossipAddr(), ":0") {
		t.Fatalf("GossipAddr = %q", c.GossipAddr())
	}
}

func TestMetaCodec(t *testing.T) {
	t.Run("round trip", rapid.MakeCheck(func(t *rapid.T) {
		m := nodeMeta{
			Protocol:   rapid.Uint8().Draw(t, "protocol"),
			ShardCount: rapid.Uint32Range(0, MaxShardCount).Draw(t, "shards"),
			State:      rapid.SampledFrom([]MemberState{MemberActive, MemberLeaving}).Draw(t, "state"),
			Name:       rapid.StringN(0, 40, MaxNodeNameBytes).Draw(t, "name"),
			APIAddr:    rapid.StringN(0, 60, MaxAPIAddrBytes).Draw(t, "api"),
		}
		for range rapid.IntRange(0, MaxGossipKeys).Draw(t, "keys") {
			m.GossipKeys = append(m.GossipKeys, KeyFingerprint(rapid.SliceOfN(rapid.Byte(), 16, 16).Draw(t, "key")))
		}
		b, err := m.encodeChecked()
		if err != nil {
			t.Fatal(err)
		}
		// A later format may append fields: trailing bytes are ignored.
		b = append(b, rapid.SliceOfN(rapid.Byte(), 0, 8).Draw(t, "trailer")...)
		got, err := decodeMeta(b)
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("decode(encode(%+v)) = %+v, %v", m, got, err)
		}
	}))
	t.Run("garbage never panics", rapid.MakeCheck(func(t *rapid.T) {
		_, _ = decodeMeta(rapid.SliceOfN(rapid.Byte(), 0, 600).Draw(t, "bytes"))
	}))
	t.Run("bad inputs are errors", func(t *testing.T) {
		good := nodeMeta{Protocol: 1, ShardCount: 8, Name: "n", APIAddr: "a:1"}.encode()
		for name, b := range map[string][]byte{
			"empty":         nil,
			"other format":  append([]byte{9}, good[1:]...),
			"truncated":     good[:len(good)-2],
			"bad state":     {metaFormat, 1, 8, 7, 1, 'n', 0},
			"bad utf-8":     {metaFormat, 1, 8, 0, 1, 0xff, 0},
			"cut key":       append(slices.Clone(good[:len(good)-1]), 1, 0xab, 0xcd), // good ends with its key count, 0
			"too many keys": append(slices.Clone(good[:len(good)-1]), MaxGossipKeys+1, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4),
		} {
			if _, err := decodeMeta(b); err == nil {
				t.Errorf("%s: decoded without error", name)
			}
		}
	})
	t.Run("oversized meta is refused, not a memberlist panic", func(t *testing.T) {
		_, err := nodeMeta{Name: strings.Repeat("n", 300), APIAddr: strings.Repeat("a", 300)}.encodeChecked()
		if !errors.Is(err, ErrInvalidConfig) {
			t.Fatalf("err = %v", err)
		}
	})
}

// recordHandler counts slog records by message.
type recordHandler struct {
	mu   sync.Mutex
	msgs map[string]int
	recs []slog.Record
}

func (h *recordHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *recordHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.msgs == nil {
		h.msgs = map[string]int{}
	}
	h.msgs[r.Message]++
	h.recs = append(h.recs, r)
	return nil
}
func (h *recordHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *recordHandler) WithGroup(string) slog.Handler      { return h }
func (h *recordHandler) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.msgs[msg]
}

func TestAdmission(t *testing.T) {
	logs := &recordHandler{}
	c, reg := testNode(t, "node-1", func(cfg *Config) { cfg.Logger = slog.New(logs) })
	d := &delegate{c: c}
	meta := func(m nodeMeta) []byte { return m.encode() }
	ok := nodeMeta{Protocol: ProtocolVersion, ShardCount: DefaultShardCount, Name: "peer", APIAddr: "p:1"}
	tests := []struct {
		name   string
		node   memberlist.Node
		want   error
		reason string
	}{
		{"compatible", memberlist.Node{Name: "peer", Meta: meta(ok)}, nil, ""},
		{"no meta", memberlist.Node{Name: "peer"}, ErrBadMeta, "bad_meta"},
		{"name differs from meta", memberlist.Node{Name: "other", Meta: meta(ok)}, ErrBadMeta, "bad_meta"},
		{"other protocol", memberlist.Node{Name: "peer", Meta: meta(nodeMeta{Protocol: 9, ShardCount: DefaultShardCount, Name: "peer"})}, ErrProtocolMismatch, "protocol_version"},
		{"other shard count", memberlist.Node{Name: "peer", Meta: meta(nodeMeta{Protocol: ProtocolVersion, ShardCount: 64, Name: "peer"})}, ErrShardCountMismatch, "shard_count"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			before := testutil.ToFloat64(c.metrics.refused.WithLabelValues(tc.reason))
			err := d.NotifyAlive(&tc.node)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("NotifyAlive = %v", err)
				}
				return
			}
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.node.Name) {
				t.Fatalf("NotifyAlive = %v, want %v naming the node", err, tc.want)
			}
			if merr := d.NotifyMerge([]*memberlist.Node{{Name: "node-x", State: memberlist.StateAlive, Meta: meta(nodeMeta{Protocol: ProtocolVersion, ShardCount: DefaultShardCount, Name: "node-x"})}, {Name: tc.node.Name, State: memberlist.StateAlive, Meta: tc.node.Meta}}); !errors.Is(merr, tc.want) {
				t.Fatalf("NotifyMerge = %v, want %v", merr, tc.want)
			}
			if got := testutil.ToFloat64(c.metrics.refused.WithLabelValues(tc.reason)); got != before+2 {
				t.Fatalf("refused{reason=%s} = %v, want %v", tc.reason, got, before+2)
			}
		})
	}
	// Dead peers in a merge are not judged: their meta may be stale.
	if err := d.NotifyMerge([]*memberlist.Node{{Name: "old", State: memberlist.StateDead}}); err != nil {
		t.Fatalf("NotifyMerge with a dead peer = %v", err)
	}
	// A peer refused again and again is logged once per minute.
	for range 5 {
		_ = d.NotifyAlive(&memberlist.Node{Name: "noisy"})
	}
	if n := logs.count("refusing peer"); n != 4+1 { // one per distinct (peer, reason) above, noisy once
		t.Fatalf("refusal log lines = %d, want 5 (rate-limited per peer and reason)", n)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
}

func TestProtocolVersionMismatchIsRefusedOverTheWire(t *testing.T) {
	a, _ := testNode(t, "node-a", nil)
	b, regB := testNode(t, "node-b", func(cfg *Config) { cfg.protocolVersion = ProtocolVersion + 1 })
	_, err := b.Join(context.Background(), a.GossipAddr())
	if !errors.Is(err, ErrProtocolMismatch) {
		t.Fatalf("Join across protocol versions: %v, want ErrProtocolMismatch", err)
	}
	if got := testutil.ToFloat64(b.metrics.refused.WithLabelValues("protocol_version")); got < 1 {
		t.Fatalf("refusing side counted %v refusals", got)
	}
	// The joined side refuses on its own goroutine, which may finish just
	// after b's Join has returned.
	poll.Eventually(t, 5*time.Second, "joined side counts the refusal", func() (bool, string) {
		return testutil.ToFloat64(a.metrics.refused.WithLabelValues("protocol_version")) >= 1, ""
	})
	for _, c := range []*Cluster{a, b} {
		if s := c.Recompute(); len(s.Members) != 1 || s.Version != 1 {
			t.Fatalf("%s: %d members, version %d; want alone and unchanged", c.Name(), len(s.Members), s.Version)
		}
	}
	_ = regB
}

// TestRemoteConfigPersistFailureIsRetried: a gossiped entry whose
// persistence fails on the receiver is retried until it is durable, over
// real gossip between two nodes.
func TestRemoteConfigPersistFailureIsRetried(t *testing.T) {
	p := &flakyPersister{entries: map[string]kv.Entry{}}
	p.fail.Store(true)
	a, _ := testNode(t, "node-a", nil)
	b, _ := testNode(t, "node-b", func(cfg *Config) { cfg.KV.Persister = p })
	if _, err := b.Join(context.Background(), a.GossipAddr()); err != nil {
		t.Fatal(err)
	}
	e, err := a.KV().Put(context.Background(), "ns/acme/paused", []byte("true"))
	if err != nil {
		t.Fatal(err)
	}
	poll.Eventually(t, 5*time.Second, "entry not gossiped to node-b", func() (bool, string) { got, ok := b.KV().Get(e.Key); return ok && got.Version == e.Version, "" })
	poll.Eventually(t, 5*time.Second, "failed persist not retried", func() (bool, string) { return p.failures.Load() >= 3, "" })
	p.fail.Store(false)
	poll.Eventually(t, 5*time.Second, "the entry was never persisted once the disk recovered", func() (bool, string) { got, ok := p.get(e.Key); return ok && got.Version == e.Version, "" })
}

type flakyPersister struct {
	fail     atomic.Bool
	failures atomic.Int64
	mu       sync.Mutex
	entries  map[string]kv.Entry
}

func (p *flakyPersister) Save(_ context.Context, e kv.Entry) error {
	if p.fail.Load() {
		p.failures.Add(1)
		return errors.New("disk full")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.entries[e.Key] = e
	return nil
}

func (p *flakyPersister) Forget(_ context.Context, key string) error {
	if p.fail.Load() {
		p.failures.Add(1)
		return errors.New("disk full")
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	delete(p.entries, key)
	return nil
}

func (p *flakyPersister) get(key string) (kv.Entry, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.entries[key]
	return e, ok
}

func TestMetrics(t *testing.T) {
	c, reg := testNode(t, "node-1", func(cfg *Config) {
		cfg.KV.Initial = []kv.Entry{{Key: "ns/gone", Deleted: true, Version: kv.Version{Clock: 2, Node: "node-0"}}}
	})
	ctx := context.Background()
	if _, err := c.KV().Put(ctx, "ns/a", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if _, err := c.KV().Put(ctx, "ns/b", []byte("1")); err != nil {
		t.Fatal(err)
	}
	if err := c.SetLeaving(ctx); err != nil {
		t.Fatal(err)
	}
	want := `
# HELP fairshard_cluster_config_entries Live (not deleted) entries of the gossiped cluster config.
# TYPE fairshard_cluster_config_entries gauge
fairshard_cluster_config_entries 2
# HELP fairshard_cluster_config_updates_total Accepted cluster config changes by source: local writes or remote (gossip, push/pull).
# TYPE fairshard_cluster_config_updates_total counter
fairshard_cluster_config_updates_total{source="local"} 2
fairshard_cluster_config_updates_total{source="remote"} 0
# HELP fairshard_cluster_accepted 1 once the cluster has accepted this node as a member (it may own shards); 0 while its peers have not confirmed it, e.g. while they still hold its name at another address.
# TYPE fairshard_cluster_accepted gauge
fairshard_cluster_accepted 1
# HELP fairshard_cluster_members Live cluster members as this node sees them, by declared state: active, leaving. Suspect members count as live until declared dead.
# TYPE fairshard_cluster_members gauge
fairshard_cluster_members{state="active"} 0
fairshard_cluster_members{state="leaving"} 1
# HELP fairshard_cluster_refused_members_total Alive or merge messages of peers refused for an incompatible shard count, protocol version or unreadable meta, and node names claimed from a second address (name_conflict).
# TYPE fairshard_cluster_refused_members_total counter
fairshard_cluster_refused_members_total{reason="bad_meta"} 0
fairshard_cluster_refused_members_total{reason="name_conflict"} 0
fairshard_cluster_refused_members_total{reason="protocol_version"} 0
fairshard_cluster_refused_members_total{reason="shard_count"} 0
# HELP fairshard_owned_shard_fraction Owned shards over the shard count, in [0, 1]; 0 while the node is leaving.
# TYPE fairshard_owned_shard_fraction gauge
fairshard_owned_shard_fraction 0
# HELP fairshard_owned_shards Shards this node owns in its current ownership snapshot.
# TYPE fairshard_owned_shards gauge
fairshard_owned_shards 0
# HELP fairshard_ownership_changes_total Ownership snapshots whose shard table differed from the previous one.
# TYPE fairshard_ownership_changes_total counter
fairshard_ownership_changes_total 1
# HELP fairshard_ownership_shards_moved_total Shards whose owner changed, summed over ownership changes.
# TYPE fairshard_ownership_shards_moved_total counter
fairshard_ownership_shards_moved_total 1024
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"fairshard_cluster_config_entries", "fairshard_cluster_config_updates_total", "fairshard_cluster_accepted", "fairshard_cluster_members",
		"fairshard_cluster_refused_members_total", "fairshard_owned_shard_fraction", "fairshard_owned_shards",
		"fairshard_ownership_changes_total", "fairshard_ownership_shards_moved_total"); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	if n, err := testutil.GatherAndCount(reg); err != nil || n < 14 {
		t.Fatalf("gathered %d series, %v", n, err)
	}

	// Shutdown unregisters, so a restarted node can reuse the registry.
	if err := c.Shutdown(); err != nil {
		t.Fatal(err)
	}
	if n, _ := testutil.GatherAndCount(reg); n != 0 {
		t.Fatalf("%d series left after Shutdown", n)
	}
	c2, _ := testNode(t, "node-1b", func(cfg *Config) { cfg.Registerer = reg })
	// A second live Cluster on the same registry is an error, not a panic,
	// and leaves nothing running.
	cfg := FastConfig()
	cfg.Name, cfg.BindAddr, cfg.Registerer = "node-1c", "127.0.250.253", reg
	if c3, err := New(cfg); err == nil {
		_ = c3.Shutdown()
		t.Fatal("two Clusters registered on one registry")
	}
	_ = c2
}

func TestLogBridge(t *testing.T) {
	logs := &recordHandler{}
	l := log.New(&logBridge{l: slog.New(logs)}, "", 0)
	l.Printf("[DEBUG] memberlist: Stream connection from=1.2.3.4")
	l.Printf("[WARN] memberlist: Refuting an alive message")
	l.Printf("[ERR] memberlist: Failed to send")
	l.Printf("no level")
	want := []struct {
		level slog.Level
		msg   string
	}{
		{slog.LevelDebug, "Stream connection from=1.2.3.4"},
		{slog.LevelWarn, "Refuting an alive message"},
		{slog.LevelError, "Failed to send"},
		{slog.LevelInfo, "no level"},
	}
	if len(logs.recs) != len(want) {
		t.Fatalf("%d records", len(logs.recs))
	}
	for i, w := range want {
		if r := logs.recs[i]; r.Level != w.level || r.Message != w.msg {
			t.Errorf("record %d = %v %q, want %v %q", i, r.Level, r.Message, w.level, w.msg)
		}
	}
}
