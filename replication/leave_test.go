package replication_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/replication"
)

// recordedLog keeps the messages logged through it.
type recordedLog struct {
	mu   sync.Mutex
	msgs []string
}

func (l *recordedLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *recordedLog) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.msgs = append(l.msgs, r.Message)
	return nil
}
func (l *recordedLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *recordedLog) WithGroup(string) slog.Handler      { return l }

func (l *recordedLog) saw(prefix string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.msgs {
		if strings.HasPrefix(m, prefix) {
			return true
		}
	}
	return false
}

// A node that turns leaving while it syncs takes no more rows: the pages
// of a copy it asked for before the leave are not merged, so a leave
// never has more to hand off the longer it runs.
func TestANodeThatTurnsLeavingMidSyncTakesNoMoreRows(t *testing.T) {
	c := newTCluster(t, 32, 2, "a", "b")
	waitSynced(t, c)
	ctx := context.Background()
	if _, err := c.nodes["a"].repl.Route(ctx, rowsFor("sync", 3000, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	hold := make(chan struct{})
	for _, n := range []string{"a", "b"} {
		c.nodes[n].holdReads.Store(&hold)
	}
	log := &recordedLog{}
	c.opts = func(cfg *replication.Config) { cfg.Logger = slog.New(log) }
	newcomer := c.add("c")
	c.opts = nil
	c.apply()
	poll.Eventually(t, 10*time.Second, "c's bulk copy asks a or b for pages", func() (bool, string) {
		return c.nodes["a"].heldReads.Load()+c.nodes["b"].heldReads.Load() > 0, "no read yet"
	})

	// c leaves while its reads are held: the others' view has no c.
	c.leave("c", []string{"a", "b"})
	close(hold)

	poll.Eventually(t, 10*time.Second, "c's sync round ends", func() (bool, string) {
		return log.saw("bulk shard sync incomplete"), "no end of the bulk copy logged yet"
	})
	ds, err := newcomer.store.ShardDigests(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := int64(0)
	for _, d := range ds {
		held += d.Rows
	}
	if held != 0 {
		t.Fatalf("c holds %d rows it pulled after it turned leaving, want 0", held)
	}
	dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := newcomer.repl.Drain(dctx); err != nil {
		t.Fatalf("Drain: %v", err)
	}
}

// A drain reports its progress batch by batch (rows handed off), and its
// shards left while it runs, not only when a pass ends.
func TestDrainCountsRowsHandedOff(t *testing.T) {
	c := newTCluster(t, 16, 1, "a", "b", "c")
	waitSynced(t, c)
	ctx := context.Background()
	rows := rowsFor("handed", 400, time.Now().UTC())
	if _, err := c.nodes["c"].repl.Route(ctx, rows); err != nil {
		t.Fatal(err)
	}
	var onC int64
	ds, _ := c.nodes["c"].store.ShardDigests(ctx)
	for _, d := range ds {
		onC += d.Rows
	}
	if onC == 0 {
		t.Fatal("c holds no rows to hand off")
	}
	leaver := c.leave("c", []string{"a", "b"})
	dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := leaver.Drain(dctx); err != nil {
		t.Fatal(err)
	}
	st := leaver.Status().Leave
	if st == nil || st.RowsHandedOff != onC || st.ShardsLeft != 0 {
		t.Fatalf("leave status after the drain: %+v, want %d rows handed off and no shard left", st, onC)
	}
}

// rowsHeld sums the rows (pending and terminal) n's store holds.
func rowsHeld(t *testing.T, n *tnode) int64 {
	t.Helper()
	ds, err := n.store.ShardDigests(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, d := range ds {
		sum += d.Rows
	}
	return sum
}

// aloneLeaving applies on name a leaving view in which no other member is
// live (every set empty), its only peer having failed at failedAt.
func (c *tcluster) aloneLeaving(name string, failedAt time.Time) {
	c.version++
	c.nodes[name].repl.Apply(&replication.View{
		Version: c.version, Self: name, ShardCount: c.shards, Factor: c.factor,
		Sets:    make([][]string, c.shards),
		Addrs:   map[string]string{name: strings.TrimPrefix(c.nodes[name].srv.URL, "http://")},
		Leaving: true, PeerFailedAt: failedAt,
	})
}

// twoWithRowsOnB starts a and b (R = 1, FailedPeerWait 10 min), routes
// 300 rows through a and returns the cluster and how many rows b holds
// (> 0).
func twoWithRowsOnB(t *testing.T) (*tcluster, int64) {
	t.Helper()
	c := newTCluster(t, 16, 1)
	c.opts = func(cfg *replication.Config) { cfg.FailedPeerWait = 10 * time.Minute }
	c.startSynced("a", "b")
	if _, err := c.nodes["a"].repl.Route(context.Background(), rowsFor("failed", 300, time.Now().UTC())); err != nil {
		t.Fatal(err)
	}
	onB := rowsHeld(t, c.nodes["b"])
	if onB == 0 {
		t.Fatal("b holds none of the 300 rows")
	}
	return c, onB
}

// A leaving node that sees no other member because its only peer was
// declared dead a moment ago (on a loaded host, a stalled peer is) does
// not stop as the last node with its rows on disk: it waits for the peer
// to return, says why in its leave status, and hands every row off when
// it does. Without the wait, Drain returned at once with the rows here.
func TestDrainWaitsForAFailedPeerToReturn(t *testing.T) {
	c, onB := twoWithRowsOnB(t)
	ctx := context.Background()
	c.aloneLeaving("b", time.Now())
	b := c.nodes["b"].repl
	dctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	drained := make(chan error, 1)
	go func() { drained <- b.Drain(dctx) }()
	poll.Eventually(t, 10*time.Second, "b's leave to say it waits for the failed member", func() (bool, string) {
		select {
		case err := <-drained:
			t.Fatalf("Drain returned (%v) with %d rows on b while its peer had just failed", err, rowsHeld(t, c.nodes["b"]))
		default:
		}
		st := b.Status().Leave
		return st != nil && strings.Contains(st.Waiting, "failed"), fmt.Sprintf("leave status %+v", st)
	})
	c.leave("b", []string{"a"}) // a returns
	if err := <-drained; err != nil {
		t.Fatalf("%v; a: %+v; b: %+v %+v", err, c.nodes["a"].repl.Status(), b.Status(), b.Status().Leave)
	}
	if n := rowsHeld(t, c.nodes["b"]); n != 0 {
		t.Errorf("b holds %d rows after its drain", n)
	}
	if n := rowsHeld(t, c.nodes["a"]); n != 300 {
		t.Errorf("a holds %d of the 300 rows after b's drain", n)
	}
	if st := b.Status().Leave; st == nil || st.Waiting != "" || st.RowsHandedOff != onB {
		t.Errorf("leave status after the drain: %+v, want no wait and %d rows handed off", st, onB)
	}
}

// Once FailedPeerWait has passed since the peer failed, a leaving node
// with no one to hand off to is the last node: Drain returns and the rows
// stay on its disk (they move when it returns).
func TestDrainStopsAsTheLastNodeOnceTheFailedPeerWaitEnds(t *testing.T) {
	c, onB := twoWithRowsOnB(t)
	ctx := context.Background()
	c.kill("a", false)
	c.aloneLeaving("b", time.Now().Add(-10*time.Minute-time.Second))
	dctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := c.nodes["b"].repl.Drain(dctx); err != nil {
		t.Fatal(err)
	}
	if n := rowsHeld(t, c.nodes["b"]); n != onB {
		t.Errorf("b holds %d rows after stopping as the last node, want its %d", n, onB)
	}
}
