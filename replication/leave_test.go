package replication_test

import (
	"context"
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
