package replication_test

import (
	"context"
	"testing"
	"time"

	"github.com/fairshard/fairshard/outbox"
)

// finishAll finishes every row n claims as primary: every fourth is
// retried and then cancelled (with a reason), the rest completed; with
// ship each change is shipped to the backups.
func finishAll(t *testing.T, n *tnode, ship bool) {
	t.Helper()
	ctx := context.Background()
	for i, r := range claimAll(t, n) {
		if i%4 == 0 {
			if err := n.store.Retry(ctx, outbox.RetryParams{DispatchKey: r.DispatchKey, Claim: r.Version, VisibleAfter: time.Now().UTC(), LastError: "503"}); err != nil {
				t.Fatal(err)
			}
			if ok, err := n.store.Cancel(ctx, outbox.CancelParams{DispatchKey: r.DispatchKey, Reason: "withdrawn"}); err != nil || !ok {
				t.Fatalf("cancel %s: %v %v", r.DispatchKey, ok, err)
			}
		} else if err := n.store.Complete(ctx, outbox.CompleteParams{DispatchKey: r.DispatchKey, Claim: r.Version}); err != nil {
			t.Fatal(err)
		}
		if ship {
			n.repl.Changed(r.DispatchKey)
		}
	}
}

// packAll packs every finished row of the named live nodes.
func (c *tcluster) packAll(names ...string) int {
	c.t.Helper()
	total := 0
	for _, name := range names {
		n, err := c.nodes[name].store.PackTombstones(context.Background())
		if err != nil {
			c.t.Fatalf("pack on %s: %v", name, err)
		}
		total += n
	}
	return total
}

// sameEverywhere fails unless every holder of each key answers the same
// status and version for it, and it has want holders.
func sameEverywhere(t *testing.T, c *tcluster, keys []string, want int) {
	t.Helper()
	ctx := context.Background()
	for _, k := range keys {
		var first *outbox.Row
		holders := 0
		for _, name := range c.live() {
			r, err := c.nodes[name].store.Get(ctx, k)
			if err != nil {
				continue
			}
			holders++
			if first == nil {
				first = &r
			} else if r.Status != first.Status || r.Version != first.Version || !r.FinishedAt.Equal(first.FinishedAt) {
				t.Fatalf("row %s: %s %v finished %v on %s, %s %v finished %v elsewhere", k, r.Status, r.Version, r.FinishedAt, name,
					first.Status, first.Version, first.FinishedAt)
			}
		}
		if holders != want {
			t.Fatalf("row %s held by %d nodes, want %d", k, holders, want)
		}
	}
}

// Finished rows packed into bundles on one replica and not on the other
// leave the per-shard digests equal; a wiped replica syncs them back
// (bulk copy pages run through the bundles), a replica that missed their
// settles gets them by digest repair (key/version lists and row fetches
// read packed rows), a stale pending copy merged onto a packed row leaves
// it finished, and copies moved off a node that no longer replicates a
// shard (marking reads and CompleteTransfer over bundles) end where they
// belong.
func TestPackedTombstonesReplicate(t *testing.T) {
	c := newTCluster(t, 16, 2, "a", "b")
	waitSynced(t, c)
	ctx := context.Background()
	rows := rowsFor("p", 600, time.Now().UTC())
	if _, err := c.nodes["a"].repl.Route(ctx, rows); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, len(rows))
	for i := range rows {
		keys[i] = rows[i].DispatchKey
	}
	for _, name := range c.live() {
		finishAll(t, c.nodes[name], true)
	}
	waitSynced(t, c)

	// Packing on one replica only: the digests still agree.
	if n := c.packAll("a"); n < 250 {
		t.Fatalf("packed %d rows on a, want its finished ones (≥ 250)", n)
	}
	if ok, msg := c.converged(); !ok {
		t.Fatalf("after packing on one replica: %s", msg)
	}
	sameEverywhere(t, c, keys, 2)

	// A stale pending copy of a packed row does not bring it back.
	var packedKey string
	for _, k := range keys {
		if r, err := c.nodes["a"].store.Get(ctx, k); err == nil && r.Status == outbox.StatusDone {
			packedKey = k
			break
		}
	}
	stale := rowsFor("p", 600, time.Now().UTC())
	var copyOf outbox.Row
	for _, r := range stale {
		if r.DispatchKey == packedKey {
			copyOf = r
		}
	}
	copyOf.Version, copyOf.Status = outbox.FirstVersion, outbox.StatusPending
	res, err := c.nodes["a"].repl.AcceptMerge(ctx, []outbox.Row{copyOf})
	if err != nil || res.Skipped != 1 {
		t.Fatalf("stale pending copy onto a packed row: %+v %v", res, err)
	}
	if r, err := c.nodes["a"].store.Get(ctx, packedKey); err != nil || r.Status != outbox.StatusDone {
		t.Fatalf("packed row after a stale copy: %s %v", r.Status, err)
	}

	// A wiped replica syncs packed rows back.
	c.kill("b", true)
	c.add("b")
	c.apply()
	waitSynced(t, c)
	sameEverywhere(t, c, keys, 2)

	// Settles b never hears of, on rows a then packs: repaired by digests.
	more := rowsFor("q", 300, time.Now().UTC())
	if _, err := c.nodes["a"].repl.Route(ctx, more); err != nil {
		t.Fatal(err)
	}
	waitSynced(t, c)
	for _, name := range c.live() {
		finishAll(t, c.nodes[name], false)
	}
	c.packAll("a", "b")
	mkeys := make([]string, len(more))
	for i := range more {
		mkeys[i] = more[i].DispatchKey
	}
	waitSynced(t, c)
	sameEverywhere(t, c, mkeys, 2)
	if metric(t, c.nodes["a"], "fairshard_replication_repaired_shards_total")+metric(t, c.nodes["b"], "fairshard_replication_repaired_shards_total") == 0 {
		t.Error("no repair counted for the unshipped settles")
	}
	c.packAll("a", "b")

	// A third node: shards move, leftovers (packed ones among them) are
	// copied to their new sets and dropped here.
	c.add("c")
	c.apply()
	waitSynced(t, c)
	sameEverywhere(t, c, append(keys, mkeys...), 2)
	for _, name := range c.live() {
		if err := c.nodes[name].store.Check(ctx); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
	}
}
