package node_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fairshard/fairshard/node"
)

// TestHandoffMovesLargeRows is the first bug, as an operator met
// it: a node holds rows with 1 MiB payloads in a paused namespace, a second
// node joins, the first is stopped gracefully. Before, handoff batches were
// bounded by rows only (500 × 1 MiB of JSON, over the receiver's body
// limit), every call failed, and the stopped node kept most rows on its
// disk (156 of 300 delivered). Now batches are bounded by bytes too: all
// 500 rows end on the second node and the first holds none.
func TestHandoffMovesLargeRows(t *testing.T) {
	if testing.Short() {
		t.Skip("moves 500 MiB between two nodes")
	}
	const rows, perPost = 500, 5
	a := startNode(t, nil)
	t0 := time.Now()
	defer func() { t.Logf("test took %v", time.Since(t0)) }()
	pause(t, []*tnode{a}, "big")
	payload := base64.StdEncoding.EncodeToString(make([]byte, node.MaxPayloadBytes))
	for i := 0; i < rows; i += perPost {
		var batch []rowIn
		for j := i; j < i+perPost; j++ {
			batch = append(batch, rowIn{"dispatch_key": fmt.Sprintf("big-%03d", j), "namespace": "big", "payload_base64": payload})
		}
		a.appendRows(batch...)
	}
	t.Logf("appended %d rows in %v", rows, time.Since(t0))
	if got := a.namespace("big").Pending; got != rows {
		t.Fatalf("%s holds %d rows before the join, want %d", a.Name(), got, rows)
	}
	start := time.Now()
	b := startNode(t, func(c *node.Config) { c.Join = []string{a.GossipAddr()} })
	waitConverged(t, []*tnode{a, b})
	eventually(t, 60*time.Second, func() bool { return b.namespace("big").Pending > 0 }, "the join's handoff to start moving rows")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Logf("join handoff started after %v; %d rows moved by then", time.Since(start), b.namespace("big").Pending)
	if err := a.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown of %s: %v", a.Name(), err)
	}
	t.Logf("all %d rows moved %v after the join", rows, time.Since(start))
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
	for _, k := range []string{"big-000", "big-250", "big-499"} {
		var v struct {
			Payload []byte `json:"payload_base64"`
		}
		b.mustDo(http.MethodGet, "/v1/rows/"+k, nil, http.StatusOK, &v)
		if len(v.Payload) != node.MaxPayloadBytes {
			t.Fatalf("row %s arrived with %d payload bytes, want %d", k, len(v.Payload), node.MaxPayloadBytes)
		}
	}
	if sent := b.metric("fairshard_handoff_rows_received_total"); sent < rows {
		t.Fatalf("%s received %v rows by handoff, want ≥ %d", b.Name(), sent, rows)
	}
}
