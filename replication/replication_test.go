package replication_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/nodeauth"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/replication"
	"github.com/fairshard/fairshard/shards"
	"github.com/fairshard/fairshard/transfer"
)

func transferLimits() transfer.Limits { return transfer.Limits{MaxRows: 100, MaxBytes: 64 << 10} }

// testAuth signs the test members' calls as nodes do (package nodeauth).
var testAuth = func() *nodeauth.Auth {
	a, err := nodeauth.New(nodeauth.Config{Secrets: [][]byte{[]byte(testSecret)}, MaxBodyBytes: replication.MaxBodyBytes})
	if err != nil {
		panic(err)
	}
	return a
}()

// authOnly guards h as a node's API does: unsigned calls are refused.
func authOnly(h http.Handler) http.Handler { return testAuth.Middleware(h) }

func waitSynced(t testing.TB, c *tcluster) {
	t.Helper()
	poll.Eventually(t, 20*time.Second, "replica sets synced and agreeing", c.converged)
}

// Every appended row is durable on each member of its replica set before
// the append is answered, whichever node received it.
func TestRouteWritesEveryReplica(t *testing.T) {
	c := newTCluster(t, 64, 2, "a", "b", "c")
	waitSynced(t, c)
	ctx := context.Background()
	rows := rowsFor("k", 300, time.Now().UTC())
	out, err := c.nodes["a"].repl.Route(ctx, rows)
	if err != nil {
		t.Fatal(err)
	}
	v := c.view("a")
	for i, o := range out {
		key := rows[i].DispatchKey
		set := v.Sets[rows[i].Shard]
		if o.Status != outbox.AppendCreated || o.Copies != 2 || o.Node != set[0] {
			t.Fatalf("row %s: outcome %+v, want created with 2 copies by the primary %s", key, o, set[0])
		}
		if got := c.holders(key); !slices.Equal(got, sortedCopy(set)) {
			t.Fatalf("row %s is held by %v, want its replica set %v", key, got, set)
		}
	}
	// A retry of the same batch is answered as duplicates, still 2 copies.
	out, err = c.nodes["b"].repl.Route(ctx, rowsFor("k", 300, time.Now().UTC()))
	if err != nil {
		t.Fatal(err)
	}
	for i, o := range out {
		if o.Status != outbox.AppendDuplicate || o.Copies != 2 {
			t.Fatalf("retry of row %d: %+v, want duplicate with 2 copies", i, o)
		}
	}
	waitSynced(t, c)
}

func sortedCopy(s []string) []string {
	out := slices.Clone(s)
	slices.Sort(out)
	return out
}

// With a replica down (still in the view, as before failure detection)
// and write-copies 2, the append fails with ErrInsufficientCopies; once
// the view drops it and a replacement is synced, appends succeed again.
func TestWriteRefusedWhileCopiesUnmet(t *testing.T) {
	c := newTCluster(t, 16, 2, "a", "b")
	waitSynced(t, c)
	ctx := context.Background()
	c.kill("b", false) // the view still lists b
	_, err := c.nodes["a"].repl.Route(ctx, rowsFor("down", 20, time.Now().UTC()))
	if !errors.Is(err, replication.ErrInsufficientCopies) {
		t.Fatalf("append with a replica down: %v, want ErrInsufficientCopies", err)
	}
	if v := metric(t, c.nodes["a"], "fairshard_replication_writes_total", "outcome=insufficient_copies"); v < 1 {
		t.Errorf("writes_total{insufficient_copies} = %v", v)
	}
	// Failure detected: a alone. Seeded, so the minimum stays 2: refused.
	c.apply()
	if got := c.nodes["a"].repl.WriteCopies(); got != 2 {
		t.Fatalf("write copies alone (seeded) = %d, want 2", got)
	}
	if _, err := c.nodes["a"].repl.Route(ctx, rowsFor("alone", 5, time.Now().UTC())); !errors.Is(err, replication.ErrInsufficientCopies) {
		t.Fatalf("append with one member left: %v, want ErrInsufficientCopies", err)
	}
	st := c.nodes["a"].repl.Status()
	if !st.UnderReplicated || st.Copies != 1 || st.Factor != 2 {
		t.Fatalf("status alone: %+v, want under-replicated with 1 copy of 2", st)
	}
	// A replacement joins and syncs: appends succeed, and the rows stored
	// by the refused attempts (never reported) are replicated too.
	c.add("d")
	c.apply()
	waitSynced(t, c)
	out, err := c.nodes["a"].repl.Route(ctx, rowsFor("down", 20, time.Now().UTC()))
	if err != nil {
		t.Fatalf("append after the replacement synced: %v", err)
	}
	for i, o := range out {
		if o.Copies != 2 {
			t.Fatalf("row %d: %+v, want 2 copies", i, o)
		}
		if h := c.holders(rowsFor("down", 20, time.Time{})[i].DispatchKey); len(h) != 2 {
			t.Fatalf("row %d held by %v", i, h)
		}
	}
}

// claimAll claims every visible row of node n's scope and returns them.
func claimAll(t *testing.T, n *tnode) []outbox.Row {
	t.Helper()
	rows, err := n.store.Claim(context.Background(), outbox.ClaimParams{Limit: 100000, Now: time.Now().UTC().Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	return rows
}

// Settles on the primary reach the backups asynchronously (Changed), and
// the lag is exported.
func TestChangedShipsStateToBackups(t *testing.T) {
	c := newTCluster(t, 16, 3, "a", "b", "c")
	waitSynced(t, c)
	ctx := context.Background()
	if _, err := c.nodes["a"].repl.Route(ctx, rowsFor("s", 200, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	done := map[string]bool{}
	for _, name := range c.live() {
		n := c.nodes[name]
		rows := claimAll(t, n)
		settle(t, n, rows)
		for _, row := range rows {
			done[row.DispatchKey] = true
		}
	}
	if len(done) != 200 {
		t.Fatalf("primaries claimed %d rows, want all 200 (each exactly once)", len(done))
	}
	poll.Eventually(t, 10*time.Second, "every copy done", func() (bool, string) {
		for key := range done {
			for _, name := range c.live() {
				row, err := c.nodes[name].store.Get(ctx, key)
				if err != nil || row.Status != outbox.StatusDone {
					return false, fmt.Sprintf("%s on %s: %v %v", key, name, row.Status, err)
				}
			}
		}
		return true, ""
	})
	shipped, lag := 0.0, 0.0
	for _, name := range c.live() {
		shipped += metric(t, c.nodes[name], "fairshard_replication_shipped_rows_total")
		lag += metric(t, c.nodes[name], "fairshard_replication_lag_seconds")
	}
	if shipped < 400 || lag < 400 {
		t.Errorf("shipped %v rows with %v lag observations, want ≥ 400 each (200 rows × 2 backups)", shipped, lag)
	}
	waitSynced(t, c)
}

// A node joining takes its share: it syncs the shards of its new sets
// (bulk when empty), then the nodes that left those sets drop their
// copies; every row stays on exactly R nodes.
func TestJoinSyncsAndDropsLeftovers(t *testing.T) {
	c := newTCluster(t, 32, 2, "a", "b")
	waitSynced(t, c)
	ctx := context.Background()
	const n = 3000
	if _, err := c.nodes["a"].repl.Route(ctx, rowsFor("j", n, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	c.add("c")
	c.apply()
	waitSynced(t, c)
	total := int64(0)
	for _, name := range c.live() {
		ds, _ := c.nodes[name].store.ShardDigests(ctx)
		for _, d := range ds {
			total += d.Rows
		}
	}
	if total != 2*n {
		t.Fatalf("%d copies held, want %d (R = 2)", total, 2*n)
	}
	if metric(t, c.nodes["c"], "fairshard_replication_sync_rows_total", "kind=bulk") == 0 {
		t.Error("the new node copied no shard in bulk")
	}
	if metric(t, c.nodes["a"], "fairshard_replication_dropped_rows_total")+metric(t, c.nodes["b"], "fairshard_replication_dropped_rows_total") == 0 {
		t.Error("no leftover copy was dropped")
	}
}

// A primary dies: the failover primary claims from its own copy (its
// scope covers the shards at once, it held them), nothing is lost; and a
// node that comes back wiped syncs everything again.
func TestFailoverAndWipedRestart(t *testing.T) {
	c := newTCluster(t, 32, 2, "a", "b", "c")
	waitSynced(t, c)
	ctx := context.Background()
	rows := rowsFor("f", 1000, time.Now().UTC())
	if _, err := c.nodes["b"].repl.Route(ctx, rows); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	c.kill("a", true)
	c.apply()
	waitSynced(t, c)
	t.Logf("failover synced in %v", time.Since(t0))
	claimed := map[string]bool{}
	for _, name := range c.live() {
		n := c.nodes[name]
		got := claimAll(t, n)
		for _, r := range got {
			if claimed[r.DispatchKey] {
				t.Fatalf("row %s claimed twice", r.DispatchKey)
			}
			claimed[r.DispatchKey] = true
		}
		settle(t, n, got)
	}
	if len(claimed) != len(rows) {
		t.Fatalf("after losing a node and its disk, %d of %d rows claimable", len(claimed), len(rows))
	}
	// a returns with an empty disk: it syncs, and its primaries claim only
	// once synced (their rows are claimed already here: nothing pending).
	t0 = time.Now()
	c.add("a")
	c.apply()
	waitSynced(t, c)
	t.Logf("wiped node synced in %v", time.Since(t0))
	if got := c.nodes["a"].repl.Status(); got.SyncingShards != 0 || got.ReplicaShards == 0 {
		t.Fatalf("wiped node after sync: %+v", got)
	}
}

// Replicas that diverged behind replication's back (a copy changed without
// Changed, as a lost message or a partition leaves it) are repaired by the
// digest polls.
func TestRepairHealsDivergence(t *testing.T) {
	c := newTCluster(t, 8, 2, "a", "b")
	waitSynced(t, c)
	ctx := context.Background()
	if _, err := c.nodes["a"].repl.Route(ctx, rowsFor("r", 100, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	// Rows only one replica has, and a settle only one has seen.
	for _, name := range c.live() {
		n := c.nodes[name]
		only := rowsFor("only-"+name, 10, time.Now().UTC())
		if _, err := n.store.Append(ctx, only); err != nil {
			t.Fatal(err)
		}
		for _, r := range claimAll(t, n)[:5] {
			if err := n.store.Complete(ctx, outbox.CompleteParams{DispatchKey: r.DispatchKey, Claim: r.Version}); err != nil {
				t.Fatal(err)
			}
		}
	}
	waitSynced(t, c)
	if metric(t, c.nodes["a"], "fairshard_replication_repaired_shards_total")+metric(t, c.nodes["b"], "fairshard_replication_repaired_shards_total") == 0 {
		t.Error("no repair counted")
	}
	for _, name := range c.live() {
		for i := range 10 {
			if h := c.holders(fmt.Sprintf("only-%s-%d", name, i)); len(h) != 2 {
				t.Fatalf("row only-%s-%d held by %v after repair", name, i, h)
			}
		}
	}
}

// A graceful leave hands every row to the sets and deletes it here.
func TestDrain(t *testing.T) {
	c := newTCluster(t, 16, 1, "a", "b", "c")
	waitSynced(t, c)
	ctx := context.Background()
	rows := rowsFor("d", 500, time.Now().UTC())
	if _, err := c.nodes["c"].repl.Route(ctx, rows); err != nil {
		t.Fatal(err)
	}
	// c leaves: the others' view has no c; c's view marks it leaving.
	members := []string{"a", "b"}
	c.applyTo(members, members)
	v := *c.view("a")
	v.Self, v.Leaving = "c", true
	v.Addrs = map[string]string{"a": v.Addrs["a"], "b": v.Addrs["b"], "c": c.nodes["c"].srv.URL[len("http://"):]}
	c.nodes["c"].repl.Apply(&v)
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := c.nodes["c"].repl.Drain(dctx); err != nil {
		t.Fatal(err)
	}
	if left, _ := c.nodes["c"].repl.Leftovers(ctx); len(left) != 0 {
		t.Fatalf("after the drain %d shards hold rows", len(left))
	}
	waitSynced(t, c) // a and b rebalance between them too
	for _, r := range rows {
		if h := c.holders(r.DispatchKey); len(h) != 1 || h[0] == "c" {
			t.Fatalf("row %s held by %v after the drain", r.DispatchKey, h)
		}
	}
}

// A forwarded row is stamped by the coordinator's clock: a receiving node
// whose clock runs ten minutes ahead does not delay it.
func TestForwardedTimesAreRelative(t *testing.T) {
	c := newTCluster(t, 16, 1, "a", "b")
	waitSynced(t, c)
	skew := 10 * time.Minute
	c.nodes["a"].now = func() time.Time { return time.Now().Add(skew) }
	ctx := context.Background()
	now := c.nodes["a"].now().UTC()
	rows := rowsFor("t", 40, now)
	for i := range rows {
		rows[i].VisibleAfter = now.Add(time.Duration(i%2) * time.Minute) // every other row delayed 1 min
	}
	out, err := c.nodes["a"].repl.Route(ctx, rows)
	if err != nil {
		t.Fatal(err)
	}
	forwarded := 0
	for i, o := range out {
		if o.Node != "b" {
			continue
		}
		forwarded++
		row, err := c.nodes["b"].store.Get(ctx, rows[i].DispatchKey)
		if err != nil {
			t.Fatal(err)
		}
		delay := time.Duration(i%2) * time.Minute
		if d := time.Since(row.CreatedAt); d < 0 || d > 5*time.Second {
			t.Errorf("row %d created_at %v is %v from b's now; want b's clock", i, row.CreatedAt, d)
		}
		if got := row.VisibleAfter.Sub(row.CreatedAt); got != delay {
			t.Errorf("row %d visible %v after creation, want its delay %v", i, got, delay)
		}
	}
	if forwarded == 0 {
		t.Fatal("no row was forwarded to b")
	}
}

// R = 1 → 2 on a live cluster with a backlog: every row ends on 2 nodes.
func TestRaiseFactor(t *testing.T) {
	c := newTCluster(t, 32, 1, "a", "b", "c")
	waitSynced(t, c)
	ctx := context.Background()
	const n = 2000
	if _, err := c.nodes["a"].repl.Route(ctx, rowsFor("rf", n, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	c.factor = 2
	c.apply()
	waitSynced(t, c)
	for i := range n {
		if h := c.holders(fmt.Sprintf("rf-%d", i)); len(h) != 2 {
			t.Fatalf("row rf-%d held by %v after R = 2", i, h)
		}
	}
}

// A one-node cluster (not seeded) works with one copy and says it is
// under-replicated.
func TestOneNodeCluster(t *testing.T) {
	c := &tcluster{t: t, shards: 8, factor: 2, nodes: map[string]*tnode{}, limits: transferLimits()}
	c.opts = func(cfg *replication.Config) { cfg.Seeded = false }
	c.add("solo")
	c.apply()
	t.Cleanup(c.close)
	out, err := c.nodes["solo"].repl.Route(context.Background(), rowsFor("o", 10, time.Now().UTC()))
	if err != nil {
		t.Fatal(err)
	}
	if out[0].Copies != 1 {
		t.Fatalf("copies %d, want 1", out[0].Copies)
	}
	st := c.nodes["solo"].repl.Status()
	if !st.UnderReplicated || st.WriteCopies != 1 || st.Copies != 1 || st.Factor != 2 {
		t.Fatalf("status %+v", st)
	}
	if got := len(c.nodes["solo"].scopeNow()); got != 8 {
		t.Fatalf("scope %d shards, want all 8", got)
	}
}

// Handover: a node that becomes a shard's primary while the old primary
// lives does not claim from it while the old primary still holds claimed
// rows of it (or unshipped settles); once those are settled and shipped,
// it claims, and finds the settled rows done (no second delivery).
func TestHandoverWaitsForTheOldPrimarysClaims(t *testing.T) {
	c := newTCluster(t, 16, 2, "a", "b")
	waitSynced(t, c)
	ctx := context.Background()
	if _, err := c.nodes["a"].repl.Route(ctx, rowsFor("h", 400, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	claimed := map[string][]outbox.Row{}
	busy := map[uint32]bool{} // shards with claimed rows, on a or b
	for _, name := range []string{"a", "b"} {
		claimed[name] = claimAll(t, c.nodes[name])
		for _, r := range claimed[name] {
			busy[r.Shard] = true
		}
	}
	if len(claimed["a"])+len(claimed["b"]) != 400 {
		t.Fatalf("claimed %d+%d rows, want 400", len(claimed["a"]), len(claimed["b"]))
	}
	c.add("c")
	c.apply()
	v := c.view("c")
	var taken []uint32 // c's primary shards: all had claims elsewhere
	for s := range c.shards {
		if v.Sets[s][0] == "c" {
			taken = append(taken, s)
			if !busy[s] {
				t.Fatalf("shard %d holds no claimed row; the test needs rows in every shard", s)
			}
		}
	}
	if len(taken) == 0 {
		t.Fatal("c is primary of no shard")
	}
	// Synced, but a and b still deliver: c keeps them out of its scope.
	wantSyncedButHeldBack(t, c, "c", taken, "the old primaries hold claims of them")
	// The old primaries settle and ship; c takes over and finds them done.
	// Settled as the node's store settles (Settling, commit, Changed): a
	// bare Complete then Changed leaves the window Settling fences, and a
	// handover round falling in it released a shard early (1 of 40 runs
	// under load).
	for name, rows := range claimed {
		settle(t, c.nodes[name], rows)
	}
	poll.Eventually(t, 10*time.Second, "c claims from its shards", func() (bool, string) {
		sc := c.nodes["c"].scopeNow()
		return slices.Equal(sc, taken), fmt.Sprintf("scope %v, want %v", sc, taken)
	})
	if again := claimAll(t, c.nodes["c"]); len(again) != 0 {
		t.Fatalf("the new primary claimed %d rows its old primary had delivered (e.g. %s)", len(again), again[0].DispatchKey)
	}
	if metric(t, c.nodes["c"], "fairshard_replication_handover_wait_seconds") != float64(len(taken)) {
		t.Error("handover waits not observed")
	}
}

// A backup that accepts connections and never answers (a partitioned
// host: calls wait out their timeout) does not hold up the state changes
// shipped to the other backups.
func TestShippingIsNotHeldUpByAHangingBackup(t *testing.T) {
	c := newTCluster(t, 8, 3)
	// A call to the hanging c lasts a minute: a wave of settles held up by
	// it could not reach b within the 10 s each wave is given below.
	c.opts = func(cfg *replication.Config) { cfg.ShipTimeout, cfg.CallTimeout = time.Minute, time.Minute }
	for _, n := range []string{"a", "b", "c"} {
		c.add(n)
	}
	c.apply()
	waitSynced(t, c)
	ctx := context.Background()
	if _, err := c.nodes["a"].repl.Route(ctx, rowsFor("h", 200, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	// c's address now leads to a listener that never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var held []net.Conn
	var heldMu sync.Mutex
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			heldMu.Lock()
			held = append(held, conn)
			heldMu.Unlock()
		}
	}()
	t.Cleanup(func() {
		heldMu.Lock()
		defer heldMu.Unlock()
		for _, conn := range held {
			_ = conn.Close()
		}
	})
	v := *c.view("a")
	v.Version++
	v.Addrs = maps.Clone(v.Addrs)
	v.Addrs["c"] = ln.Addr().String()
	c.nodes["a"].repl.Apply(&v)
	// Settle in waves, each after the previous reached b: with one batch
	// per round for every backup, each wave would wait for c's timeout.
	a := c.nodes["a"]
	rows := claimAll(t, a)
	if len(rows) == 0 {
		t.Fatal("a claimed nothing")
	}
	start := time.Now()
	for w := 0; w < 3 && len(rows) > 0; w++ {
		wave := rows[:min(len(rows), 20)]
		rows = rows[len(wave):]
		settle(t, a, wave)
		poll.Eventually(t, 10*time.Second, "wave settled on b", func() (bool, string) {
			for _, r := range wave {
				row, err := c.nodes["b"].store.Get(ctx, r.DispatchKey)
				if err != nil || row.Status != outbox.StatusDone {
					return false, fmt.Sprintf("%s on b: %v %v", r.DispatchKey, row.Status, err)
				}
			}
			return true, ""
		})
	}
	t.Logf("three waves of settles reached b in %v beside a backup that never answers", time.Since(start).Round(time.Millisecond))
}

// Handover across views that differ: c joins and applies the new view,
// where it is primary of some shards, while a and b still apply the old
// one (two nodes joining at once give such short-lived views). Nothing is
// claimed anywhere, yet c keeps those shards out of its scope until a and
// b name it their primary: until then either could claim a row of them
// after answering "nothing claimed".
func TestHandoverWaitsUntilEveryViewNamesTheNewPrimary(t *testing.T) {
	c := newTCluster(t, 16, 2, "a", "b")
	waitSynced(t, c)
	ctx := context.Background()
	if _, err := c.nodes["a"].repl.Route(ctx, rowsFor("v", 200, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	c.add("c")
	all := []string{"a", "b", "c"}
	c.applyTo(all, []string{"c"})
	v := c.view("c")
	var taken []uint32
	for s := range c.shards {
		if v.Sets[s][0] == "c" {
			taken = append(taken, s)
		}
	}
	if len(taken) == 0 {
		t.Fatal("c is primary of no shard")
	}
	wantSyncedButHeldBack(t, c, "c", taken, "a and b still see another primary of them")
	c.applyTo(all, []string{"a", "b"})
	poll.Eventually(t, 10*time.Second, "c claims from its shards once every view names it", func() (bool, string) {
		sc := c.nodes["c"].scopeNow()
		return slices.Equal(sc, taken), fmt.Sprintf("scope %v, want %v", sc, taken)
	})
}

// TestSettlingShardIsUnshipped: between a settle's commit (the row no
// longer claimed) and its Changed call (the change queued) a new
// primary's handover check must not see the shard as quiet: Settling
// marks it, and States reports it Unshipped until the mark is released
// after Changed.
func TestSettlingShardIsUnshipped(t *testing.T) {
	c := newTCluster(t, 16, 2, "a", "b")
	waitSynced(t, c)
	ctx := context.Background()
	a := c.nodes["a"].repl
	key := "settling-row"
	shard := shards.ShardOf(key, c.shards)
	unshipped := func() bool {
		rep, err := a.States(ctx, []uint32{shard})
		if err != nil {
			t.Fatal(err)
		}
		if len(rep.States) != 1 {
			t.Fatalf("States of shard %d: %+v", shard, rep)
		}
		return rep.States[0].Unshipped
	}
	if unshipped() {
		t.Fatalf("shard %d unshipped before anything changed", shard)
	}
	done := a.Settling(key)
	if !unshipped() {
		t.Fatalf("shard %d not reported unshipped while a settle of %q is being committed", shard, key)
	}
	done()
	if unshipped() {
		t.Fatalf("shard %d still unshipped after the settle's mark was released (nothing was queued)", shard)
	}
}

// TestRejoinedNodeIsNotASyncSource: a and b are cut apart (each applies a
// view of itself alone) and b settles every row meanwhile; a's copies stay
// pending. When both see the cluster again and c joins, a counts as a
// synced copy only after it synced again, and answers no States as synced
// while its view is alone. So c, a new replica, copies the union of what
// a and b hold, and at the moment it is synced it holds every row settled
// (a chaos run: a new primary copied an isolated node's stale copy, its
// handover found nothing unsettled, and it delivered a row a second time).
func TestRejoinedNodeIsNotASyncSource(t *testing.T) {
	c := newTCluster(t, 8, 2, "a", "b")
	waitSynced(t, c)
	ctx := context.Background()
	rows := rowsFor("iso", 60, time.Now().UTC())
	if _, err := c.nodes["a"].repl.Route(ctx, rows); err != nil {
		t.Fatal(err)
	}
	c.applyTo([]string{"a"}, []string{"a"})
	c.applyTo([]string{"b"}, []string{"b"})
	b := c.nodes["b"]
	// b takes a's shards once its failover grace ends.
	var settled []outbox.Row
	poll.Eventually(t, 10*time.Second, "b, alone, settles every row", func() (bool, string) {
		got := claimAll(t, b)
		settle(t, b, got)
		settled = append(settled, got...)
		return len(settled) == len(rows), fmt.Sprintf("settled %d of %d", len(settled), len(rows))
	})
	rep, err := c.nodes["a"].repl.States(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range rep.States {
		if st.Synced {
			t.Fatalf("a, alone after it had a peer, answers shard %d as synced: its copy may be stale", st.Shard)
		}
	}

	c.add("c")
	c.applyTo([]string{"a", "b", "c"}, []string{"a", "b", "c"})
	v := c.view("c")
	seen := map[uint32]bool{}
	deadline := time.Now().Add(20 * time.Second)
	for len(seen) < int(c.shards) {
		if time.Now().After(deadline) {
			t.Fatalf("c synced %d of %d shards in 20 s", len(seen), c.shards)
		}
		for s := range c.shards {
			if seen[s] || !slices.Contains(v.Sets[s], "c") {
				seen[s] = true
				continue
			}
			if !c.nodes["c"].repl.Synced(s) {
				continue
			}
			seen[s] = true
			for _, row := range rows {
				if shards.ShardOf(row.DispatchKey, c.shards) != s {
					continue
				}
				got, err := c.nodes["c"].store.Get(ctx, row.DispatchKey)
				if err != nil || got.Status != outbox.StatusDone {
					t.Fatalf("c synced shard %d (set %v) holding row %s as %s (%v); want done: the copy of a node back from being alone was taken as synced",
						s, v.Sets[s], row.DispatchKey, got.Status, err)
				}
			}
		}
		time.Sleep(time.Millisecond)
	}
}

// wantSyncedButHeldBack waits until name has synced every shard of taken,
// then requires that for 500 ms it claims from none of them and reports
// them all waiting for a handover (why: what still holds them back).
func wantSyncedButHeldBack(t *testing.T, c *tcluster, name string, taken []uint32, why string) {
	t.Helper()
	n := c.nodes[name]
	poll.Eventually(t, 10*time.Second, name+" synced", func() (bool, string) {
		for _, s := range taken {
			if !n.repl.Synced(s) {
				return false, fmt.Sprintf("shard %d not synced", s)
			}
		}
		return true, ""
	})
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		if sc := n.scopeNow(); len(sc) != 0 {
			t.Fatalf("%s claims from %v while %s", name, sc, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := n.repl.Status().HandoverShards; got != len(taken) {
		t.Fatalf("%s reports %d shards waiting for a handover, want %d", name, got, len(taken))
	}
}

// TestDroppedQueueIsUnshippedUntilRepaired: a backup's change queue
// dropped over MaxPending leaves changes that no queue holds. Until the
// repair poll finds the backup's copy equal to ours, States must report
// those shards Unshipped: a new primary's handover check that read them
// as quiet could deliver again rows whose settles never reached it (a
// window DECISIONS.md named open until this test).
func TestDroppedQueueIsUnshippedUntilRepaired(t *testing.T) {
	c, touched := droppedQueue(t, 8, 80, 0)
	ctx := context.Background()
	a := c.nodes["a"]
	asked := make([]uint32, 0, len(touched))
	for s := range touched {
		asked = append(asked, s)
	}
	slices.Sort(asked)
	unshipped := func() []uint32 {
		rep, err := a.repl.States(ctx, asked)
		if err != nil {
			t.Fatal(err)
		}
		var out []uint32
		for _, st := range rep.States {
			if st.Unshipped {
				out = append(out, st.Shard)
			}
		}
		return out
	}
	if got := unshipped(); !slices.Equal(got, asked) {
		t.Fatalf("after b's queue was dropped, a reports shards %v unshipped, want every settled shard %v", got, asked)
	}
	// b comes back: the poll repairs its copies, then the marks go.
	c.add("b")
	c.apply()
	poll.Eventually(t, 30*time.Second, "the lost marks cleared once b's copies equal a's", func() (bool, string) {
		got := unshipped()
		return len(got) == 0, fmt.Sprintf("unshipped %v", got)
	})
	for _, s := range asked {
		da, err := a.store.ShardDigest(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		db, err := c.nodes["b"].store.ShardDigest(ctx, s)
		if err != nil {
			t.Fatal(err)
		}
		if da != db {
			t.Fatalf("shard %d: a's digest %+v, b's %+v: a mark cleared before b's copy was repaired", s, da, db)
		}
	}
}

// TestHandoverPullsWhatALeftoverSettled: at R = 1, b joins and becomes
// the primary of some shards, and syncs them from a while a's view still
// names a their primary. a settles every row meanwhile (under its old
// view: a set of one, so no change is queued for anyone), then applies
// the new view. b's handover finds a claiming nothing, shipping nothing
// and naming b the primary, but a's copy is a leftover: b must pull the
// settles from it before it claims, or it delivers those rows again (a
// window DECISIONS.md named open). a's own hand-off of its leftover
// copies is refused, so only the handover can bring the settles.
func TestHandoverPullsWhatALeftoverSettled(t *testing.T) {
	c := newTCluster(t, 8, 1, "a")
	ctx := context.Background()
	a := c.nodes["a"]
	if _, err := a.repl.Route(ctx, rowsFor("left", 80, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	b := c.add("b")
	b.refuseMerges.Store(true)
	c.applyTo([]string{"a", "b"}, []string{"b"})
	var bPrimary []uint32
	for s := range c.shards {
		if c.view("b").Sets[s][0] == "b" {
			bPrimary = append(bPrimary, s)
		}
	}
	if len(bPrimary) == 0 {
		t.Fatal("b is the primary of no shard: the test proves nothing")
	}
	poll.Eventually(t, 20*time.Second, "b synced its shards from a", func() (bool, string) {
		st := b.repl.Status()
		return st.SyncingShards == 0 && st.ReplicaShards == len(bPrimary), fmt.Sprint(st)
	})
	touched := settle(t, a, claimAll(t, a))
	if !slices.ContainsFunc(bPrimary, func(s uint32) bool { return touched[s] }) {
		t.Fatal("a settled no row of b's shards: the test proves nothing")
	}
	c.applyTo([]string{"a", "b"}, []string{"a"})
	poll.Eventually(t, 20*time.Second, "b's handover released its shards", func() (bool, string) {
		b.scopeMu.Lock()
		defer b.scopeMu.Unlock()
		return slices.Equal(b.scope, bPrimary), fmt.Sprintf("scope %v, primary of %v", b.scope, bPrimary)
	})
	if again := claimAll(t, b); len(again) > 0 {
		t.Fatalf("b claimed %d rows a had settled before the handover (first %q): they would be delivered twice", len(again), again[0].DispatchKey)
	}
}

// TestLostMarkGoesWithTheBackupsCopy: a lost mark (a dropped change
// queue) for a backup that then leaves the shard's set must stop counting
// as unshipped: that backup drops its copy, so its digest never equals
// ours again, and a mark that counted would hold every later handover of
// the shard until the handover timeout (found in review). The mark waits
// for the member's return to the set.
func TestLostMarkGoesWithTheBackupsCopy(t *testing.T) {
	c, touched := droppedQueue(t, 16, 160, time.Minute)
	ctx := context.Background()
	a := c.nodes["a"]
	c.add("b")
	c.add("x")
	c.apply()
	v := c.view("a")
	var left []uint32
	for s := range touched {
		if slices.Contains(v.Sets[s], "a") && !slices.Contains(v.Sets[s], "b") {
			left = append(left, s)
		}
	}
	slices.Sort(left)
	if len(left) == 0 {
		t.Fatal("b left the set of no shard a settled rows of: the test proves nothing")
	}
	poll.Eventually(t, 20*time.Second, "a's marks for shards b left gone and every handover done, well inside the 1-minute timeout", func() (bool, string) {
		rep, err := a.repl.States(ctx, left)
		if err != nil {
			return false, err.Error()
		}
		var stuck []uint32
		for _, st := range rep.States {
			if st.Unshipped {
				stuck = append(stuck, st.Shard)
			}
		}
		waiting := 0
		for _, n := range []string{"a", "b", "x"} {
			waiting += c.nodes[n].repl.Status().HandoverShards
		}
		return len(stuck) == 0 && waiting == 0, fmt.Sprintf("a reports %v of %v unshipped; %d shards wait for a handover", stuck, left, waiting)
	})
}

// TestHandoverPullFailureEndsWithTheTimeout: a leftover holder that
// answers States but whose key list fails keeps the pull failing; the
// shard is still released once the handover timeout has passed (the
// documented bound), not held forever (found in review).
func TestHandoverPullFailureEndsWithTheTimeout(t *testing.T) {
	const timeout = 2 * time.Second
	c := newTCluster(t, 8, 1)
	c.opts = func(cfg *replication.Config) { cfg.HandoverTimeout = timeout }
	c.add("a")
	c.apply()
	ctx := context.Background()
	a := c.nodes["a"]
	if _, err := a.repl.Route(ctx, rowsFor("fail", 80, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	b := c.add("b")
	b.refuseMerges.Store(true)
	start := time.Now() // b's handover wait begins with this view
	c.applyTo([]string{"a", "b"}, []string{"b"})
	var bPrimary []uint32
	for s := range c.shards {
		if c.view("b").Sets[s][0] == "b" {
			bPrimary = append(bPrimary, s)
		}
	}
	poll.Eventually(t, 20*time.Second, "b synced its shards from a", func() (bool, string) {
		st := b.repl.Status()
		return st.SyncingShards == 0 && st.ReplicaShards == len(bPrimary), fmt.Sprint(st)
	})
	settle(t, a, claimAll(t, a))
	a.refuseKeys.Store(true) // every pull from a's leftover copy fails
	c.applyTo([]string{"a", "b"}, []string{"a"})
	poll.Eventually(t, 20*time.Second, "b's handover released by the timeout", func() (bool, string) {
		b.scopeMu.Lock()
		defer b.scopeMu.Unlock()
		return slices.Equal(b.scope, bPrimary), fmt.Sprintf("scope %v, primary of %v", b.scope, bPrimary)
	})
	if took := time.Since(start); took < timeout {
		t.Fatalf("released after %v, before the %v timeout, although every pull failed", took, timeout)
	}
}

// settle completes rows claimed on n the way the node does (Settling
// before the store call, Changed after it) and returns their shards.
func settle(t *testing.T, n *tnode, rows []outbox.Row) map[uint32]bool {
	t.Helper()
	touched := map[uint32]bool{}
	for _, row := range rows {
		done := n.repl.Settling(row.DispatchKey)
		if err := n.store.Complete(context.Background(), outbox.CompleteParams{DispatchKey: row.DispatchKey, Claim: row.Version}); err != nil {
			t.Fatal(err)
		}
		n.repl.Changed(row.DispatchKey)
		done()
		touched[row.Shard] = true
	}
	return touched
}

// TestChangesForAMemberGoneAreUnshippedUntilRepaired: a settle queued for
// a backup that then leaves the view (a partition, or declared dead) is
// dropped with its queue. When the backup is back in the shard's set, the
// primary reports the shard Unshipped and repairs it at once, not after a
// busy shard's digests happened to match twice (chaos seed 689830977: a
// backup back from a split kept a stale copy for 36 s, then became the
// only copy, and a delivered row went out again).
func TestChangesForAMemberGoneAreUnshippedUntilRepaired(t *testing.T) {
	const S = 64
	c := newTCluster(t, S, 2)
	// Polls only on membership changes: the streak-gated repair (two
	// polls in a row) cannot happen within the test, the mark's can.
	c.opts = func(cfg *replication.Config) { cfg.PollInterval = time.Hour }
	for _, n := range []string{"a", "b", "c"} {
		c.add(n)
	}
	c.apply()
	waitSynced(t, c)
	ctx := context.Background()
	a, b := c.nodes["a"], c.nodes["b"]
	var shard uint32 = S
	for s := range uint32(S) {
		if set := c.view("a").Sets[s]; set[0] == "a" && set[1] == "b" {
			shard = s
			break
		}
	}
	if shard == S {
		t.Fatal("no shard with a primary and b backup: the test proves nothing")
	}
	var key string
	for i := 0; ; i++ {
		if key = fmt.Sprintf("gone-%d", i); shards.ShardOf(key, S) == shard {
			break
		}
	}
	now := time.Now().UTC()
	if _, err := a.repl.Route(ctx, []outbox.Row{{DispatchKey: key, Namespace: "ns", TaskQueue: "q", CreatedAt: now, VisibleAfter: now}}); err != nil {
		t.Fatal(err)
	}
	b.refuseMerges.Store(true) // b takes no shipped change, no hand-off, no repair push
	var x []outbox.Row
	for _, r := range claimAll(t, a) {
		if r.DispatchKey == key {
			x = append(x, r)
		}
	}
	settle(t, a, x)
	// b is gone from a's view: its queue is dropped. (c keeps its view:
	// it syncs nothing, so no leftover copy of c's brings b the settle.)
	c.applyTo([]string{"a", "c"}, []string{"a"})
	c.apply() // b is back
	unshipped := func() bool {
		rep, err := a.repl.States(ctx, []uint32{shard})
		if err != nil {
			t.Fatal(err)
		}
		return len(rep.States) == 1 && rep.States[0].Unshipped
	}
	if got, err := b.store.Get(ctx, key); err != nil || got.Status != outbox.StatusPending {
		t.Fatalf("b's copy %s %v: want it still pending (the test proves nothing otherwise)", got.Status, err)
	}
	if !unshipped() {
		t.Fatalf("shard %d: a reports nothing unshipped while b, back in its set, lacks a's settle of %s", shard, key)
	}
	// Keep the shard busy (an append every 10 ms), so two polls never
	// see the same digests: only the mark's repair can fix b in time.
	busy, stopBusy := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(busy)
		for i := 0; ; i++ {
			select {
			case <-stopBusy:
				return
			case <-time.After(10 * time.Millisecond):
			}
			k := key
			for j := 0; ; j++ {
				if k = fmt.Sprintf("busy-%d-%d", i, j); shards.ShardOf(k, S) == shard {
					break
				}
			}
			now := time.Now().UTC()
			_, _ = a.repl.Route(ctx, []outbox.Row{{DispatchKey: k, Namespace: "ns", TaskQueue: "q", CreatedAt: now, VisibleAfter: now}})
		}
	}()
	defer func() { close(stopBusy); <-busy }()
	b.refuseMerges.Store(false)
	c.apply() // one more membership change: one more poll
	poll.Eventually(t, 10*time.Second, "b's copy repaired and the mark gone", func() (bool, string) {
		got, err := b.store.Get(ctx, key)
		return err == nil && got.Status == outbox.StatusDone && !unshipped(), fmt.Sprintf("b's copy %s (%v), unshipped %v", got.Status, err, unshipped())
	})
}

// droppedQueue starts a and b (R = 2, shardCount shards, MaxPending 5,
// handoverTimeout when not 0), routes rows through a, then kills b, whose
// view a keeps, and settles on a every row it claims, so a's change queue
// for b passes MaxPending and is dropped. It returns the cluster and the
// shards a settled rows of.
func droppedQueue(t *testing.T, shardCount uint32, rows int, handoverTimeout time.Duration) (*tcluster, map[uint32]bool) {
	t.Helper()
	c := newTCluster(t, shardCount, 2)
	c.opts = func(cfg *replication.Config) {
		cfg.MaxPending = 5
		if handoverTimeout > 0 {
			cfg.HandoverTimeout = handoverTimeout
		}
	}
	c.startSynced("a", "b")
	a := c.nodes["a"]
	if _, err := a.repl.Route(context.Background(), rowsFor("lost", rows, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	c.kill("b", false)
	settled := claimAll(t, a)
	if len(settled) <= 5 {
		t.Fatalf("a claimed %d rows, want more than MaxPending (5) to overflow b's queue", len(settled))
	}
	touched := settle(t, a, settled)
	if metric(t, a, "fairshard_replication_ship_dropped_total") == 0 {
		t.Fatal("b's queue was not dropped: the test proves nothing")
	}
	return c, touched
}

// A member declared dead by mistake (a peer cut off for a moment suspected
// it) is still claiming from its shards. The members that take its shards
// over keep them out of their claim scope for FailoverGrace, and its
// refute (the view with it again) hands the shards back before anyone
// claimed them twice. Without the grace the first handover round, with
// nobody left to ask, released them at once.
func TestFailoverWaitsForARefute(t *testing.T) {
	c := newTCluster(t, 16, 2)
	c.opts = func(cfg *replication.Config) { cfg.FailoverGrace = time.Hour }
	c.startSynced("a", "b", "c")
	before := map[string][]uint32{"b": c.nodes["b"].scopeNow(), "c": c.nodes["c"].scopeNow()}
	prev := c.view("b")
	// b and c see a fail; a, alive, keeps its view and its shards.
	c.applyTo([]string{"b", "c"}, []string{"b", "c"})
	v := c.view("b")
	taken := map[string][]uint32{}
	for s := range c.shards {
		if prev.Sets[s][0] == "a" {
			taken[v.Sets[s][0]] = append(taken[v.Sets[s][0]], s)
		}
	}
	for _, name := range []string{"b", "c"} {
		n := c.nodes[name]
		poll.Eventually(t, 10*time.Second, name+" synced for the shards it took", func() (bool, string) {
			for _, s := range taken[name] {
				if !n.repl.Synced(s) {
					return false, fmt.Sprintf("shard %d not synced", s)
				}
			}
			return true, ""
		})
	}
	deadline := time.Now().Add(500 * time.Millisecond)
	for time.Now().Before(deadline) {
		for _, name := range []string{"b", "c"} {
			for _, s := range taken[name] {
				if slices.Contains(c.nodes[name].scopeNow(), s) {
					t.Fatalf("%s claims from shard %d of a, declared dead, before its grace ended", name, s)
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	if got := c.nodes["b"].repl.Status().HandoverShards + c.nodes["c"].repl.Status().HandoverShards; got != len(taken["b"])+len(taken["c"]) {
		t.Fatalf("%d shards wait for a handover, want the %d taken from a", got, len(taken["b"])+len(taken["c"]))
	}
	// a refutes: b and c see it again and give its shards back.
	c.applyTo([]string{"a", "b", "c"}, []string{"b", "c"})
	for _, name := range []string{"b", "c"} {
		n := c.nodes[name]
		waitScope(t, n, before[name])
		if got := n.repl.Status().HandoverShards; got != 0 {
			t.Fatalf("%s still waits for %d handovers after a returned", name, got)
		}
	}
}

// waitScope waits until n's claim scope is want.
func waitScope(t *testing.T, n *tnode, want []uint32) {
	t.Helper()
	poll.Eventually(t, 10*time.Second, n.name+"'s claim scope", func() (bool, string) {
		sc := n.scopeNow()
		return slices.Equal(sc, want), fmt.Sprintf("scope %v, want %v", sc, want)
	})
}
