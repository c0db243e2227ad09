package node_test

import (
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/internal/testnode"
	"github.com/fairshard/fairshard/node"
	"github.com/fairshard/fairshard/outbox"
)

// TestHandoffMovesLargeRows: a node holds rows with 1 MiB payloads in a
// paused namespace, a second node joins, the first is stopped gracefully.
// Every row ends on the second node, whole, and the first holds none: the
// batches that move rows are bounded by bytes as well as rows, so none
// exceeds the receiver's body limit (replication.MaxBodyBytes, 64 MiB).
// The gate moves 80 rows (about 110 MiB as JSON: one batch bounded by rows
// only would be refused); make test-long moves 500 (testnode.Long).
func TestHandoffMovesLargeRows(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 80 rows of 1 MiB between two nodes")
	}
	rows := 80
	if testnode.Long() {
		rows = 500
	}
	// The rows are written into the first node's data file before it
	// starts (appending 500 MiB as JSON over HTTP would dominate the test,
	// and appends are not what is tested here). No route has a target, so
	// nothing is claimed.
	// LAN gossip timing and a long grace: moving 500 MiB keeps both nodes
	// busy (minutes under the race detector on a shared machine), and the
	// fast test timing would declare a busy node dead mid-transfer.
	slow := func(c *node.Config) {
		c.GossipProfile = node.DefaultConfig().GossipProfile
		c.ShutdownGrace = 5 * time.Minute
	}
	cfgA := testConfig(t)
	slow(&cfgA)
	s, err := boltstore.Open(filepath.Join(cfgA.DataDir, node.DataFileName), boltstore.Options{ShardCount: cfgA.Shards})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < rows; i += 10 {
		var batch []outbox.Row
		for j := i; j < i+10; j++ {
			batch = append(batch, outbox.Row{DispatchKey: fmt.Sprintf("big-%03d", j), WorkflowID: "wf", Namespace: "big",
				TaskQueue: "default", Payload: make([]byte, node.MaxPayloadBytes), ContentType: "application/octet-stream"})
		}
		if _, err := s.Append(context.Background(), batch); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	a := startConfig(t, cfgA)
	pause(t, []*tnode{a}, "big")
	if got := a.namespace("big").Pending; got != rows {
		t.Fatalf("%s holds %d rows before the join, want %d", a.Name(), got, rows)
	}
	start := time.Now()
	b := startNode(t, func(c *node.Config) { slow(c); c.Join = []string{a.GossipAddr()} })
	waitConverged(t, []*tnode{a, b})
	poll.Eventually(t, 2*time.Minute, "the join's handoff to start moving rows", func() (bool, string) { return b.namespace("big").Pending > 0, "" })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if err := a.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown of %s: %v", a.Name(), err)
	}
	t.Logf("%d rows of 1 MiB moved %v after the second node started", rows, time.Since(start).Round(time.Millisecond))
	if got := b.namespace("big").Pending; got != rows {
		t.Fatalf("%s holds %d of the %d rows after %s left", b.Name(), got, rows, a.Name())
	}
	stats, err := openStore(t, a.cfg.DataDir).NamespaceStats(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if st := stats["big"]; st.Pending+st.Claimed+st.Done+st.Failed != 0 {
		t.Fatalf("%s kept rows on its disk after a graceful stop: %+v", a.Name(), st)
	}
	// Every row arrived whole.
	for _, k := range []string{"big-000", fmt.Sprintf("big-%03d", rows/2), fmt.Sprintf("big-%03d", rows-1)} {
		var v struct {
			Payload []byte `json:"payload_base64"`
		}
		b.mustDo(http.MethodGet, "/v1/rows/"+k, nil, http.StatusOK, &v)
		if len(v.Payload) != node.MaxPayloadBytes {
			t.Fatalf("row %s arrived with %d payload bytes, want %d", k, len(v.Payload), node.MaxPayloadBytes)
		}
	}
	if got := b.metric("fairshard_replication_sync_rows_total") + b.metric("fairshard_replication_received_rows_total"); got < float64(rows) {
		t.Fatalf("%s received %v rows by shard sync and drain, want ≥ %d", b.Name(), got, rows)
	}
}
