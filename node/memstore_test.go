package node_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/node"
	"github.com/fairshard/fairshard/outbox/memstore"
	"github.com/fairshard/fairshard/shards"
)

// memstore stands behind a node as well as boltstore does.
var _ node.Store = (*memstore.Store)(nil)

// startMemNode starts a test node on an in-memory store (NewWithStore).
func startMemNode(t *testing.T, mutate func(*node.Config)) *tnode {
	t.Helper()
	cfg := testConfig(t)
	if mutate != nil {
		mutate(&cfg)
	}
	return startWith(t, cfg, func(cfg node.Config, log *slog.Logger) (*node.Node, error) {
		return node.NewWithStore(cfg, memstore.New(cfg.Shards), log)
	})
}

// TestNodeOnMemstore: a node depends on the Store interface, not on bbolt.
// Two real nodes on memstore (real memberlist on loopback, real HTTP, a
// real target) take appends, hand rows off when the second joins, deliver
// every row exactly once, and hand off what the second holds when it stops
// gracefully.
func TestNodeOnMemstore(t *testing.T) {
	t.Parallel()
	tg := newTarget(t)
	a := startMemNode(t, nil)
	a.setTarget("mem", "default", tg.URL())
	pause(t, []*tnode{a}, "mem")

	// Alone, a owns every shard: it stores all 300 rows.
	var keys []string
	for b := range 3 {
		var rows []rowIn
		for i := range 100 {
			k := fmt.Sprintf("mem-%d-%03d", b, i)
			rows = append(rows, rowIn{"dispatch_key": k, "namespace": "mem"})
			keys = append(keys, k)
		}
		for _, r := range a.appendRows(rows...).Rows {
			if r.Status != "created" || r.Node != a.Name() {
				t.Fatalf("append to a lone node: %+v, want created on %s", r, a.Name())
			}
		}
	}

	// b joins: the rows of the shards it now owns move to it by handoff.
	b := startMemNode(t, func(c *node.Config) { c.Join = []string{a.GossipAddr()} })
	nodes := []*tnode{a, b}
	table := waitConverged(t, nodes)
	onB := 0
	for _, k := range keys {
		if table[shards.ShardOf(k, 1024)] == b.Name() {
			onB++
		}
	}
	if onB == 0 || onB == len(keys) {
		t.Fatalf("%d of %d rows belong to %s; want some on each node", onB, len(keys), b.Name())
	}
	wantPlacement(t, nodes, "mem", keys, table)
	wantRowsOnOwners(t, nodes, keys, table)
	// The copies came by replication (a shard sync counts its rows when
	// the shard's copy ends, so the count may trail the rows a moment; a
	// merge pushed by a counts as received), not by appends.
	moved := func() float64 {
		return b.metric("fairshard_replication_sync_rows_total") + b.metric("fairshard_replication_received_rows_total")
	}
	poll.Eventually(t, 20*time.Second, fmt.Sprintf("%s to count ≥ %d rows received by shard sync or merge", b.Name(), onB), func() (bool, string) { return moved() >= float64(onB), "" })

	// Deliver: every row exactly once, from its owner.
	b.mustDo(http.MethodPut, "/v1/namespaces/mem", map[string]any{"paused": false}, http.StatusOK, nil)
	poll.Eventually(t, 20*time.Second, fmt.Sprintf("all %d rows to be delivered", len(keys)), func() (bool, string) { return tg.Distinct() >= len(keys), fmt.Sprintf("have %d", tg.Distinct()) })
	for _, k := range keys {
		if c := tg.Count(k); c != 1 {
			t.Errorf("row %s delivered %d times, want 1", k, c)
		}
	}
	for i, k := range keys[:20] {
		owner := table[shards.ShardOf(k, 1024)]
		if v := nodes[i%2].waitStatus(k, "done", 10*time.Second); v.Node != owner {
			t.Errorf("row %s is done on %s, want its owner %s", k, v.Node, owner)
		}
	}

	// A graceful stop of b hands everything it holds to a: the finished
	// rows (the dedupe record) and new pending ones.
	pause(t, nodes, "mem")
	var more []rowIn
	var moreKeys []string
	for i := range 100 {
		k := fmt.Sprintf("mem-more-%03d", i)
		more = append(more, rowIn{"dispatch_key": k, "namespace": "mem"})
		moreKeys = append(moreKeys, k)
	}
	b.appendRows(more...)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := b.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown of %s: %v", b.Name(), err)
	}
	poll.Eventually(t, 10*time.Second, fmt.Sprintf("%s to hold all %d new rows after %s stopped", a.Name(), len(moreKeys), b.Name()), func() (bool, string) {
		return a.namespace("mem").Pending == len(moreKeys), fmt.Sprintf("has %d", a.namespace("mem").Pending)
	})
	for _, k := range keys {
		if table[shards.ShardOf(k, 1024)] != b.Name() {
			continue
		}
		if v, ok := a.getRow(k); !ok || v.Node != a.Name() || v.Status != "done" {
			t.Errorf("row %s after %s stopped: found %v on %q (%s), want done on %s", k, b.Name(), ok, v.Node, v.Status, a.Name())
		}
	}
	if d := tg.Duplicates(); len(d) != 0 {
		t.Errorf("duplicate deliveries: %v", d)
	}
}
