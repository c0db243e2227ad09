package kv

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"pgregory.net/rapid"
)

func entryGen() *rapid.Generator[Entry] {
	return rapid.Custom(func(t *rapid.T) Entry {
		e := Entry{
			Key:     rapid.SampledFrom([]string{"a", "b", "ns/x", "ns/y"}).Draw(t, "key"),
			Deleted: rapid.Bool().Draw(t, "deleted"),
			Version: Version{
				Clock: rapid.Uint64Range(1, 4).Draw(t, "clock"),
				Node:  rapid.SampledFrom([]string{"n1", "n2", "n3"}).Draw(t, "node"),
			},
		}
		if e.Deleted {
			e.DeletedAt = rapid.Int64Range(1, 3).Draw(t, "deleted_at")
		} else {
			e.Value = []byte(rapid.SampledFrom([]string{"", "1", "2", `{"q":8}`}).Draw(t, "value"))
			if len(e.Value) == 0 {
				e.Value = nil
			}
		}
		return e
	})
}

func mapGen() *rapid.Generator[map[string]Entry] {
	return rapid.Custom(func(t *rapid.T) map[string]Entry {
		m := map[string]Entry{}
		for _, e := range rapid.SliceOfN(entryGen(), 0, 6).Draw(t, "entries") {
			if cur, ok := m[e.Key]; ok {
				e = Merge(cur, e)
			}
			m[e.Key] = e
		}
		return m
	})
}

func equalMaps(a, b map[string]Entry) bool {
	return maps.EqualFunc(a, b, func(x, y Entry) bool { return Compare(x, y) == 0 })
}

// newMem builds a store without persistence whose tombstones never expire
// during the test (entries from entryGen are dated near the epoch).
func newMem(t interface {
	Helper()
	Fatal(...any)
}, node string) *Store {
	t.Helper()
	s, err := New(Config{Node: node, TombstoneTTL: 1 << 62, TombstoneMinAge: time.Hour,
		Now: func() time.Time { return time.UnixMilli(10) }})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func snapshot(s *Store) map[string]Entry {
	out := map[string]Entry{}
	for _, e := range s.All() {
		out[e.Key] = e
	}
	return out
}

func TestMergeLaws(t *testing.T) {
	t.Run("entry merge is idempotent, commutative and associative", rapid.MakeCheck(func(t *rapid.T) {
		a, b, c := entryGen().Draw(t, "a"), entryGen().Draw(t, "b"), entryGen().Draw(t, "c")
		if Compare(Merge(a, a), a) != 0 {
			t.Fatal("merge(a, a) != a")
		}
		if Compare(Merge(a, b), Merge(b, a)) != 0 {
			t.Fatalf("merge not commutative for %+v, %+v", a, b)
		}
		if Compare(Merge(Merge(a, b), c), Merge(a, Merge(b, c))) != 0 {
			t.Fatal("merge not associative")
		}
	}))
	t.Run("map merge is idempotent, commutative and associative", rapid.MakeCheck(func(t *rapid.T) {
		a, b, c := mapGen().Draw(t, "a"), mapGen().Draw(t, "b"), mapGen().Draw(t, "c")
		if !equalMaps(MergeMaps(a, a), a) {
			t.Fatal("merge(a, a) != a")
		}
		if !equalMaps(MergeMaps(a, b), MergeMaps(b, a)) {
			t.Fatal("merge not commutative")
		}
		if !equalMaps(MergeMaps(MergeMaps(a, b), c), MergeMaps(a, MergeMaps(b, c))) {
			t.Fatal("merge not associative")
		}
	}))
	t.Run("stores converge whatever the delivery order and repetition", rapid.MakeCheck(func(t *rapid.T) {
		entries := rapid.SliceOfN(entryGen(), 1, 12).Draw(t, "entries")
		order := rapid.Permutation(entries).Draw(t, "order")
		dup := rapid.SliceOfN(rapid.SampledFrom(entries), 0, 4).Draw(t, "redelivered")
		s1, s2 := newMem(t, "n1"), newMem(t, "n2")
		s1.accept(entries, "remote", s1.cfg.Now())
		for _, e := range append(order, dup...) { // one at a time, as gossip would
			s2.accept([]Entry{e}, "remote", s2.cfg.Now())
		}
		if !equalMaps(snapshot(s1), snapshot(s2)) {
			t.Fatalf("replicas diverged:\n%+v\n%+v", snapshot(s1), snapshot(s2))
		}
		want := map[string]Entry{}
		for _, e := range entries {
			want = MergeMaps(want, map[string]Entry{e.Key: e})
		}
		if !equalMaps(snapshot(s1), want) {
			t.Fatalf("store %+v, pure merge %+v", snapshot(s1), want)
		}
		st := s1.Stats()
		live := 0
		for _, e := range want {
			if !e.Deleted {
				live++
			}
		}
		if st.Live != live || st.Tombstones != len(want)-live {
			t.Fatalf("stats %+v, want %d live of %d", st, live, len(want))
		}
		if got := len(s1.LocalState()); got != st.StateBytes {
			t.Fatalf("StateBytes %d, LocalState is %d bytes", st.StateBytes, got)
		}
	}))
	t.Run("a local write is newer than anything seen", rapid.MakeCheck(func(t *rapid.T) {
		s := newMem(t, "n0")
		s.accept(rapid.SliceOfN(entryGen(), 0, 8).Draw(t, "seen"), "remote", s.cfg.Now())
		key := rapid.SampledFrom([]string{"a", "b", "new"}).Draw(t, "key")
		e, err := s.Put(context.Background(), key, []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		for _, o := range s.All() {
			if o.Key != key && e.Version.Compare(o.Version) <= 0 {
				t.Fatalf("new version %s not after seen %s", e.Version, o.Version)
			}
		}
	}))
}

func TestClockIsHybrid(t *testing.T) {
	now := time.UnixMilli(1_700_000_000_000)
	s, err := New(Config{Node: "n", Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	e1, _ := s.Put(t.Context(), "k", []byte("1"))
	e2, _ := s.Put(t.Context(), "k", []byte("2"))
	if e1.Version.Clock != uint64(now.UnixMilli()) || e2.Version.Clock != e1.Version.Clock+1 {
		t.Fatalf("clocks %d, %d: want the wall clock, then +1 within the same millisecond", e1.Version.Clock, e2.Version.Clock)
	}
	// A peer ahead of us moves our clock past its own.
	ahead := Entry{Key: "p", Value: []byte("x"), Version: Version{Clock: e2.Version.Clock + 1000, Node: "peer"}}
	s.accept([]Entry{ahead}, "remote", now)
	if e3, _ := s.Put(t.Context(), "k", []byte("3")); e3.Version.Clock != ahead.Version.Clock+1 {
		t.Fatalf("after seeing clock %d, wrote %d", ahead.Version.Clock, e3.Version.Clock)
	}
	// A restart with only old entries persisted still writes past what it
	// gave out before: the wall clock has moved on.
	later := now.Add(2 * time.Second)
	s2, _ := New(Config{Node: "n", Initial: []Entry{e1}, Now: func() time.Time { return later }})
	if e, _ := s2.Put(t.Context(), "k", []byte("4")); e.Version.Compare(ahead.Version) <= 0 {
		t.Fatalf("restarted store wrote %s, not after %s", e.Version, ahead.Version)
	}

	// A node whose wall clock lags two days, but which has seen a peer's
	// entry, dates its delete by its hybrid clock: the peer (TTL 24 h)
	// takes the tombstone in instead of dropping it as expired.
	lagging, _ := New(Config{Node: "slow", Now: func() time.Time { return now.Add(-48 * time.Hour) }})
	peer, _ := New(Config{Node: "peer", Now: func() time.Time { return now }})
	lagging.accept([]Entry{ahead}, "remote", lagging.cfg.Now())
	d, err := lagging.Delete(t.Context(), "k")
	if err != nil || uint64(d.DeletedAt) <= ahead.Version.Clock {
		t.Fatalf("lagging delete = %+v, %v: want it dated after the clock it saw (%d)", d, err, ahead.Version.Clock)
	}
	peer.accept([]Entry{d}, "remote", now)
	if st := peer.Stats(); st.Tombstones != 1 {
		t.Fatalf("the peer dropped a fresh delete from a lagging node: %+v", st)
	}
}

func TestCodec(t *testing.T) {
	t.Run("round trip", rapid.MakeCheck(func(t *rapid.T) {
		entries := rapid.SliceOfN(entryGen(), 0, 10).Draw(t, "entries")
		d, err := decode(encodeState("node-1", entries, 0))
		if err != nil || d.kind != msgState || d.sender != "node-1" || len(d.entries) != len(entries) {
			t.Fatalf("state: %+v, err %v", d, err)
		}
		for i := range entries {
			if Compare(d.entries[i], entries[i]) != 0 || d.entries[i].Key != entries[i].Key {
				t.Fatalf("entry %d: %+v != %+v", i, d.entries[i], entries[i])
			}
			if encodedSize(entries[i]) != len(appendEntry(nil, entries[i])) {
				t.Fatalf("encodedSize(%+v) = %d, encoded %d", entries[i], encodedSize(entries[i]), len(appendEntry(nil, entries[i])))
			}
		}
		if len(entries) > 0 {
			d, err = decode(encodeEntryMsg(entries[0]))
			if err != nil || d.kind != msgEntry || Compare(d.entries[0], entries[0]) != 0 {
				t.Fatalf("entry message: %v %+v", err, d)
			}
		}
	}))
	t.Run("garbage never panics", rapid.MakeCheck(func(t *rapid.T) {
		b := rapid.SliceOfN(rapid.Byte(), 0, 200).Draw(t, "bytes")
		if rapid.Bool().Draw(t, "plausible header") && len(b) >= 2 {
			b[0], b[1] = rapid.SampledFrom([]byte{msgEntry, msgState}).Draw(t, "kind"), WireVersion
		}
		_, _ = decode(b)
	}))
	t.Run("a largest entry fits a default gossip packet", func(t *testing.T) {
		e := Entry{Key: strings.Repeat("k", MaxKeyBytes), Value: make([]byte, MaxValueBytes),
			Version: Version{Clock: 1 << 62, Node: strings.Repeat("n", MaxNodeBytes)}}
		// UDPBufferSize minus compound header, label, AES-GCM and user-message overheads.
		budget := memberlist.DefaultLANConfig().UDPBufferSize - 2 - 0 - 29 - 2 - 1
		if n := len(encodeEntryMsg(e)); n > budget {
			t.Fatalf("largest entry message is %d bytes, gossip budget %d", n, budget)
		}
		tomb := Entry{Key: e.Key, Deleted: true, DeletedAt: 1 << 62, Version: e.Version}
		if n := encodedSize(tomb); n > maxTombstoneBytes {
			t.Fatalf("largest tombstone is %d bytes, maxTombstoneBytes %d", n, maxTombstoneBytes)
		}
	})
	t.Run("other wire version is refused", func(t *testing.T) {
		b := encodeEntryMsg(Entry{Key: "k", Version: Version{1, "n"}})
		b[1] = WireVersion + 1
		if _, err := decode(b); !errors.Is(err, errWireVersion) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("state that claims too many entries", func(t *testing.T) {
		b := []byte{msgState, WireVersion, 1, 'n', 0xff, 0xff, 0xff, 0xff, 0x0f}
		if _, err := decode(b); err == nil {
			t.Fatal("accepted")
		}
	})
	t.Run("state without a sender", func(t *testing.T) {
		if _, err := decode(encodeState("", nil, 0)); err == nil {
			t.Fatal("accepted")
		}
	})
	t.Run("invalid entries are refused", func(t *testing.T) {
		for _, e := range []Entry{
			{Key: "", Version: Version{1, "n"}},
			{Key: "k", Value: []byte("x"), Deleted: true, Version: Version{1, "n"}},
		} {
			if _, err := decode(encodeEntryMsg(e)); !errors.Is(err, ErrInvalidEntry) {
				t.Errorf("%+v: err = %v, want ErrInvalidEntry", e, err)
			}
		}
		if _, err := decode(encodeEntryMsg(Entry{Key: "\xff", Version: Version{1, "n"}})); err == nil {
			t.Error("a key that is not UTF-8 was accepted")
		}
	})
}
