package node_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/node"
)

// TestNamespaceFieldsSetOnTwoNodesBothSurvive: PUT {"paused":true} on node
// A and {"max_in_flight":8} on node B, at once (so neither has seen the
// other's write), leaves both fields set on every node. With one settings
// document per namespace, each write carried the whole document as read
// locally and the later one undid the other's field.
func TestNamespaceFieldsSetOnTwoNodesBothSurvive(t *testing.T) {
	t.Parallel()
	nodes := startCluster(t, 2, nil)
	a, b := nodes[0], nodes[1]
	for round := range 5 {
		ns := fmt.Sprintf("acme-%d", round)
		var wg sync.WaitGroup
		wg.Go(func() { a.mustDo("PUT", "/v1/namespaces/"+ns, map[string]any{"paused": true}, http.StatusOK, nil) })
		wg.Go(func() { b.mustDo("PUT", "/v1/namespaces/"+ns, map[string]any{"max_in_flight": 8}, http.StatusOK, nil) })
		wg.Wait()
		for _, n := range nodes {
			var v nsView
			poll.Eventually(t, 5*time.Second, fmt.Sprintf("%s on %s to be paused with max_in_flight 8", ns, n.Name()), func() (bool, string) {
				v = n.namespace(ns)
				return v.Paused && v.MaxInFlight == 8 && !v.MaxInFlightDefault, fmt.Sprintf("last %+v", v)
			})
		}
	}
	// A later write of one field leaves the other alone, on every node.
	b.mustDo("PUT", "/v1/namespaces/acme-0", map[string]any{"paused": false}, http.StatusOK, nil)
	for _, n := range nodes {
		var v nsView
		poll.Eventually(t, 5*time.Second, "acme-0 on "+n.Name()+" to be unpaused with max_in_flight still 8", func() (bool, string) {
			v = n.namespace("acme-0")
			return !v.Paused && v.MaxInFlight == 8, fmt.Sprintf("last %+v", v)
		})
	}
}

// TestConfigCaps: holds, targets and namespaces past their documented cap
// are answered 409 limit_exceeded naming the cap, and change nothing;
// rewriting what exists, and deleting, stay possible.
func TestConfigCaps(t *testing.T) {
	t.Parallel()
	n := startNode(t, func(c *node.Config) { c.MaxHolds, c.MaxTargets, c.MaxNamespaces = 3, 2, 2 })
	for i := range 3 {
		n.mustDo("PUT", fmt.Sprintf("/v1/workflows/wf-%d/hold", i), nil, http.StatusOK, nil)
	}
	st, body := n.do("PUT", "/v1/workflows/wf-3/hold", nil)
	e := wantError(t, st, body, http.StatusConflict, api.CodeLimitExceeded, "hold")
	if !strings.Contains(e.Error.Message, "limit is 3") || !strings.Contains(e.Error.Message, "--max-holds") {
		t.Errorf("hold past the cap: %q does not name the limit and its flag", e.Error.Message)
	}
	n.mustDo("PUT", "/v1/workflows/wf-0/hold", nil, http.StatusOK, nil) // already held: not a new entry
	n.mustDo("DELETE", "/v1/workflows/wf-0/hold", nil, http.StatusOK, nil)
	n.mustDo("PUT", "/v1/workflows/wf-3/hold", nil, http.StatusOK, nil) // the release made room

	tg := newTarget(t)
	n.setTarget("a", "q", tg.URL())
	n.setTarget("b", "q", tg.URL())
	st, body = n.do("PUT", "/v1/namespaces/c/task-queues/q/target", map[string]any{"url": tg.URL()})
	wantError(t, st, body, http.StatusConflict, api.CodeLimitExceeded, "target")
	n.setTarget("a", "q", tg.URL()+"/again") // replacing one is fine

	// The refused target is not there: c/q rows wait for a target.
	n.appendRows(rowIn{"dispatch_key": "caps-1", "namespace": "c", "task_queue": "q"})
	var v nsView
	poll.Eventually(t, 5*time.Second, "route c/q to wait for a target", func() (bool, string) {
		v = n.namespace("c")
		return len(v.WaitingRoutes) == 1, fmt.Sprintf("last %+v", v)
	})

	n.mustDo("PUT", "/v1/namespaces/x", map[string]any{"paused": true}, http.StatusOK, nil)
	n.mustDo("PUT", "/v1/namespaces/y", map[string]any{"max_in_flight": 3}, http.StatusOK, nil)
	st, body = n.do("PUT", "/v1/namespaces/z", map[string]any{"max_in_flight": 3})
	wantError(t, st, body, http.StatusConflict, api.CodeLimitExceeded, "namespace")
	if v := n.namespace("z"); v.MaxInFlight != 1024 || !v.MaxInFlightDefault {
		t.Errorf("refused namespace z = %+v, want the defaults", v)
	}
	n.mustDo("PUT", "/v1/namespaces/x", map[string]any{"max_in_flight": 1}, http.StatusOK, nil)   // existing one
	n.mustDo("PUT", "/v1/namespaces/z", map[string]any{"max_in_flight": nil}, http.StatusOK, nil) // adds nothing

	bad := node.DefaultConfig()
	bad.NodeName, bad.MaxHolds = "x", 0
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "--max-holds") {
		t.Errorf("Validate with --max-holds 0 = %v", err)
	}
}

// TestLegacyNamespaceSettingsAreMigrated: a data dir written before
// per-field keys holds one "ns/{namespace}" document; the node splits it
// into field keys at start, so the pause and quota survive the upgrade.
func TestLegacyNamespaceSettingsAreMigrated(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	s, err := boltstore.Open(filepath.Join(cfg.DataDir, node.DataFileName), boltstore.Options{ShardCount: cfg.Shards, LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	doc, _ := json.Marshal(map[string]any{"max_in_flight": 7, "paused": true})
	legacy, _ := json.Marshal(map[string]any{"Key": "ns/acme", "Value": doc, "Deleted": false, "Version": map[string]any{"Clock": 5, "Node": "old"}})
	if err := s.SaveConfigEntry(context.Background(), "ns/acme", legacy); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	n := startConfig(t, cfg)
	if v := n.namespace("acme"); !v.Paused || v.MaxInFlight != 7 {
		t.Fatalf("migrated namespace = %+v, want paused with max_in_flight 7", v)
	}
	n.mustDo("PUT", "/v1/namespaces/acme", map[string]any{"max_in_flight": 9}, http.StatusOK, nil)
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = boltstore.Open(filepath.Join(cfg.DataDir, node.DataFileName), boltstore.Options{ShardCount: cfg.Shards, LockTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	saved, err := s.LoadConfigEntries(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := saved["ns/acme"]; ok {
		t.Error("the legacy document is still stored")
	}
	for key, want := range map[string]string{"ns/acme/paused": "true", "ns/acme/max_in_flight": "9"} {
		var e struct{ Value []byte }
		if err := json.Unmarshal(saved[key], &e); err != nil || string(e.Value) != want {
			t.Errorf("stored %s = %s (%v), want value %s", key, saved[key], err, want)
		}
	}
}

// TestOwnershipViewWhileJoining: while a node waits to join its seeds it
// owns nothing, and every view of its ownership says so (the claim scope,
// the planner's ceiling, the admin views). Before, the ceiling and GET
// /v1/namespaces read the live membership snapshot, in which the lone node
// owned every shard.
func TestOwnershipViewWhileJoining(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.Join = []string{"127.0.0.1:1"} // nobody answers
	cfg.JoinWait = 2 * time.Second
	cfg.DefaultMaxInFlight = 64
	cfg.DefaultQuotaMode = "proportional" // the seed's ceiling, from the applied view
	n, err := node.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	started := make(chan error, 1)
	go func() { started <- n.Start(context.Background()) }()
	get := func(path string, out any) int {
		resp, err := http.Get("http://" + n.APIAddr() + path)
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		_ = json.NewDecoder(resp.Body).Decode(out)
		return resp.StatusCode
	}
	var v nsView
	poll.Eventually(t, 2*time.Second, "the API to answer while the node joins", func() (bool, string) { return get("/v1/namespaces/acme", &v) == http.StatusOK, "" })
	if want := 1.0 / 1024; math.Abs(v.OwnedShardFraction-want) > 1e-9 || v.Ceiling != 1 {
		t.Fatalf("while joining: %+v, want fraction 1/1024 (owning nothing, clamped) and ceiling ceil(64/1024) = 1", v)
	}
	if err := <-started; err != nil {
		t.Fatalf("Start = %v, want serving alone once no seed answered", err)
	}
	get("/v1/namespaces/acme", &v)
	if v.OwnedShardFraction != 1 || v.Ceiling != 64 {
		t.Fatalf("serving alone: %+v, want fraction 1 and ceiling 64", v)
	}
}

// TestStartFailsWhenTheStateExchangeFails: a node that reaches its seed but
// cannot complete a push/pull with it (here: another gossip key) must not
// serve as if alone; today's cold-start rule ("no seed answered: serve
// alone") does not apply. Start fails and says why.
func TestStartFailsWhenTheStateExchangeFails(t *testing.T) {
	t.Parallel()
	a := startNode(t, nil)
	cfg := testConfig(t)
	cfg.Join = []string{a.GossipAddr()}
	cfg.JoinWait = time.Second
	cfg.GossipKeys = [][]byte{bytes.Repeat([]byte{7}, 32)}
	n, err := node.New(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	err = n.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "could not exchange state") {
		t.Fatalf("Start = %v, want a failed state exchange", err)
	}
	if n.Ready() {
		t.Fatal("the node reports ready")
	}
	var c clusterView
	a.getJSON("/v1/cluster", &c)
	for _, m := range c.Members {
		if m.Name == cfg.NodeName && m.OwnedShards > 0 {
			t.Fatalf("the refused node owns %d shards in the cluster's view", m.OwnedShards)
		}
	}
}
