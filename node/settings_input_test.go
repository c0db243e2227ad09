package node_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/internal/settings"
	"github.com/fairshard/fairshard/kv"
	"github.com/fairshard/fairshard/node"
)

// TestConfigEntriesValidatedOnRead validates the config on read: values in
// the gossiped config are written by other nodes (or read back from the
// data file), so they are checked like the admin API's input. A node
// starting on a data dir whose config holds a quota of 4e9, a retry
// override with factor 1000 and a target with a file:// URL ignores them
// (defaults apply, the route waits for a target) and serves; valid entries
// beside them keep working.
func TestConfigEntriesValidatedOnRead(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	store, err := boltstore.Open(filepath.Join(cfg.DataDir, node.DataFileName), boltstore.Options{ShardCount: cfg.Shards})
	if err != nil {
		t.Fatal(err)
	}
	p := settings.Persister{Store: store}
	v := kv.Version{Clock: 1, Node: "forger"}
	for key, value := range map[string]string{
		"ns/bad/max_in_flight":  `4000000000`,
		"ns/bad/retry":          `{"factor":1000}`,
		"target/bad/q":          `{"url":"file:///etc/passwd"}`,
		"ns/good/max_in_flight": `7`,
	} {
		if err := p.Save(context.Background(), kv.Entry{Key: key, Value: []byte(value), Version: v}); err != nil {
			t.Fatal(err)
		}
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
	n := startConfig(t, cfg)
	var bad struct {
		MaxInFlight        uint32         `json:"max_in_flight"`
		MaxInFlightDefault bool           `json:"max_in_flight_default"`
		Retry              map[string]any `json:"retry"`
	}
	n.mustDo("GET", "/v1/namespaces/bad", nil, 200, &bad)
	if bad.MaxInFlight == 4_000_000_000 || !bad.MaxInFlightDefault || bad.Retry != nil {
		t.Errorf("namespace bad: %+v; want the default quota and no retry override (the stored values are out of bounds)", bad)
	}
	if got := n.namespace("good"); got.MaxInFlight != 7 {
		t.Errorf("namespace good: quota %d, want 7", got.MaxInFlight)
	}
	n.appendRows(rowIn{"dispatch_key": "cfg-1", "namespace": "bad", "task_queue": "q"})
	poll.Eventually(t, 5*time.Second, "route bad/q to wait for a target (its stored file:// target is ignored)", func() (bool, string) {
		var v struct {
			WaitingRoutes []string `json:"waiting_routes"`
		}
		n.mustDo("GET", "/v1/namespaces/bad", nil, 200, &v)
		return len(v.WaitingRoutes) == 1 && v.WaitingRoutes[0] == "q", ""
	})
}
