package boltstore

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"
)

// TestOpenRefusesDamagedMetadata: Open reads the file's format version,
// shard count, transfer marks and namespace counters before serving, and
// refuses a file whose copy of any of them is damaged, naming the file and
// what is wrong.
func TestOpenRefusesDamagedMetadata(t *testing.T) {
	cases := []struct {
		name   string
		tamper func(tx *bolt.Tx) error
		is     error
		want   string
	}{
		{"buckets but no meta", func(tx *bolt.Tx) error {
			return tx.DeleteBucket(bucketMeta)
		}, ErrCorrupt, `not a boltstore file (bucket`},
		{"no format version", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Delete(metaFormat)
		}, ErrCorrupt, "no format version"},
		{"unreadable format version", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Put(metaFormat, []byte{0x80})
		}, ErrCorrupt, "unreadable format version 80"},
		{"format from the future", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Put(metaFormat, []byte{99})
		}, ErrCorrupt, "format version 99, this build reads 1 to"},
		{"no shard_count", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketMeta).Delete(metaShardCount)
		}, ErrCorrupt, "no shard_count"},
		{"transfer mark without a row", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketTransfer).Put(rowKey("ghost"), present)
		}, ErrCorrupt, fmt.Sprintf("transfer mark %x without a row", rowKey("ghost"))},
		{"undecodable namespace counters", func(tx *bolt.Tx) error {
			return tx.Bucket(bucketNS).Put([]byte("ns"), []byte{1})
		}, ErrCorrupt, `namespace "ns" counters`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "outbox.db")
			opts := Options{ShardCount: testShardCount, LockTimeout: 200 * time.Millisecond}
			s, err := Open(path, opts)
			must(t, err)
			mustAppend(t, s, row("a", "ns", "q"))
			must(t, s.Close())
			db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second})
			must(t, err)
			must(t, db.Update(tc.tamper))
			must(t, db.Close())

			_, err = Open(path, opts)
			if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), path) {
				t.Fatalf("open: %v, want %v naming %s and saying %q", err, tc.is, path, tc.want)
			}
		})
	}
}
