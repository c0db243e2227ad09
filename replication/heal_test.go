package replication_test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/replication"
	"github.com/fairshard/fairshard/shards"
)

// healCluster starts a, b and c (R = 2, 64 shards) whose repair polls run
// only on membership changes, so the streak-gated repair (a disagreement
// seen by two polls in a row) cannot reach b within a test: only what a
// ships, or compares at once, can. It routes 400 rows through every node
// and returns the cluster.
func healCluster(t *testing.T) *tcluster {
	t.Helper()
	c := newTCluster(t, 64, 2)
	c.opts = func(cfg *replication.Config) { cfg.PollInterval = time.Hour }
	for _, n := range []string{"a", "b", "c"} {
		c.add(n)
	}
	c.apply()
	waitSynced(t, c)
	if _, err := c.nodes["a"].repl.Route(context.Background(), rowsFor("heal", 400, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	return c
}

// doneOnB waits until b's copy of every row of settled is done, for the
// rows of shards b replicates with a in the final view.
func doneOnB(t *testing.T, c *tcluster, settled []outbox.Row) {
	t.Helper()
	ctx := context.Background()
	v := c.view("a")
	var want []string
	for _, r := range settled {
		if set := v.Sets[r.Shard]; slices.Contains(set, "a") && slices.Contains(set, "b") {
			want = append(want, r.DispatchKey)
		}
	}
	if len(want) < 20 {
		t.Fatalf("only %d settled rows on shards a and b share: the test proves little", len(want))
	}
	b := c.nodes["b"]
	poll.Eventually(t, 15*time.Second, "a's settles on b", func() (bool, string) {
		stale := 0
		for _, k := range want {
			if got, err := b.store.Get(ctx, k); err != nil || got.Status != outbox.StatusDone {
				stale++
			}
		}
		return stale == 0, fmt.Sprintf("%d of %d rows still not done on b", stale, len(want))
	})
}

// TestSettlesQueuedForABackupThatLeftShipWhenItIsBack: a settles rows
// while b refuses what a ships (a partition before memberlist declares b
// dead), then b leaves a's view and comes back (the partition heals). The
// queue a held for b is kept while b is gone and ships when it is back.
// Before, it was dropped and only its lost marks were left, repaired four
// shards per poll: a soak delivered 176 rows a second time after a heal,
// when the node that had settled them was killed 20 s later and b's stale
// copies were all that was left.
func TestSettlesQueuedForABackupThatLeftShipWhenItIsBack(t *testing.T) {
	c := healCluster(t)
	a, b := c.nodes["a"], c.nodes["b"]
	b.refuseMerges.Store(true)
	settled := claimAll(t, a)
	settle(t, a, settled)
	c.applyTo([]string{"a", "c"}, []string{"a"}) // b declared dead by a
	b.refuseMerges.Store(false)
	c.apply() // the partition heals
	doneOnB(t, c, settled)
}

// TestSettlesMadeWhileABackupWasGoneReachItWhenItIsBack: a settles rows
// after b left its view (a's settles of those shards went to c, the
// stand-in backup). When b is back in their sets, a compares its copies
// with b's at once (a lost mark per shard they share) and repairs every
// one that differs, not four shards a poll.
func TestSettlesMadeWhileABackupWasGoneReachItWhenItIsBack(t *testing.T) {
	c := healCluster(t)
	a := c.nodes["a"]
	c.applyTo([]string{"a", "c"}, []string{"a", "c"}) // b cut off: a and c see each other
	settled := claimAll(t, a)
	settle(t, a, settled)
	c.apply() // the partition heals
	doneOnB(t, c, settled)
}

// TestSettlesMadeWhileABackupWasAwayShipWhenItIsBack: the same, with b
// refusing key lists, so no repair diff with it can succeed (as a busy
// peer's time out under load): only what a ships reaches b. a's queue for
// b takes every change of a's shards while b is away from its view, and
// ships what b's sets need on its return: a settle reaches a backup back
// from a partition without waiting for a repair by digest (a few shards
// per poll), during which a wipe of the node that settled would leave the
// backup's stale copy as the one to deliver.
func TestSettlesMadeWhileABackupWasAwayShipWhenItIsBack(t *testing.T) {
	c := healCluster(t)
	a, b := c.nodes["a"], c.nodes["b"]
	c.applyTo([]string{"a", "c"}, []string{"a", "c"}) // b cut off: a and c see each other
	settled := claimAll(t, a)
	settle(t, a, settled)
	b.refuseKeys.Store(true)
	c.apply() // the partition heals
	doneOnB(t, c, settled)
	if n := metric(t, a, "fairshard_replication_repaired_shards_total"); n != 0 {
		t.Errorf("%v shards repaired by a: b's keys were refused, every settle should have shipped", n)
	}
}

// TestDrainWaitsUntilTheSetHoldsTheRows: a leave completes or does not
// happen. While a member of the sets refuses what the leaving node sends
// (as a node in trouble would), Drain does not return, and LeaveStatus
// says how many shards are left and why; once the member takes rows again
// the drain finishes and every row is held by its set. A Drain cut short
// by its context names a count of shards left, never a negative one.
func TestDrainWaitsUntilTheSetHoldsTheRows(t *testing.T) {
	c := newTCluster(t, 16, 1, "a", "b", "c")
	waitSynced(t, c)
	ctx := context.Background()
	rows := rowsFor("leave", 300, time.Now().UTC())
	if _, err := c.nodes["c"].repl.Route(ctx, rows); err != nil {
		t.Fatal(err)
	}
	a := c.nodes["a"]
	a.refuseMerges.Store(true)
	members := []string{"a", "b"}
	c.applyTo(members, members)
	v := *c.view("a")
	v.Self, v.Leaving = "c", true
	v.Addrs = map[string]string{"a": v.Addrs["a"], "b": v.Addrs["b"], "c": c.nodes["c"].srv.URL[len("http://"):]}
	leaver := c.nodes["c"].repl
	leaver.Apply(&v)

	short, cancel := context.WithTimeout(ctx, time.Second)
	err := leaver.Drain(short)
	cancel()
	if err == nil || strings.Contains(err.Error(), "-") {
		t.Fatalf("Drain while a refuses every row: %v, want an error naming how many shards are left", err)
	}
	st := leaver.Status().Leave
	if st == nil || st.ShardsLeft == 0 || st.LastError == "" {
		t.Fatalf("leave status while a refuses: %+v, want shards left and the reason", st)
	}

	done := make(chan error, 1)
	go func() { done <- leaver.Drain(ctx) }()
	select {
	case err := <-done:
		t.Fatalf("Drain returned (%v) while a still refuses its rows", err)
	case <-time.After(500 * time.Millisecond):
	}
	a.refuseMerges.Store(false)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Drain did not finish after a took rows again")
	}
	for _, r := range rows {
		if h := c.holders(r.DispatchKey); len(h) != 1 || h[0] == "c" {
			t.Fatalf("row %s held by %v after the drain, want its set's member only", r.DispatchKey, h)
		}
	}
}

// TestAShipLostWithItsConnectionIsRetriedSoon: a batch of state changes
// whose call hangs (its connection lost to packet loss, or a peer that
// stopped answering) is given up after ShipTimeout and the queue ships
// again, not after the much longer CallTimeout: a soak delivered 52 rows a
// second time when their primary was killed and wiped 15 s after settling
// them, the settles still held behind a call cut off by packet loss.
func TestAShipLostWithItsConnectionIsRetriedSoon(t *testing.T) {
	c := newTCluster(t, 8, 2)
	c.opts = func(cfg *replication.Config) {
		cfg.PollInterval, cfg.CallTimeout, cfg.ShipTimeout = time.Hour, time.Minute, 200*time.Millisecond
	}
	c.startSynced("a", "b")
	ctx := context.Background()
	a, b := c.nodes["a"], c.nodes["b"]
	if _, err := a.repl.Route(ctx, rowsFor("lost", 50, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	// b's address leads, for one view, to a listener that never answers.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	var held sync.WaitGroup
	conns := make(chan net.Conn, 16)
	held.Go(func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			conns <- conn
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		held.Wait()
		close(conns)
		for conn := range conns {
			_ = conn.Close()
		}
	})
	real := *c.view("a")
	hung := real
	hung.Version++
	hung.Addrs = maps.Clone(real.Addrs)
	hung.Addrs["b"] = ln.Addr().String()
	a.repl.Apply(&hung)
	settled := claimAll(t, a)
	settle(t, a, settled)
	back := hung
	back.Version++
	back.Addrs = real.Addrs
	a.repl.Apply(&back) // the connection is gone; the address works again
	poll.Eventually(t, 10*time.Second, "the settles on b", func() (bool, string) {
		for _, r := range settled {
			if got, err := b.store.Get(ctx, r.DispatchKey); err != nil || got.Status != outbox.StatusDone {
				return false, fmt.Sprintf("%s on b: %s %v", r.DispatchKey, got.Status, err)
			}
		}
		return true, ""
	})
}

// TestSyncFromALeavingNodeOnlyPulls: a node that joins a shard's set while
// no member holds a synced copy syncs from every member holding rows of
// it, the leaving node among them (still a member, in no set). A leaving
// node refuses rows, so a two-way diff with it (pushing what the joiner
// holds and it lacks) failed every time: the shard never counted as
// synced, and the leave, which waits for the set to be synced, never
// finished. A copy outside the set is now only pulled from.
func TestSyncFromALeavingNodeOnlyPulls(t *testing.T) {
	const S = 16
	c := newTCluster(t, S, 1, "a", "b", "c")
	waitSynced(t, c)
	ctx := context.Background()
	without := shards.ReplicaSets([]string{"a", "b"}, S, 1)
	var shard uint32 = S
	for s := range uint32(S) {
		if c.view("a").Sets[s][0] == "c" && without.Replicas(s)[0] == "a" {
			shard = s
			break
		}
	}
	if shard == S {
		t.Fatal("no shard moving from c to a: the test proves nothing")
	}
	rowsOf := func(prefix string, n int) []outbox.Row {
		var rows []outbox.Row
		now := time.Now().UTC()
		for i := 0; len(rows) < n; i++ {
			if k := fmt.Sprintf("%s-%d", prefix, i); shards.ShardOf(k, S) == shard {
				rows = append(rows, outbox.Row{DispatchKey: k, Namespace: "ns", TaskQueue: "q", CreatedAt: now, VisibleAfter: now,
					Status: outbox.StatusPending, Attempt: 1, Version: outbox.FirstVersion})
			}
		}
		return rows
	}
	if _, err := c.nodes["c"].repl.Route(ctx, rowsOf("on-c", 5)); err != nil {
		t.Fatal(err)
	}
	// a holds rows of the shard that c lacks (a copy left from an earlier
	// view), so a's sync from c is a diff, not a bulk copy.
	if _, err := c.nodes["a"].store.Merge(ctx, rowsOf("on-a", 3)); err != nil {
		t.Fatal(err)
	}
	leaver := c.nodes["c"]
	leaver.refuseMerges.Store(true) // a leaving node takes no rows
	// c announces it is leaving: every view still lists it (it serves its
	// copies) and puts it in no set.
	c.version++
	sets := make([][]string, S)
	for s := range uint32(S) {
		sets[s] = without.Replicas(s)
	}
	addrs := map[string]string{}
	for _, n := range []string{"a", "b", "c"} {
		addrs[n] = c.nodes[n].srv.URL[len("http://"):]
	}
	for _, n := range []string{"a", "b", "c"} {
		c.nodes[n].repl.Apply(&replication.View{Version: c.version, Self: n, ShardCount: S, Factor: 1, Sets: sets, Addrs: addrs, Leaving: n == "c"})
	}
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := leaver.repl.Drain(dctx); err != nil {
		t.Fatalf("c's drain: %v (a's sync of shard %d with c never ended: synced %v)", err, shard, c.nodes["a"].repl.Synced(shard))
	}
	for _, r := range rowsOf("on-c", 5) {
		if got, err := c.nodes["a"].store.Get(ctx, r.DispatchKey); err != nil || got.Status != outbox.StatusPending {
			t.Fatalf("%s on a after c's drain: %v %v", r.DispatchKey, got.Status, err)
		}
	}
}

// TestFenceHoldsClaimsUntilAHandover: after Fence (the node's process was
// paused), no shard this node is primary of is in its claim scope until a
// handover round has checked the other members; with nobody delivering,
// the next round gives every one back.
func TestFenceHoldsClaimsUntilAHandover(t *testing.T) {
	c := newTCluster(t, 16, 2)
	// Handover rounds only when woken: the test sees the fenced scope.
	c.opts = func(cfg *replication.Config) { cfg.HandoverInterval = time.Hour }
	c.startSynced("a", "b")
	a := c.nodes["a"]
	before := a.scopeNow()
	if len(before) == 0 {
		t.Fatal("a is primary of no shard: the test proves nothing")
	}
	b := c.nodes["b"]
	b.refuseStates.Store(true) // the handover cannot hear from b yet
	a.repl.Fence()
	if s := a.scopeNow(); len(s) != 0 {
		t.Fatalf("after Fence a's claim scope is %v, want empty until a handover", s)
	}
	time.Sleep(200 * time.Millisecond)
	if s := a.scopeNow(); len(s) != 0 {
		t.Fatalf("a claims from %v before b answered its handover", s)
	}
	b.refuseStates.Store(false)
	a.repl.Apply(c.view("a")) // any view change wakes the handover round
	poll.Eventually(t, 10*time.Second, "a's shards back in its scope after the handover", func() (bool, string) {
		got := a.scopeNow()
		return slices.Equal(got, before), fmt.Sprintf("scope %v, want %v", got, before)
	})
}

// settleAloneThenHeal runs the split of the leftover tests on a
// healCluster: b and c see each other and a sees only itself (it owns
// every shard), b and c sync every shard between them, so b holds copies
// of shards it does not replicate once the split heals; a claims and
// settles every row while alone; then a and c start refusing States
// calls (b's drop loop cannot confirm that the sets hold synced copies,
// so b keeps its leftover copies, as a loaded cluster keeps them for
// seconds) and the split heals. It returns the settled rows and the keys
// of those b holds a leftover copy of the shard of.
func settleAloneThenHeal(t *testing.T, c *tcluster) (settled []outbox.Row, leftover []string) {
	t.Helper()
	ctx := context.Background()
	a, b, cn := c.nodes["a"], c.nodes["b"], c.nodes["c"]
	c.applyTo([]string{"b", "c"}, []string{"b", "c"})
	c.applyTo([]string{"a"}, []string{"a"})
	poll.Eventually(t, 20*time.Second, "b and c synced on every shard", func() (bool, string) {
		for s := range c.shards {
			if !b.repl.Synced(s) || !cn.repl.Synced(s) {
				return false, fmt.Sprintf("shard %d: b synced %v, c synced %v", s, b.repl.Synced(s), cn.repl.Synced(s))
			}
			db, errB := b.store.ShardDigest(ctx, s)
			dc, errC := cn.store.ShardDigest(ctx, s)
			if errB != nil || errC != nil || db != dc {
				return false, fmt.Sprintf("shard %d: b %+v (%v), c %+v (%v)", s, db, errB, dc, errC)
			}
		}
		return true, ""
	})
	settled = claimAll(t, a)
	settle(t, a, settled)
	a.refuseStates.Store(true)
	cn.refuseStates.Store(true)
	c.apply() // the split heals
	v := c.view("a")
	for _, r := range settled {
		if v.Sets[r.Shard] == nil || slices.Contains(v.Sets[r.Shard], "b") {
			continue
		}
		if d, err := b.store.ShardDigest(ctx, r.Shard); err == nil && d.Rows > 0 {
			leftover = append(leftover, r.DispatchKey)
		}
	}
	if len(leftover) < 20 {
		t.Fatalf("only %d settled rows on shards b holds a leftover copy of: the test proves little", len(leftover))
	}
	return settled, leftover
}

// TestSettlesMadeAloneReachALeftoverCopyWhenThePartitionHeals: a split
// cuts a off alone from b and c, and a delivers and settles every row.
// When the split heals, b still holds copies of shards it no longer
// replicates (leftovers), and a leftover copy is the one a new member of
// the set syncs from if the copy that settled is wiped: a chaos soak
// delivered rows a second time that way. a asks b which of those shards
// it holds and ships it their settles too, not only those of the shards b
// replicates.
func TestSettlesMadeAloneReachALeftoverCopyWhenThePartitionHeals(t *testing.T) {
	c := healCluster(t)
	ctx := context.Background()
	b := c.nodes["b"]
	_, want := settleAloneThenHeal(t, c)
	took := poll.Eventually(t, 15*time.Second, "a's settles on b's leftover copies", func() (bool, string) {
		stale := 0
		for _, k := range want {
			if got, err := b.store.Get(ctx, k); err != nil || got.Status != outbox.StatusDone {
				stale++
			}
		}
		return stale == 0, fmt.Sprintf("%d of %d rows still not done on b's leftover copies", stale, len(want))
	})
	t.Logf("%d settles reached b's leftover copies %v after the heal", len(want), took.Round(time.Millisecond))
}

// TestSettlesForALeftoverCopyAreGivenUpAfterBoundedTries: with b refusing
// every merge after the heal, the settles a owes b's leftover copies are
// given up after a bounded number of tries (a leftover copy is no
// replica: nothing waits for it), while those of the shards b replicates
// stay queued for it.
func TestSettlesForALeftoverCopyAreGivenUpAfterBoundedTries(t *testing.T) {
	c := healCluster(t)
	a, b := c.nodes["a"], c.nodes["b"]
	b.refuseMerges.Store(true)
	settled, leftover := settleAloneThenHeal(t, c)
	v := c.view("a")
	owed := 0 // settles of shards b replicates: queued for b until it takes them
	for _, r := range settled {
		if slices.Contains(v.Sets[r.Shard], "b") {
			owed++
		}
	}
	took := poll.Eventually(t, 30*time.Second, "a's changes for b's leftover copies given up", func() (bool, string) {
		n := a.repl.PendingChanges()
		return n == owed, fmt.Sprintf("%d changes pending on a, want the %d of shards b replicates (%d for its leftover copies)", n, owed, len(leftover))
	})
	// The tries' backoff alone (50 ms doubling, 2 s at most, between 8
	// tries) is over 5 s: given up sooner, they were not retried.
	if took < 4*time.Second {
		t.Fatalf("changes for b's leftover copies given up %v after the heal: not retried", took)
	}
	t.Logf("changes for b's leftover copies given up %v after the heal", took.Round(time.Millisecond))
}

// TestSettlesReachALeftoverCopyLeftByAJoin: rows are appended while a and
// b hold every shard; c joins, and the shards whose set becomes [a, c]
// stay on b as leftover copies (c refuses States calls, so b's drop loop
// cannot confirm that the new set is synced, as a loaded cluster keeps
// them for seconds). a, still their primary, delivers and settles the
// rows through the replicated store. b stays in the view, in no set of
// those shards: a leftover copy still pending is what a wiped primary
// syncs from when its real backup is cut off, and it delivers the row a
// second time. b's copies must take the settles.
func TestSettlesReachALeftoverCopyLeftByAJoin(t *testing.T) {
	const S = 64
	c := newTCluster(t, S, 2)
	// Repair polls only on membership changes: only what a ships to b can
	// reach b's leftover copies within the test.
	c.opts = func(cfg *replication.Config) { cfg.PollInterval = time.Hour }
	c.startSynced("a", "b")
	ctx := context.Background()
	a, b := c.nodes["a"], c.nodes["b"]
	before := c.view("a")
	after := shards.ReplicaSets([]string{"a", "b", "c"}, S, 2)
	moved := map[uint32]bool{} // a primary before and after, b out of the set
	for s := range uint32(S) {
		set := after.Replicas(s)
		if before.Sets[s][0] == "a" && set[0] == "a" && !slices.Contains(set, "b") {
			moved[s] = true
		}
	}
	var want []string
	for _, r := range rowsFor("join", 400, time.Time{}) {
		if moved[shards.ShardOf(r.DispatchKey, S)] {
			want = append(want, r.DispatchKey)
		}
	}
	if len(want) < 20 {
		t.Fatalf("only %d rows on shards moving from [a b] to [a c]: the test proves little", len(want))
	}
	if _, err := a.repl.Route(ctx, rowsFor("join", 400, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	cn := c.add("c")
	cn.refuseStates.Store(true) // b keeps its leftover copies
	c.apply()
	for _, k := range want {
		if got, err := b.store.Get(ctx, k); err != nil || got.Status != outbox.StatusPending {
			t.Fatalf("%s on b after c joined: %v %v, want a pending leftover copy", k, got.Status, err)
		}
	}
	store := replication.NewStore(a.store, a.repl)
	claimed, err := store.Claim(ctx, outbox.ClaimParams{Limit: 100000, Now: time.Now().UTC().Add(time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	settled := 0
	for _, row := range claimed {
		if err := store.Complete(ctx, outbox.CompleteParams{DispatchKey: row.DispatchKey, Claim: row.Version}); err != nil {
			t.Fatal(err)
		}
		if moved[row.Shard] {
			settled++
		}
	}
	if settled != len(want) {
		t.Fatalf("a delivered %d rows of the moved shards, want all %d", settled, len(want))
	}
	took := poll.Eventually(t, 15*time.Second, "a's settles on b's leftover copies", func() (bool, string) {
		stale, gone := 0, 0
		for _, k := range want {
			got, err := b.store.Get(ctx, k)
			switch {
			case err != nil:
				gone++
			case got.Status != outbox.StatusDone:
				stale++
			}
		}
		return stale+gone == 0, fmt.Sprintf("%d of %d rows still pending on b's leftover copies (%d dropped there unsettled)", stale, len(want), gone)
	})
	t.Logf("%d settles reached b's leftover copies %v after they were made", len(want), took.Round(time.Millisecond))
}
