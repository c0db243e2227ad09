package boltstore

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fairshard/fairshard/outbox"
)

// TestCheckFindsTamperingOfPackedRowsMarksAndCounters extends
// TestCheckFindsTampering to the shard count, transfer marks, bundles and
// their expiry index, and undecodable or unaccounted counters and digests:
// each damage is reported as ErrCorrupt with its own message.
func TestCheckFindsTamperingOfPackedRowsMarksAndCounters(t *testing.T) {
	var claimedKey string
	cases := []struct {
		name   string
		tamper func(tx *bolt.Tx) error
		want   string
	}{
		{"shard count changed", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Put(metaShardCount, appendShard(nil, testShardCount+1))
		}, fmt.Sprintf("meta shard_count %08x, want %d", testShardCount+1, testShardCount)},
		{"claimed row marked in-transfer", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketTransfer).Put(rowKey(claimedKey), present)
		}, "is claimed and marked in-transfer"},
		{"byshard entry records another shard", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketByShard).Put(firstKey(tx, bucketByShard), appendShard(nil, testShardCount+5))
		}, "byshard entry records shard"},
		{"undecodable bundle", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketBundles).Put(firstKey(tx, bucketBundles), []byte{0xEE})
		}, "(header)"},
		{"bundle under a key before its first row", func(tx *bolt.Tx) error {
			bk, bv, _, err := firstBundle(tx, 1)
			if err != nil {
				return err
			}
			must(t, tx.Bucket(bucketBundles).Delete(bk))
			return tx.Bucket(bucketBundles).Put(append(bk[:4:4], "a-early"...), bv)
		}, `starts at "`},
		{"bundles overlap", func(tx *bolt.Tx) error {
			_, _, rows, err := firstBundle(tx, 2)
			if err != nil {
				return err
			}
			eb := encodeBundles(rows[0].Shard, rows[1:], tx.DB().Info().PageSize)[0]
			return tx.Bucket(bucketBundles).Put(eb.key, eb.val)
		}, "overlaps the one before it (which ends at"},
		{"bundle under another shard", func(tx *bolt.Tx) error {
			bk, bv, _, err := firstBundle(tx, 1)
			if err != nil {
				return err
			}
			other := appendShard(nil, binary.BigEndian.Uint32(bk)+1)
			c := tx.Bucket(bucketBundles).Cursor()
			for k, _ := c.Seek(other); k != nil && bytes.HasPrefix(k, other); k, _ = c.Seek(other) {
				must(t, c.Delete())
			}
			must(t, tx.Bucket(bucketBundles).Delete(bk))
			return tx.Bucket(bucketBundles).Put(append(other, bk[4:]...), bv)
		}, "is in a bundle of shard"},
		{"expiry entry missing", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketBExp).Delete(firstKey(tx, bucketBExp))
		}, "expiry entry at"},
		{"stray expiry entry", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketBExp).Put(bexpKey(time.Unix(1, 0), []byte("stray")), present)
		}, "bundle expiry index has"},
		{"undecodable shard counter", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketShards).Put(firstKey(tx, bucketShards), []byte{1})
		}, "shard counter 00000000: "},
		{"counter of a namespace without rows", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketNS).Put([]byte("ghost"), counts{1, 0, 0, 0, 0}.encode())
		}, "rows account for none"},
		{"malformed digests key", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketDigests).Put([]byte{7}, digestVal(1, 1))
		}, "digests key 07"},
		{"undecodable digest", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketDigests).Put(firstKey(tx, bucketDigests), []byte{1})
		}, "digest of shard 0: "},
		{"digest of a shard without rows", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketDigests).Put(appendShard(nil, testShardCount+3), digestVal(1, 1))
		}, "the shard holds no row"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var s *Store
			s, claimedKey = newPackedCheckStore(t)
			must(t, s.submit(context.Background(), "tamper", 1, func(w *wtx) error { return tc.tamper(w.tx) }))
			err := s.Check(ctx)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("check: %v, want ErrCorrupt mentioning %q", err, tc.want)
			}
			t.Logf("reported: %v", err)
			// Leave a clean file for the cleanup check: Close without it.
			must(t, s.Close())
		})
	}
}

// newPackedCheckStore returns a checked store holding 64 packed rows, a
// pending row and a claimed one, whose key it returns.
func newPackedCheckStore(t *testing.T) (*Store, string) {
	t.Helper()
	s, b := newTestStore(t)
	var rows []outbox.Row
	for i := range 64 {
		rows = append(rows, row(fmt.Sprintf("p-%02d", i), "ns", "q"))
	}
	mustAppend(t, s, rows...)
	completeAndPack(t, s, b, len(rows))
	mustAppend(t, s, row("a", "ns", "q"), row("b", "ns", "q"))
	got, err := s.Claim(ctx, outbox.ClaimParams{Limit: 1, Now: b.clock.Now()})
	if err != nil || len(got) != 1 {
		t.Fatalf("claim: %v %v", got, err)
	}
	mustCheck(t, s)
	return s, got[0].DispatchKey
}

// firstBundle returns the first bundle holding at least min rows.
func firstBundle(tx *bolt.Tx, min int) (bk, bv []byte, rows []outbox.Row, err error) {
	c := tx.Bucket(bucketBundles).Cursor()
	for k, v := c.First(); k != nil; k, v = c.Next() {
		br, err := openBundle(k, v)
		if err != nil {
			return nil, nil, nil, err
		}
		if rows, err = br.all(); err != nil {
			return nil, nil, nil, err
		}
		if len(rows) >= min {
			return append([]byte(nil), k...), append([]byte(nil), v...), rows, nil
		}
	}
	return nil, nil, nil, fmt.Errorf("no bundle of %d rows", min)
}

// firstKey returns a copy of the first key of bucket b.
func firstKey(tx *bolt.Tx, b []byte) []byte {
	k, _ := tx.Bucket(b).Cursor().First()
	return append([]byte(nil), k...)
}
