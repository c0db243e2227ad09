package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
)

// TestWrongClusterSecret runs with real processes: a process that can
// gossip (no gossip key on loopback here) but holds another cluster secret
// joins and is given shards, yet no member sends it a row: its API cannot
// answer their signed calls, so each member shows it unreachable, and with
// replicated shards (R = 2, the default) an append whose rows have it in
// their replica set cannot reach the write-copies minimum: 503
// insufficient_copies naming it, retryable, nothing reported stored (never
// a success with one copy). When it leaves, the producer's retry of the
// same batch succeeds and every row is delivered, none lost.
func TestWrongClusterSecret(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	a := c.startNode("sec-a")
	b := c.startNode("sec-b")
	x := c.startNode("sec-x", withFlags("--cluster-secret", "not-the-cluster-secret-0123456789"))
	c.waitConverged(deadline(20 * time.Second))

	reach := func(p *proc) map[string]bool {
		var v struct {
			Members []struct {
				Name      string `json:"name"`
				Reachable bool   `json:"reachable"`
			} `json:"members"`
		}
		if code, _, err := c.do(http.MethodGet, p.baseURL()+"/v1/cluster", nil, &v); err != nil || code != 200 {
			return nil
		}
		out := map[string]bool{}
		for _, m := range v.Members {
			out[m.Name] = m.Reachable
		}
		return out
	}
	poll.Eventually(t, deadline(deadline(20*time.Second)), "every node to see the other side unreachable", func() (bool, string) {
		ra, rb, rx := reach(a), reach(b), reach(x)
		ok := ra["sec-b"] && !ra["sec-x"] && rb["sec-a"] && !rb["sec-x"] && !rx["sec-a"] && !rx["sec-b"]
		return ok, fmt.Sprintf("a sees %v, b sees %v, x sees %v", ra, rb, rx)
	})

	var rows []map[string]any
	for i := range 200 {
		rows = append(rows, map[string]any{"dispatch_key": fmt.Sprintf("sec-%03d", i), "namespace": "sec"})
	}
	var out struct {
		Rows []struct {
			DispatchKey string `json:"dispatch_key"`
			Status      string `json:"status"`
			Node        string `json:"node"`
		} `json:"rows"`
	}
	var refused struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	code, body, err := c.do(http.MethodPost, a.baseURL()+"/v1/rows", map[string]any{"rows": rows}, nil)
	if err == nil {
		err = json.Unmarshal(body, &refused)
	}
	if err != nil || code != http.StatusServiceUnavailable || refused.Error.Code != "insufficient_copies" ||
		!strings.Contains(refused.Error.Message, "sec-x") {
		t.Fatalf("append through sec-a: HTTP %d %s (%v); want 503 insufficient_copies naming sec-x, the replica that cannot be reached", code, body, err)
	}
	xv, err := c.namespace(x, "sec")
	if err != nil {
		t.Fatal(err)
	}
	if xv.Pending+xv.Claimed+xv.DeadLetters != 0 {
		t.Errorf("sec-x holds %d pending, %d claimed rows: rows reached a process without the secret", xv.Pending, xv.Claimed)
	}
	if v := c.mustMetric(a, "fairshard_unreachable_members", nil); v != 1 {
		t.Errorf("sec-a: fairshard_unreachable_members = %v, want 1", v)
	}
	if code := x.stop(t, 30*time.Second); code != 0 {
		t.Errorf("sec-x exited %d on SIGTERM, want 0", code)
	}
	poll.Eventually(t, deadline(deadline(30*time.Second)), "the producer's retry of the batch answered once sec-x left", func() (bool, string) {
		code, body, err := c.do(http.MethodPost, a.baseURL()+"/v1/rows", map[string]any{"rows": rows}, &out)
		return err == nil && code == http.StatusOK, fmt.Sprintf("HTTP %d %.200s %v", code, body, err)
	})
	for _, r := range out.Rows {
		if r.Node == "sec-x" {
			t.Errorf("row %s stored on the process without the secret: %+v", r.DispatchKey, r)
		}
	}
	recv := c.receiver()
	poll.Eventually(t, deadline(deadline(30*time.Second)), "all 200 rows appended through sec-a delivered once sec-x left", func() (bool, string) {
		missing := 0
		for i := range 200 {
			if recv.Count(fmt.Sprintf("sec-%03d", i)) == 0 {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d not delivered", missing)
	})
}
