package boltstore

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/outbox"
)

// TestMarkingReadStopsAtAFullPageBeforeSteppingOver: a marking read steps
// over claimed and marked rows, rows entries and packed rows alike, but
// once the page is full it stops at the first such row instead of stepping
// over it: the page's token stays at its last row, exactly where a copy
// read of the same rows stops, and the next read resumes from there.
func TestMarkingReadStopsAtAFullPageBeforeSteppingOver(t *testing.T) {
	for _, tc := range []struct {
		name   string
		packed bool
		claim  bool // the third row is claimed instead of marked
	}{
		{"rows entries, marked", false, false},
		{"rows entries, claimed", false, true},
		{"packed rows, marked", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, b := newTestStore(t)
			const shard = 3
			keys := []string{keyOnShard("a", shard), keyOnShard("b", shard), keyOnShard("c", shard), keyOnShard("d", shard)}
			var rows []outbox.Row
			for _, k := range keys {
				rows = append(rows, row(k, "ns", "q"))
			}
			mustAppend(t, s, rows...)
			if tc.packed {
				completeAndPack(t, s, b, len(rows))
			}
			if tc.claim {
				held := map[string]struct{}{}
				for _, k := range keys {
					if k != keys[2] {
						held["wf-"+k] = struct{}{}
					}
				}
				got, err := s.Claim(ctx, outbox.ClaimParams{Limit: 10, Now: b.clock.Now(), ExcludeWorkflows: held})
				if err != nil || len(got) != 1 || got[0].DispatchKey != keys[2] {
					t.Fatalf("claim of %s: %v %v", keys[2], keysOfRows(got), err)
				}
			}
			s.SetOwnedShards([]uint32{})
			// Mark the first row (and the third unless it is claimed).
			marks := 1
			if !tc.claim {
				marks = 3
			}
			p, err := s.ReadShard(ctx, outbox.ShardRead{Shard: shard, MaxRows: marks, Mark: true})
			must(t, err)
			if !tc.claim {
				if n, err := s.AbortTransfer(ctx, []string{keys[1]}); err != nil || n != 1 {
					t.Fatalf("abort of %s: %d %v (marked %v)", keys[1], n, err, keysOfRows(p.Rows))
				}
			}

			copied, err := s.ReadShard(ctx, outbox.ShardRead{Shard: shard, MaxRows: 2})
			must(t, err)
			page, err := s.ReadShard(ctx, outbox.ShardRead{Shard: shard, MaxRows: 1, Mark: true})
			must(t, err)
			if !slices.Equal(keysOfRows(page.Rows), keys[1:2]) || page.Done || !bytes.Equal(page.Next, copied.Next) {
				t.Fatalf("marking read of 1: %v done=%v next %x; want [%s], not done, next %x (after %s)",
					keysOfRows(page.Rows), page.Done, page.Next, keys[1], copied.Next, keys[1])
			}
			rest, err := s.ReadShard(ctx, outbox.ShardRead{Shard: shard, After: page.Next, MaxRows: 10, Mark: true})
			must(t, err)
			if !slices.Equal(keysOfRows(rest.Rows), keys[3:]) || !rest.Done {
				t.Fatalf("marking read of the rest: %v done=%v, want %v and done", keysOfRows(rest.Rows), rest.Done, keys[3:])
			}
		})
	}
}

// TestReadShardReportsDamagedEntries: a byshard key too short for its
// group, a byshard entry without its row, an undecodable row and an
// undecodable bundle fail a shard read with ErrCorrupt.
func TestReadShardReportsDamagedEntries(t *testing.T) {
	const shard = 3
	for _, tc := range []struct {
		name   string
		tamper func(tx *bolt.Tx) error
		want   string
	}{
		{"short byshard key", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketByShard).Put(append(byShardGroup(shard), 1), appendShard(nil, shard))
		}, "byshard key"},
		{"byshard entry without a row", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketRows).Delete(rowKey(keyOnShard("a", shard)))
		}, "without a row"},
		{"undecodable row", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketRows).Put(rowKey(keyOnShard("a", shard)), []byte{1, 9})
		}, "malformed"},
		{"undecodable bundle", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketBundles).Put(firstKey(tx, bucketBundles), []byte{0xEE})
		}, "(header)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, b := newTestStore(t)
			mustAppend(t, s, row(keyOnShard("p", shard), "ns", "q"))
			completeAndPack(t, s, b, 1)
			mustAppend(t, s, row(keyOnShard("a", shard), "ns", "q"))
			must(t, s.submit(context.Background(), "tamper", 1, func(w *wtx) error { return tc.tamper(w.tx) }))
			_, err := s.ReadShard(ctx, outbox.ShardRead{Shard: shard, MaxRows: 10})
			if !errors.Is(err, ErrCorrupt) || !bytes.Contains([]byte(err.Error()), []byte(tc.want)) {
				t.Fatalf("read: %v, want ErrCorrupt mentioning %q", err, tc.want)
			}
			// Leave a clean file for the cleanup check: Close without it.
			must(t, s.Close())
		})
	}
}
