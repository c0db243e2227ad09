package boltstore

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/outbox"
)

func TestTombstoneRetention(t *testing.T) {
	s, b := newTestStore(t, func(o *Options) {
		o.TombstoneRetention = time.Hour
		o.DeadLetterRetention = 3 * time.Hour
	})
	t0 := b.clock.Now()
	var rows []outbox.Row
	for i := range 2500 {
		rows = append(rows, row(fmt.Sprintf("d%04d", i), "ns", "q"))
	}
	mustAppend(t, s, rows...)
	mustAppend(t, s, row("f", "ns", "q"), row("live", "ns", "q"))
	for _, r := range rows {
		must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: r.DispatchKey, Claim: claimOf(t, s, r.DispatchKey), Now: t0}))
	}
	must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: "f", Claim: claimOf(t, s, "f"), Now: t0}))

	b.clock.Advance(time.Hour) // exactly at the end of retention: still kept
	if n, err := s.ExpireTombstones(ctx); err != nil || n != 0 {
		t.Fatalf("expired %d %v at the boundary", n, err)
	}
	if got := mustAppend(t, s, row("d0000", "ns", "q")); got[0] != outbox.AppendDuplicate {
		t.Fatal("late duplicate inside retention was not reported duplicate")
	}
	b.clock.Advance(time.Second)
	n, err := s.ExpireTombstones(ctx) // 2500 rows: three bounded transactions
	if err != nil || n != 2500 {
		t.Fatalf("expired %d %v, want 2500", n, err)
	}
	if got := mustAppend(t, s, row("d0000", "ns", "q")); got[0] != outbox.AppendCreated {
		t.Fatal("append after retention ended was not created")
	}
	if _, err := s.Get(ctx, "f"); err != nil {
		t.Fatalf("dead letter expired with the tombstones: %v", err)
	}
	b.clock.Advance(2 * time.Hour)
	if n, err := s.ExpireTombstones(ctx); err != nil || n != 1 {
		t.Fatalf("dead letter expiry: %d %v", n, err)
	}
	if _, err := s.Get(ctx, "live"); err != nil {
		t.Fatalf("live row expired: %v", err)
	}
}

func TestRunTombstoneGCStopsWithContext(t *testing.T) {
	s, b := newTestStore(t, func(o *Options) { o.TombstoneRetention = time.Minute })
	mustAppend(t, s, row("a", "ns", "q"))
	must(t, s.Complete(ctx, outbox.CompleteParams{DispatchKey: "a", Claim: claimOf(t, s, "a"), Now: b.clock.Now()}))
	b.clock.Advance(time.Hour)
	c, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- s.RunTombstoneGC(c, 10*time.Millisecond) }()
	poll.Eventually(t, 5*time.Second, "the tombstone GC to drop row a", func() (bool, string) {
		_, err := s.Get(ctx, "a")
		return errors.Is(err, outbox.ErrNotFound), ""
	})
	cancel()
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("RunTombstoneGC did not stop with its context")
	}
}

func TestDeadLettersAndRedrive(t *testing.T) {
	s, b := newTestStore(t)
	now := b.clock.Now()
	for i := range 7 {
		k := fmt.Sprintf("k%d", i)
		mustAppend(t, s, row(k, "ns", "q"))
		must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: k, Claim: claimOf(t, s, k), LastError: "boom", Now: now}))
	}
	mustAppend(t, s, row("other", "ns2", "q"), row("alive", "ns", "q"))
	must(t, s.Fail(ctx, outbox.FailParams{DispatchKey: "other", Claim: claimOf(t, s, "other"), Now: now}))

	var pages [][]string
	after := ""
	for {
		page, err := s.ListDeadLetters(ctx, "ns", after, 3)
		must(t, err)
		if len(page) == 0 {
			break
		}
		pages = append(pages, keysOfRows(page))
		after = page[len(page)-1].DispatchKey
	}
	want := [][]string{{"k0", "k1", "k2"}, {"k3", "k4", "k5"}, {"k6"}}
	if !reflect.DeepEqual(pages, want) {
		t.Fatalf("pages %v, want %v", pages, want)
	}
	n, err := s.Redrive(ctx, "ns", []string{"k1", "alive", "other", "missing"}, now.Add(time.Minute))
	if err != nil || n != 1 {
		t.Fatalf("redrive keys: %d %v, want 1", n, err)
	}
	r := mustGet(t, s, "k1")
	if r.Status != outbox.StatusPending || r.Attempt != 1 || r.LastError != "" || !r.FinishedAt.IsZero() || !r.VisibleAfter.Equal(now.Add(time.Minute)) {
		t.Fatalf("redriven row %+v", r)
	}
	if n, err := s.Redrive(ctx, "ns", nil, now); err != nil || n != 6 {
		t.Fatalf("redrive all: %d %v, want 6", n, err)
	}
	if page, _ := s.ListDeadLetters(ctx, "ns", "", 10); len(page) != 0 {
		t.Fatalf("dead letters left: %v", keysOfRows(page))
	}
	if page, _ := s.ListDeadLetters(ctx, "ns2", "", 10); len(page) != 1 {
		t.Fatal("redrive of ns touched ns2")
	}
	st, err := s.NamespaceStats(ctx)
	must(t, err)
	if got := st["ns"]; got.Pending != 8 || got.Failed != 0 || !got.OldestPending.Equal(now) {
		t.Fatalf("ns stats %+v", got)
	}
	if got := st["ns2"]; got.Failed != 1 || got.Pending != 0 || !got.OldestPending.IsZero() {
		t.Fatalf("ns2 stats %+v", got)
	}
}

func TestConfigEntries(t *testing.T) {
	s, b := newTestStore(t)
	must(t, s.SaveConfigEntry(ctx, "quota/ns", []byte(`{"v":1}`)))
	must(t, s.SaveConfigEntry(ctx, "pause/wf", []byte{}))
	must(t, s.SaveConfigEntry(ctx, "quota/ns", []byte(`{"v":2}`)))
	must(t, s.SaveConfigEntry(ctx, "gone", []byte("x")))
	must(t, s.DeleteConfigEntry(ctx, "gone"))
	must(t, s.DeleteConfigEntry(ctx, "never"))
	if err := s.SaveConfigEntry(ctx, "", []byte("x")); err == nil {
		t.Fatal("empty config key accepted")
	}
	s = reopen(t, s, b)
	got, err := s.LoadConfigEntries(ctx)
	must(t, err)
	want := map[string][]byte{"quota/ns": []byte(`{"v":2}`), "pause/wf": {}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("config %q, want %q", got, want)
	}
}
