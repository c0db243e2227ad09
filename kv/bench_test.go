package kv

import (
	"bytes"
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
)

// fullStore returns a store filled to the default caps with the largest
// entries: live values until MaxBytes refuses, then MaxTombstones
// tombstones (what TestLargestStateAtTheDefaultCapsSyncs in cluster
// measures over the network).
func fullStore(b *testing.B, node string) *Store {
	b.Helper()
	s, err := New(Config{Node: node})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	ctx := context.Background()
	value := bytes.Repeat([]byte("v"), MaxValueBytes)
	key := func(prefix string, i int) string {
		k := prefix + strconv.Itoa(i) + "/"
		return k + strings.Repeat("k", MaxKeyBytes-len(k))
	}
	for i := 0; ; i++ {
		_, err := s.Put(ctx, key("target/", i), value)
		if errors.Is(err, ErrLimit) {
			break
		}
		if err != nil {
			b.Fatal(err)
		}
	}
	for i := range DefaultMaxTombstones {
		if _, err := s.Delete(ctx, key("hold/", i)); err != nil {
			b.Fatal(err)
		}
	}
	return s
}

// BenchmarkPushPullAtTheCaps: the two halves of a push/pull of the
// largest state the default caps allow (about 7.2 MiB): encoding it, and
// merging it into a replica that has it already (the steady state: every
// push/pull interval) or into an empty one (a joining node).
func BenchmarkPushPullAtTheCaps(b *testing.B) {
	src := fullStore(b, "node-a")
	state := src.LocalState()
	st := src.Stats()
	if len(state) != st.StateBytes {
		b.Fatalf("LocalState %d bytes, Stats says %d", len(state), st.StateBytes)
	}
	b.Run("LocalState", func(b *testing.B) {
		b.SetBytes(int64(len(state)))
		for b.Loop() {
			_ = src.LocalState()
		}
	})
	b.Run("MergeRemoteState/converged", func(b *testing.B) {
		dst := fullStore(b, "node-b")
		if err := dst.MergeRemoteState(state); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(int64(len(state)))
		for b.Loop() {
			if err := dst.MergeRemoteState(state); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("MergeRemoteState/empty", func(b *testing.B) {
		b.SetBytes(int64(len(state)))
		for b.Loop() {
			b.StopTimer()
			dst, err := New(Config{Node: "node-c"})
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			if err := dst.MergeRemoteState(state); err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			if got := dst.Stats(); got.Live != st.Live || got.Tombstones != st.Tombstones {
				b.Fatalf("merged %+v, want %d live and %d tombstones", got, st.Live, st.Tombstones)
			}
			dst.Close()
			b.StartTimer()
		}
	})
}

// BenchmarkPutAtTheCap: a write refused at the cap costs a check, not a
// scan; a write that fits costs the same plus the apply.
func BenchmarkPutAtTheCap(b *testing.B) {
	s := fullStore(b, "node-a")
	ctx := context.Background()
	value := bytes.Repeat([]byte("v"), MaxValueBytes)
	b.Run("refused", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.Put(ctx, "target/new", value); !errors.Is(err, ErrLimit) {
				b.Fatalf("Put at the cap = %v", err)
			}
		}
	})
	b.Run("rewrite", func(b *testing.B) {
		for b.Loop() {
			if _, err := s.Put(ctx, "hold/0/x", []byte("{}")); err != nil {
				b.Fatal(err)
			}
		}
	})
}
