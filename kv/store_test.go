package kv

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/fairshard/fairshard/internal/poll"
	"github.com/fairshard/fairshard/internal/testclock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// clock is the settable time source of kv tests.
type clock = testclock.Clock

func newClock() *clock { return testclock.New(time.UnixMilli(1_700_000_000_000)) }

// memPersister is a node's durable copy as a Persister sees it, with a
// switch to make it fail: the fault a real store cannot show on demand.
type memPersister struct {
	mu      sync.Mutex
	entries map[string]Entry
	fail    error
	calls   int
}

func newMemPersister() *memPersister { return &memPersister{entries: map[string]Entry{}} }

func (p *memPersister) Save(_ context.Context, e Entry) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.fail != nil {
		return p.fail
	}
	if cur, ok := p.entries[e.Key]; ok && cur.Version.Compare(e.Version) > 0 {
		return fmt.Errorf("persist of key %q went backwards: stored %s, got %s", e.Key, cur.Version, e.Version)
	}
	p.entries[e.Key] = e
	return nil
}

func (p *memPersister) Forget(_ context.Context, key string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	if p.fail != nil {
		return p.fail
	}
	delete(p.entries, key)
	return nil
}

func (p *memPersister) setFail(err error) {
	p.mu.Lock()
	p.fail = err
	p.mu.Unlock()
}

func (p *memPersister) get(key string) (Entry, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	e, ok := p.entries[key]
	return e, ok
}

func (p *memPersister) all() []Entry {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Entry, 0, len(p.entries))
	for _, e := range p.entries {
		out = append(out, e)
	}
	return out
}

type fixture struct {
	s   *Store
	p   *memPersister
	clk *clock
	reg *prometheus.Registry

	bmu        sync.Mutex
	broadcasts []Entry // decoded Broadcast messages
}

func newFixture(t *testing.T, edit func(*Config)) *fixture {
	t.Helper()
	f := &fixture{p: newMemPersister(), clk: newClock(), reg: prometheus.NewPedanticRegistry()}
	cfg := Config{Node: "node-1", Persister: f.p, Now: f.clk.Now, Registerer: f.reg,
		PersistRetryMin: time.Millisecond, PersistRetryMax: 20 * time.Millisecond,
		Broadcast: func(_ string, msg []byte) {
			d, err := decode(msg)
			if err != nil || len(d.entries) != 1 {
				panic(fmt.Sprintf("Broadcast handed a bad message: %v", err))
			}
			f.bmu.Lock()
			f.broadcasts = append(f.broadcasts, d.entries[0])
			f.bmu.Unlock()
		}}
	if edit != nil {
		edit(&cfg)
	}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	f.s = s
	return f
}

// run starts the store's loops until the test ends.
func (f *fixture) run(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = f.s.RunPersist(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

func TestWritesValidationAndLocalPersistFailure(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	for name, kv := range map[string]struct {
		k string
		v []byte
	}{
		"empty key":     {"", []byte("1")},
		"long key":      {strings.Repeat("k", MaxKeyBytes+1), nil},
		"invalid utf-8": {"\xff", nil},
		"big value":     {"k", make([]byte, MaxValueBytes+1)},
	} {
		if _, err := f.s.Put(ctx, kv.k, kv.v); !errors.Is(err, ErrInvalidEntry) {
			t.Errorf("%s: Put = %v, want ErrInvalidEntry", name, err)
		}
	}
	f.p.setFail(errors.New("disk full"))
	if _, err := f.s.Put(ctx, "k", []byte("v")); err == nil || !strings.Contains(err.Error(), "disk full") {
		t.Fatalf("Put with a failing Persister = %v", err)
	}
	if _, ok := f.s.Get("k"); ok || len(f.s.All()) != 0 {
		t.Fatal("a write whose persistence failed was applied")
	}
	if got := testutil.ToFloat64(f.s.m.updates.WithLabelValues("local")); got != 0 {
		t.Fatalf("local updates = %v after a failed write", got)
	}
	f.p.setFail(nil)
	e, err := f.s.Put(ctx, "k", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := f.s.Get("k"); !ok || string(got.Value) != "v" || got.Version != e.Version {
		t.Fatalf("Get = %+v, %v", got, ok)
	}
	if p, ok := f.p.get("k"); !ok || p.Version != e.Version {
		t.Fatalf("persisted %+v, %v", p, ok)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := f.s.Put(cancelled, "k2", nil); !errors.Is(err, context.Canceled) {
		t.Fatalf("Put with a cancelled ctx = %v", err)
	}
	d, err := f.s.Delete(ctx, "k")
	if err != nil || !d.Deleted || d.DeletedAt != int64(d.Version.Clock) || d.DeletedAt < f.clk.Now().UnixMilli() || len(d.Value) != 0 {
		t.Fatalf("Delete = %+v, %v", d, err)
	}
	if _, ok := f.s.Get("k"); ok {
		t.Fatal("deleted key still served")
	}
	if p, _ := f.p.get("k"); !p.Deleted {
		t.Fatalf("tombstone not persisted: %+v", p)
	}
}

func TestUpdateAppliesWhatWasPersisted(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	es, err := f.s.Update(ctx, Write{Key: "a", Value: []byte("1")}, Write{Key: "b", Value: []byte("2")})
	if err != nil || len(es) != 2 || es[0].Version.Compare(es[1].Version) >= 0 {
		t.Fatalf("Update = %+v, %v (want two entries in version order)", es, err)
	}
	// Fail the second write of a batch: the first is durable, so it is
	// applied; the second is not.
	p := &failAfter{Persister: f.p, n: 1}
	f.s.cfg.Persister = p
	_, err = f.s.Update(ctx, Write{Key: "a", Value: []byte("3")}, Write{Key: "b", Value: []byte("4")})
	if err == nil || !strings.Contains(err.Error(), "1 of 2 writes applied") {
		t.Fatalf("Update with a failing second save = %v", err)
	}
	if a, _ := f.s.Get("a"); string(a.Value) != "3" {
		t.Fatalf("a = %q, want the persisted 3", a.Value)
	}
	if b, _ := f.s.Get("b"); string(b.Value) != "2" {
		t.Fatalf("b = %q, want the old 2", b.Value)
	}
}

type failAfter struct {
	Persister
	n int
}

func (p *failAfter) Save(ctx context.Context, e Entry) error {
	if p.n == 0 {
		return errors.New("disk full")
	}
	p.n--
	return p.Persister.Save(ctx, e)
}

// TestFailedRemotePersistIsRetriedUntilDurable: a gossiped entry whose
// persistence fails is retried (the same version arriving again is not a
// change and would never bring it back), so a node restarted alone still
// has it.
func TestFailedRemotePersistIsRetriedUntilDurable(t *testing.T) {
	f := newFixture(t, nil)
	f.run(t)
	paused := Entry{Key: "ns/acme/paused", Value: []byte("true"), Version: Version{uint64(f.clk.Now().UnixMilli()), "peer"}}
	f.p.setFail(errors.New("disk full"))
	if err := f.s.MergeMessage(encodeEntryMsg(paused)); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.s.Get(paused.Key); !ok {
		t.Fatal("a remote entry is served from memory while its persistence fails")
	}
	poll.Eventually(t, 5*time.Second, "persist failures not retried and counted", func() (bool, string) { return testutil.ToFloat64(f.s.m.persistErrors) >= 3, "" })
	if f.s.Stats().PersistPending != 1 {
		t.Fatalf("pending = %d, want 1", f.s.Stats().PersistPending)
	}
	// The same version arrives again (push/pull): no change, but the retry
	// is still on.
	_ = f.s.MergeRemoteState(encodeState("peer", []Entry{paused}, 0))
	f.p.setFail(nil)
	poll.Eventually(t, 5*time.Second, "the entry was never persisted after the disk recovered", func() (bool, string) { p, ok := f.p.get(paused.Key); return ok && p.Version == paused.Version, "" })
	poll.Eventually(t, 5*time.Second, "still pending", func() (bool, string) { return f.s.Stats().PersistPending == 0, "" })

	// A node restarted from what was persisted serves the pause.
	s2, err := New(Config{Node: "node-1", Initial: f.p.all(), Now: f.clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if e, ok := s2.Get(paused.Key); !ok || string(e.Value) != "true" {
		t.Fatalf("restarted store: %+v %v", e, ok)
	}
}

func TestRemoteChangesPersistLatestVersionAndWatchCoalesces(t *testing.T) {
	f := newFixture(t, nil)
	f.run(t)
	w := f.s.Watch("t", "ns/")
	defer w.Close()
	now := f.clk.Now().UnixMilli()
	_ = f.s.MergeMessage(encodeEntryMsg(Entry{Key: "ns/a", Value: []byte("1"), Version: Version{uint64(now), "peer"}}))
	_ = f.s.MergeRemoteState(encodeState("peer", []Entry{
		{Key: "ns/a", Value: []byte("2"), Version: Version{uint64(now + 2), "peer"}},
		{Key: "other", Value: []byte("x"), Version: Version{uint64(now), "peer"}},
	}, 0))
	if err := f.s.MergeMessage([]byte{msgEntry, WireVersion, 0xff}); err == nil {
		t.Fatal("garbage accepted")
	}
	poll.Eventually(t, 5*time.Second, "remote entries not persisted", func() (bool, string) {
		a, _ := f.p.get("ns/a")
		o, _ := f.p.get("other")
		return string(a.Value) == "2" && string(o.Value) == "x", ""
	})
	<-w.C()
	if ch := w.Changes(); len(ch) != 1 || string(ch[0].Value) != "2" {
		t.Fatalf("watch coalesces per key: got %+v", ch)
	}
	if got := testutil.ToFloat64(f.s.m.dropped.WithLabelValues("decode")); got != 1 {
		t.Fatalf("dropped{decode} = %v", got)
	}
	if st := f.s.Stats(); st.LastStateFrom != "peer" {
		t.Fatalf("stats %+v: want the last state from peer", st)
	}
}

func TestCaps(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxEntries = 3; c.MaxBytes = 1 << 20 })
	ctx := context.Background()
	for i := range 3 {
		if _, err := f.s.Put(ctx, fmt.Sprintf("hold/%d", i), []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	_, err := f.s.Put(ctx, "hold/3", []byte("{}"))
	var le *LimitError
	if !errors.Is(err, ErrLimit) || !errors.As(err, &le) || le.Limit != "entries" || le.Max != 3 || le.Have != 3 || le.Want != 4 {
		t.Fatalf("Put past MaxEntries = %v (%+v)", err, le)
	}
	if _, ok := f.s.Get("hold/3"); ok {
		t.Fatal("refused write applied")
	}
	if _, ok := f.p.get("hold/3"); ok {
		t.Fatal("refused write persisted")
	}
	// Overwriting and deleting stay possible at the cap.
	if _, err := f.s.Put(ctx, "hold/0", []byte(`{"x":1}`)); err != nil {
		t.Fatalf("overwrite at the cap: %v", err)
	}
	if _, err := f.s.Delete(ctx, "hold/1"); err != nil {
		t.Fatalf("delete at the cap: %v", err)
	}
	if _, err := f.s.Put(ctx, "hold/3", []byte("{}")); err != nil {
		t.Fatalf("put after a delete made room: %v", err)
	}
	if got := testutil.ToFloat64(f.s.m.refusedW.WithLabelValues("entries")); got != 1 {
		t.Fatalf("refused{entries} = %v", got)
	}

	g := newFixture(t, func(c *Config) { c.MaxBytes = 2000 })
	big := make([]byte, MaxValueBytes)
	if _, err := g.s.Put(ctx, "target/a", big); err != nil {
		t.Fatal(err)
	}
	_, err = g.s.Put(ctx, "target/b", big)
	if !errors.As(err, &le) || le.Limit != "bytes" || le.Max != 2000 {
		t.Fatalf("Put past MaxBytes = %v", err)
	}
	if !strings.Contains(err.Error(), "the cap is 2000") {
		t.Fatalf("error does not name the cap: %v", err)
	}
	// A batch is checked as a whole.
	_, err = g.s.Update(ctx, Write{Key: "target/a", Delete: true}, Write{Key: "target/b", Value: big})
	if err != nil {
		t.Fatalf("a batch that frees what it takes: %v", err)
	}
	// Remote entries are always taken in: replicas must converge.
	_ = g.s.MergeMessage(encodeEntryMsg(Entry{Key: "target/c", Value: big, Version: Version{1 << 50, "peer"}}))
	if _, ok := g.s.Get("target/c"); !ok {
		t.Fatal("a remote entry past the cap was dropped")
	}
}

// tombstone writes a delete of key on node "peer" at the fixture's now.
func (f *fixture) remoteDelete(key string) Entry {
	now := f.clk.Now().UnixMilli()
	return Entry{Key: key, Deleted: true, DeletedAt: now, Version: Version{uint64(now), "peer"}}
}

func TestTombstonesAreCollectedOnceEveryMemberHasSeenThem(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.TombstoneMinAge = time.Minute; c.TombstoneTTL = time.Hour })
	f.run(t)
	ctx := context.Background()
	f.s.SetMembers([]string{"node-1", "node-2", "node-3"})
	if _, err := f.s.Put(ctx, "hold/wf", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	old, _ := f.s.Get("hold/wf")
	del, err := f.s.Delete(ctx, "hold/wf")
	if err != nil {
		t.Fatal(err)
	}
	collect := func() map[string]int { return f.s.Collect() }

	// node-2 has seen it, node-3 still holds the old value.
	f.clk.Advance(2 * time.Minute)
	_ = f.s.MergeRemoteState(encodeState("node-2", []Entry{del}, 0))
	_ = f.s.MergeRemoteState(encodeState("node-3", []Entry{old}, 0))
	if got := collect(); len(got) != 0 || f.s.Stats().Tombstones != 1 {
		t.Fatalf("collected %v while node-3 holds an older copy", got)
	}
	// node-3 catches up; its report must come MinAge after we took the
	// tombstone in (it does: 2 min), and node-2's already counts.
	_ = f.s.MergeRemoteState(encodeState("node-3", []Entry{del}, 0))
	if got := collect(); got["acked"] != 1 {
		t.Fatalf("collected %v, want the tombstone acked by all", got)
	}
	if st := f.s.Stats(); st.Tombstones != 0 || len(f.s.All()) != 0 {
		t.Fatalf("state after collection: %+v %+v", st, f.s.All())
	}
	poll.Eventually(t, 5*time.Second, "collected tombstone not forgotten by the Persister", func() (bool, string) { _, ok := f.p.get("hold/wf"); return !ok, "" })

	// A peer that has not collected it yet sends it back: refused (the
	// ghost), or it would bounce between replicas for ever.
	_ = f.s.MergeRemoteState(encodeState("node-2", []Entry{del}, 0))
	if st := f.s.Stats(); st.Tombstones != 0 || st.Ghosts != 1 {
		t.Fatalf("tombstone sent back: %+v, want refused by its ghost", st)
	}
	// A peer back from a long absence with the old value: refused too, and
	// the delete is broadcast again for it.
	f.broadcasts = nil
	_ = f.s.MergeRemoteState(encodeState("node-3", []Entry{old}, 0))
	if _, ok := f.s.Get(old.Key); ok {
		t.Fatal("a stale value of a collected key came back")
	}
	if len(f.broadcasts) != 1 || f.broadcasts[0].Key != del.Key || !f.broadcasts[0].Deleted || f.broadcasts[0].Version != del.Version {
		t.Fatalf("broadcast %+v, want the delete again", f.broadcasts)
	}
	// A newer write of the key is taken in and ends the ghost.
	if _, err := f.s.Put(ctx, "hold/wf", []byte("{}")); err != nil {
		t.Fatal(err)
	}
	if st := f.s.Stats(); st.Live != 1 || st.Ghosts != 0 {
		t.Fatalf("after a new write: %+v", st)
	}
	_, _ = f.s.Delete(ctx, "hold/wf")
	f.clk.Advance(2 * time.Minute)
	_ = f.s.MergeRemoteState(encodeState("node-2", nil, 0))
	_ = f.s.MergeRemoteState(encodeState("node-3", nil, 0))
	if got := collect(); got["acked"] != 1 {
		t.Fatalf("collected %v, want the second delete acked", got)
	}
	// Ghosts end with the TTL.
	f.clk.Advance(time.Hour)
	collect()
	if st := f.s.Stats(); st.Ghosts != 0 {
		t.Fatalf("ghosts after the TTL: %d", st.Ghosts)
	}
	if got := testutil.ToFloat64(f.s.m.collected.WithLabelValues("acked")); got != 2 {
		t.Fatalf("collected{acked} = %v", got)
	}
}

func TestTombstoneWaitsForReportsMinAgeAfterItArrived(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.TombstoneMinAge = time.Minute; c.TombstoneTTL = time.Hour })
	f.s.SetMembers([]string{"node-1", "node-2"})
	del := f.remoteDelete("hold/wf")
	_ = f.s.MergeMessage(encodeEntryMsg(del))
	// node-2's report without the key comes too early to count: gossip
	// may not have reached it, it might just not have the key yet.
	f.clk.Advance(10 * time.Second)
	_ = f.s.MergeRemoteState(encodeState("node-2", nil, 0))
	f.clk.Advance(2 * time.Minute)
	if got := f.s.Collect(); len(got) != 0 {
		t.Fatalf("collected %v on a report sent before MinAge", got)
	}
	_ = f.s.MergeRemoteState(encodeState("node-2", nil, 0))
	if got := f.s.Collect(); got["acked"] != 1 {
		t.Fatalf("collected %v, want acked", got)
	}
}

func TestDepartedMemberBlocksCollectionUntilTTL(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.TombstoneMinAge = time.Minute; c.TombstoneTTL = time.Hour })
	f.s.SetMembers([]string{"node-1", "node-2", "node-3"})
	f.clk.Advance(48 * time.Hour)                // membership stable for long: still remembered once it changes
	f.s.SetMembers([]string{"node-1", "node-2"}) // node-3 goes away (crash, rolling restart)
	del := f.remoteDelete("hold/wf")
	_ = f.s.MergeMessage(encodeEntryMsg(del))
	f.clk.Advance(5 * time.Minute)
	_ = f.s.MergeRemoteState(encodeState("node-2", []Entry{del}, 0))
	if got := f.s.Collect(); len(got) != 0 {
		t.Fatalf("collected %v while node-3, away for 5 minutes, may hold an older copy", got)
	}
	if !slices.Contains(f.s.Members(), "node-3") {
		t.Fatalf("members %v forgot node-3", f.s.Members())
	}
	// node-3 comes back with the key and sees the delete: collected.
	f.s.SetMembers([]string{"node-1", "node-2", "node-3"})
	_ = f.s.MergeRemoteState(encodeState("node-3", []Entry{del}, 0))
	if got := f.s.Collect(); got["acked"] != 1 {
		t.Fatalf("collected %v after node-3 saw it", got)
	}

	// Another delete while node-3 is away for good: the time bound.
	f.s.SetMembers([]string{"node-1", "node-2"})
	del2 := f.remoteDelete("hold/wf2")
	_ = f.s.MergeMessage(encodeEntryMsg(del2))
	f.clk.Advance(59 * time.Minute)
	_ = f.s.MergeRemoteState(encodeState("node-2", []Entry{del2}, 0))
	if got := f.s.Collect(); len(got) != 0 {
		t.Fatalf("collected %v before the TTL", got)
	}
	f.clk.Advance(time.Minute)
	if got := f.s.Collect(); got["ttl"] != 1 {
		t.Fatalf("collected %v, want ttl", got)
	}
	if slices.Contains(f.s.Members(), "node-3") {
		t.Fatal("node-3, away for the TTL, is still a member to wait for")
	}
	// A tombstone older than the TTL arriving late is not taken in.
	_ = f.s.MergeRemoteState(encodeState("node-2", []Entry{del2}, 0))
	if f.s.Stats().Tombstones != 0 {
		t.Fatal("an expired tombstone was taken in")
	}
}

func TestTombstoneCapCollectsOldestFirst(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.MaxTombstones = 10; c.TombstoneTTL = time.Hour })
	f.s.SetMembers([]string{"node-1", "node-2"}) // node-2 never reports: no acks
	ctx := context.Background()
	for i := range 25 {
		if _, err := f.s.Delete(ctx, fmt.Sprintf("hold/%02d", i)); err != nil {
			t.Fatal(err)
		}
		f.clk.Advance(time.Second)
	}
	if got := f.s.Collect(); got["cap"] != 15 {
		t.Fatalf("collected %v, want 15 by the cap", got)
	}
	var left []string
	for _, e := range f.s.All() {
		left = append(left, e.Key)
	}
	if len(left) != 10 || left[0] != "hold/15" {
		t.Fatalf("left %v, want the 10 newest", left)
	}
}

func TestInitialEntries(t *testing.T) {
	clk := newClock()
	p := newMemPersister()
	now := clk.Now().UnixMilli()
	initial := []Entry{
		{Key: "a", Value: []byte("1"), Version: Version{5, "n0"}},
		{Key: "old", Deleted: true, Version: Version{3, "n0"}},                                                   // older format: no date
		{Key: "expired", Deleted: true, DeletedAt: now - 25*time.Hour.Milliseconds(), Version: Version{4, "n0"}}, // past the TTL
	}
	for _, e := range initial {
		_ = p.Save(context.Background(), e)
	}
	s, err := New(Config{Node: "n1", Initial: initial, Persister: p, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	all := s.All()
	if len(all) != 2 || all[0].Key != "a" || all[1].Key != "old" || all[1].DeletedAt != now {
		t.Fatalf("loaded %+v: want a and old (dated now), not the expired tombstone", all)
	}
	if s.PersistPending(context.Background()) != 0 {
		t.Fatal("persist failed")
	}
	if _, ok := p.get("expired"); ok {
		t.Fatal("the expired tombstone is still persisted")
	}
	if e, _ := s.Put(context.Background(), "a", nil); e.Version.Clock <= 5 {
		t.Fatalf("a write after loading clock 5 got %s", e.Version)
	}
	for _, bad := range []Entry{{Key: "k"}, {Key: "", Version: Version{1, "n"}}} {
		if _, err := New(Config{Node: "n", Initial: []Entry{bad}}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("Initial %+v: New = %v", bad, err)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	for name, cfg := range map[string]Config{
		"no node":          {},
		"long node":        {Node: strings.Repeat("n", MaxNodeBytes+1)},
		"negative cap":     {Node: "n", MaxEntries: -1},
		"ttl below minage": {Node: "n", TombstoneMinAge: time.Hour, TombstoneTTL: time.Minute},
		"retry max < min":  {Node: "n", PersistRetryMin: time.Second, PersistRetryMax: time.Millisecond},
	} {
		if _, err := New(cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: New = %v, want ErrInvalidConfig", name, err)
		}
	}
}

func TestMetricsAndClose(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	_, _ = f.s.Put(ctx, "a", []byte("1"))
	_, _ = f.s.Put(ctx, "b", []byte("1"))
	_, _ = f.s.Delete(ctx, "b")
	st := f.s.Stats()
	want := fmt.Sprintf(`
# HELP fairshard_cluster_config_entries Live (not deleted) entries of the gossiped cluster config.
# TYPE fairshard_cluster_config_entries gauge
fairshard_cluster_config_entries 1
# HELP fairshard_cluster_config_state_bytes Encoded size of this node's full cluster config state, as a push/pull sends it; memberlist refuses more than 20 MiB.
# TYPE fairshard_cluster_config_state_bytes gauge
fairshard_cluster_config_state_bytes %d
# HELP fairshard_cluster_config_tombstones Tombstones (deleted entries not yet collected) of the gossiped cluster config.
# TYPE fairshard_cluster_config_tombstones gauge
fairshard_cluster_config_tombstones 1
# HELP fairshard_cluster_config_updates_total Accepted cluster config changes by source: local writes or remote (gossip, push/pull).
# TYPE fairshard_cluster_config_updates_total counter
fairshard_cluster_config_updates_total{source="local"} 3
fairshard_cluster_config_updates_total{source="remote"} 0
`, st.StateBytes)
	if err := testutil.GatherAndCompare(f.reg, strings.NewReader(want), "fairshard_cluster_config_entries",
		"fairshard_cluster_config_state_bytes", "fairshard_cluster_config_tombstones", "fairshard_cluster_config_updates_total"); err != nil {
		t.Fatal(err)
	}
	if problems, err := testutil.GatherAndLint(f.reg); err != nil || len(problems) > 0 {
		t.Fatalf("lint: %v %v", problems, err)
	}
	if len(f.s.LocalState()) != st.StateBytes {
		t.Fatal("StateBytes is not the size LocalState sends")
	}
	// A second store on the registry is an error, not a panic.
	if _, err := New(Config{Node: "x", Registerer: f.reg}); err == nil {
		t.Fatal("two stores registered on one registry")
	}
	w := f.s.Watch("w", "")
	f.s.Close()
	f.s.Close()
	if _, ok := <-w.C(); ok {
		t.Fatal("watch open after Close")
	}
	if _, err := f.s.Put(ctx, "c", nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("Put after Close = %v", err)
	}
	if n, _ := testutil.GatherAndCount(f.reg); n != 0 {
		t.Fatalf("%d series left after Close", n)
	}
	if w2 := f.s.Watch("late", ""); w2 != nil {
		if _, ok := <-w2.C(); ok {
			t.Fatal("watch made after Close is open")
		}
	}
}
