package e2e

import (
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/loadgen"
	"github.com/fairshard/fairshard/webhook"
)

// TestSignedDeliveriesAcrossTheCluster on real processes: a route's signing
// secret and header, set through one node, reach every node through the
// gossiped config, and every delivery of every node verifies at the target
// (loadgen.Receiver with the secret, which answers 401 to anything else). A
// rotation: with [new, old] a target that knows only the new secret
// verifies every delivery.
func TestSignedDeliveriesAcrossTheCluster(t *testing.T) {
	c := newCluster(t, clusterOpts{})
	for i := range 3 {
		c.startNode(fmt.Sprintf("sign-%d", i))
	}
	c.waitConverged(20 * time.Second)
	oldS, newS := webhook.NewSecret(), webhook.NewSecret()
	parse := func(ss ...string) []webhook.Secret {
		out, err := webhook.ParseSecrets(ss)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	put := func(body map[string]any) {
		t.Helper()
		body["url"] = c.targetURL
		p := c.members()[0]
		if code, b, err := c.do(http.MethodPut, p.baseURL()+"/v1/namespaces/signed/task-queues/q0/target", body, nil); err != nil || code != http.StatusOK {
			t.Fatalf("PUT target: HTTP %d %s: %v", code, b, err)
		}
		c.waitConfigConverged(20 * time.Second)
	}
	send := func(prefix string, rows int) {
		t.Helper()
		l := newLedger()
		rep := runLoad(t, c.generator(l, loadgen.Config{Rows: rows, BatchSize: 50, Concurrency: 3, KeyPrefix: prefix,
			Namespaces: []loadgen.Namespace{{Name: "signed", Weight: 1, TaskQueues: 1}}})) // task queue q0
		if rep.Appended != int64(rows) || rep.GaveUp != 0 {
			t.Fatalf("appended %d/%d (%d given up)", rep.Appended, rows, rep.GaveUp)
		}
		c.waitDelivered(l, c.receiver(), time.Minute)
	}

	put(map[string]any{"signing_secret": oldS, "headers": map[string]string{"Authorization": "Bearer e2e"}})
	c.receiver().SetSigningSecrets(parse(oldS))
	send("signed-", 300)
	if f, v := c.receiver().SignatureFailures(), c.receiver().Verified(); f != 0 || v < 300 {
		t.Fatalf("one secret: %d deliveries verified, %d failed verification; want ≥ 300 and 0", v, f)
	}

	put(map[string]any{"signing_secrets": []string{newS, oldS}})
	c.receiver().SetSigningSecrets(parse(newS)) // the target has moved to the new secret
	before := c.receiver().Verified()
	send("rotated-", 100)
	if f, v := c.receiver().SignatureFailures(), c.receiver().Verified()-before; f != 0 || v < 100 {
		t.Fatalf("during the rotation: %d deliveries verified with the new secret alone, %d failed; want ≥ 100 and 0", v, f)
	}
	t.Logf("%d deliveries from 3 nodes verified, %d failed", c.receiver().Verified(), c.receiver().SignatureFailures())
}

// waitConfigConverged waits until every member holds a gossiped config of
// the same size (fairshard_cluster_config_state_bytes), which a write
// changes: the write has reached every node.
func (c *testCluster) waitConfigConverged(timeout time.Duration) {
	c.t.Helper()
	poll.Eventually(c.t, deadline(timeout), "every node to hold the same cluster config", func() (bool, string) {
		var sizes []float64
		for _, p := range c.members() {
			v, err := c.metric(p, "fairshard_cluster_config_state_bytes", nil)
			if err != nil {
				return false, err.Error()
			}
			sizes = append(sizes, v)
		}
		for _, s := range sizes[1:] {
			if s != sizes[0] {
				return false, fmt.Sprintf("config sizes %v", sizes)
			}
		}
		return true, ""
	})
}
