package node_test

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/boltstore/diskfault"
	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/internal/testmetrics"
	"github.com/fairshard/fairshard/node"
)

// TestNotReadyWhileTheDiskIsFull: a node whose data dir is on a tmpfs that
// fills up answers appends 503, and /readyz turns 503 too (saying the store
// cannot write), so a load balancer stops sending; it stays so while the
// disk is full (the store's reopen attempts fail), and once space is freed
// /readyz is 200 again and appends are stored.
func TestNotReadyWhileTheDiskIsFull(t *testing.T) {
	dataDir := diskfault.Tmpfs(t, 24<<20)
	n := startNode(t, func(c *node.Config) { c.DataDir = dataDir })
	if st, b := n.do(http.MethodGet, "/readyz", nil); st != http.StatusOK {
		t.Fatalf("readyz before: %d %s", st, b)
	}
	payload := base64.StdEncoding.EncodeToString([]byte(strings.Repeat("p", 8<<10)))
	batch := func(prefix string, i int) []rowIn {
		rows := make([]rowIn, 16)
		for j := range rows {
			rows[j] = rowIn{"dispatch_key": fmt.Sprintf("%s-%d-%d", prefix, i, j), "namespace": "held", "payload_base64": payload}
		}
		return rows
	}
	pause(t, []*tnode{n}, "held") // rows stay pending: nothing else writes
	var acked []string
	for i := range 5 {
		for _, r := range n.appendRows(batch("before", i)...).Rows {
			acked = append(acked, r.DispatchKey)
		}
	}
	free := diskfault.Fill(t, dataDir)
	var refused bool
	for i := range 2000 {
		st, b := n.do(http.MethodPost, "/v1/rows", map[string]any{"rows": batch("full", i)})
		if st == http.StatusServiceUnavailable {
			wantError(t, st, b, http.StatusServiceUnavailable, api.CodeUnavailable, "")
			refused = true
			break
		}
		if st != http.StatusOK {
			t.Fatalf("append on a filling disk: %d %s", st, b)
		}
		var out appendOut
		mustUnmarshal(t, b, &out)
		for _, r := range out.Rows {
			acked = append(acked, r.DispatchKey)
		}
	}
	if !refused {
		t.Fatal("2,000 batches of 128 KiB stored on a full 24 MiB disk")
	}
	// Not ready at once, and while the disk stays full (reopens fail).
	for {
		st, b := n.do(http.MethodGet, "/readyz", nil)
		if st != http.StatusServiceUnavailable || !strings.Contains(string(b), "the store cannot write") {
			t.Fatalf("readyz with a full disk: %d %s", st, b)
		}
		if st, _ := n.do(http.MethodPost, "/v1/rows", map[string]any{"rows": batch("refused", 0)}); st != http.StatusServiceUnavailable {
			t.Fatalf("append while not ready: %d", st)
		}
		if testmetrics.Sum(t, n.Registry(), "fairshard_store_reopens_total", "result=failed") >= 1 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if v := n.metric("fairshard_store_writable"); v != 0 {
		t.Fatalf("fairshard_store_writable %v while the disk is full", v)
	}
	free()
	poll.Eventually(t, 30*time.Second, "readyz after space was freed", func() (bool, string) {
		st, _ := n.do(http.MethodGet, "/readyz", nil)
		return st == http.StatusOK, ""
	})
	n.appendRows(batch("after", 0)...)
	for _, k := range acked {
		if v, ok := n.getRow(k); !ok || v.Status != "pending" {
			t.Fatalf("acknowledged row %q after recovery: %+v %v", k, v, ok)
		}
	}
}
