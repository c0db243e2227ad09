package boltstore

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	bolt "go.etcd.io/bbolt"
)

// CompactSuffix names the compacted copy while it is written and verified:
// the data file's path plus this suffix, in the same directory (a rename
// within one file system is atomic).
const CompactSuffix = ".compact"

// compactTxBytes bounds one write transaction of the copy (keys plus
// values), so compacting a large file never holds it all in memory.
const compactTxBytes = 64 << 20

// CompactOptions configure Compact. Zero values mean the defaults.
type CompactOptions struct {
	// LockTimeout is how long Compact waits for the data file's lock
	// before failing with ErrLocked. Defaults to 1 s.
	LockTimeout time.Duration
	// KeepOriginal keeps the original file as path+".orig" (a hard link:
	// its space is freed only when that file is deleted).
	KeepOriginal bool
}

// CompactResult describes one compaction.
type CompactResult struct {
	// Before and After are the data file's size in bytes before and after.
	Before, After int64
	// Rows is the number of rows (live and tombstones) in both files.
	Rows int64
	// Took is the wall time of the whole compaction, verification included.
	Took time.Duration
}

// Compact rewrites the store file at path into a copy holding only its live
// pages, with bbolt's own compaction (bbolt.Compact: every bucket copied in
// key order into full pages), and replaces the file with the copy. bbolt
// never shrinks a file: pages freed by deleted rows and expired tombstones
// are reused, not given back, so a file that once held a large backlog
// keeps that size. Compact gives the space back. It is offline: the file
// must not be open elsewhere (a running node holds its lock).
//
// Steps, each of which leaves the original untouched if it fails:
//
//  1. Check the file (size against its meta page, every page walked) and
//     take its exclusive lock for the whole compaction, waiting at most
//     opts.LockTimeout (ErrLocked: "data dir is in use by another
//     process"). The original is opened without writing to it.
//  2. Copy it into path+CompactSuffix (a stale copy from an interrupted
//     compaction is removed first), in transactions of at most 64 MiB,
//     each fsync'd.
//  3. Verify the copy: every bucket holds exactly the original's keys and
//     values (a full walk of both files), then open it as a store and run
//     Check (indexes, counters and shard digests against the rows). A
//     difference or an inconsistency deletes the copy and fails with
//     ErrCorrupt.
//  4. Rename the copy over path (atomic) and fsync the directory; with
//     opts.KeepOriginal the original is first linked as path+".orig".
//
// A file that is not a store file, or is corrupt, fails with ErrCorrupt; a
// missing file with an error wrapping fs.ErrNotExist. Compact needs free
// space for the copy (at most the size of the data it holds); when the
// disk fills, the copy is deleted and the original kept. Cost: reads the
// original twice and the copy twice; about a second per few hundred MB.
func Compact(ctx context.Context, path string, opts CompactOptions) (CompactResult, error) {
	start := time.Now()
	opts.LockTimeout = cmp.Or(opts.LockTimeout, LockTimeoutDefault)
	sopts := Options{LockTimeout: opts.LockTimeout}.withDefaults()
	var res CompactResult
	existed, err := precheckFile(path)
	if err != nil {
		return res, err
	}
	if !existed {
		if _, err := os.Stat(path); err != nil {
			return res, fmt.Errorf("boltstore: compact: %w", err)
		}
		return res, fmt.Errorf("boltstore: compact %s: %w: the file is empty", path, ErrCorrupt)
	}
	if err := walkFile(path, sopts); err != nil {
		return res, err
	}
	// The original, read-write for its exclusive lock; nothing writes to it
	// (bbolt writes nothing at open with NoFreelistSync).
	src, err := openBolt(path, sopts)
	if err != nil {
		return res, err
	}
	defer src.Close()
	fi, err := os.Stat(path)
	if err != nil {
		return res, fmt.Errorf("boltstore: compact: %w", err)
	}
	res.Before = fi.Size()
	shardCount, err := fileShardCount(src, path)
	if err != nil {
		return res, err
	}
	tmp := path + CompactSuffix
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return res, fmt.Errorf("boltstore: compact: remove the stale copy: %w", err)
	}
	keepCopy := false
	defer func() {
		if !keepCopy {
			_ = os.Remove(tmp)
		}
	}()
	if err := copyCompact(ctx, src, tmp, sopts); err != nil {
		return res, fmt.Errorf("boltstore: compact %s: write the copy %s (the original is unchanged): %w", path, tmp, err)
	}
	if res.Rows, err = sameContent(src, tmp, sopts); err != nil {
		return res, fmt.Errorf("boltstore: compact %s: %w: the copy differs from the original (the original is unchanged): %w", path, ErrCorrupt, err)
	}
	if err := checkCopy(ctx, tmp, shardCount, sopts); err != nil {
		return res, fmt.Errorf("boltstore: compact %s: the copy fails the store check, so the original does too (the original is unchanged; run fairshard check): %w", path, err)
	}
	if opts.KeepOriginal {
		orig := path + ".orig"
		if err := os.Remove(orig); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return res, fmt.Errorf("boltstore: compact: remove the old %s: %w", orig, err)
		}
		if err := os.Link(path, orig); err != nil {
			return res, fmt.Errorf("boltstore: compact: keep the original as %s: %w", orig, err)
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return res, fmt.Errorf("boltstore: compact: replace %s by the verified copy: %w", path, err)
	}
	keepCopy = true // it is the data file now
	if err := syncDir(filepath.Dir(path)); err != nil {
		return res, fmt.Errorf("boltstore: compact: the copy replaced %s but the directory was not synced: %w", path, err)
	}
	if fi, err := os.Stat(path); err == nil {
		res.After = fi.Size()
	}
	res.Took = time.Since(start)
	return res, nil
}

// fileShardCount reads the shard_count a store file was created with.
func fileShardCount(db *bolt.DB, path string) (uint32, error) {
	var sc uint32
	err := guard("read "+path, func() error {
		return db.View(func(tx *bolt.Tx) error {
			meta := tx.Bucket(bucketMeta)
			if meta == nil {
				return fmt.Errorf("%s: %w: not a boltstore file (no %q bucket)", path, ErrCorrupt, bucketMeta)
			}
			v := meta.Get(metaShardCount)
			if len(v) != 4 {
				return fmt.Errorf("%s: %w: no shard_count", path, ErrCorrupt)
			}
			sc = binary.BigEndian.Uint32(v)
			return nil
		})
	})
	return sc, err
}

// copyCompact writes src's buckets into a new file at dst with
// bbolt.Compact, each transaction fsync'd, with the store's bbolt options.
func copyCompact(ctx context.Context, src *bolt.DB, dst string, opts Options) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	db, err := bolt.Open(dst, 0o600, &bolt.Options{Timeout: opts.LockTimeout, NoFreelistSync: true, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return err
	}
	err = guard("compact", func() error { return bolt.Compact(db, src, compactTxBytes) })
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	return err
}

// sameContent walks src and the file at dst side by side and returns the
// first difference: a bucket, key or value missing, extra or changed. It
// returns the number of rows (entries of the rows bucket and records of
// the bundles).
func sameContent(src *bolt.DB, dst string, opts Options) (int64, error) {
	db, err := bolt.Open(dst, 0o600, &bolt.Options{ReadOnly: true, Timeout: opts.LockTimeout, FreelistType: bolt.FreelistMapType})
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var rows int64
	err = guard("compare", func() error {
		return src.View(func(stx *bolt.Tx) error {
			return db.View(func(dtx *bolt.Tx) error {
				sc, dc := stx.Cursor(), dtx.Cursor()
				sk, _ := sc.First()
				dk, _ := dc.First()
				for ; sk != nil || dk != nil; sk, dk = nextPair(sc, dc) {
					if !bytes.Equal(sk, dk) {
						return fmt.Errorf("top-level bucket %q in the original, %q in the copy", sk, dk)
					}
					n, err := sameBucket(stx.Bucket(sk), dtx.Bucket(dk), string(sk))
					if err != nil {
						return err
					}
					switch {
					case bytes.Equal(sk, bucketRows):
						rows += n
					case bytes.Equal(sk, bucketBundles):
						packed, err := countPacked(stx.Bucket(sk))
						if err != nil {
							return err
						}
						rows += packed
					}
				}
				return nil
			})
		})
	})
	return rows, err
}

// countPacked counts the packed rows of a bundles bucket.
func countPacked(b *bolt.Bucket) (int64, error) {
	var n int64
	err := b.ForEach(func(k, v []byte) error {
		br, err := openBundle(k, v)
		if err != nil {
			return fmt.Errorf("%w: %w", ErrCorrupt, err)
		}
		n += int64(br.n)
		return nil
	})
	return n, err
}

func nextPair(a, b *bolt.Cursor) ([]byte, []byte) {
	ak, _ := a.Next()
	bk, _ := b.Next()
	return ak, bk
}

// sameBucket compares two buckets entry by entry (nested buckets
// recursively) and returns the number of entries.
func sameBucket(a, b *bolt.Bucket, name string) (int64, error) {
	if a == nil || b == nil {
		return 0, fmt.Errorf("bucket %q missing", name)
	}
	var n int64
	ac, bc := a.Cursor(), b.Cursor()
	ak, av := ac.First()
	bk, bv := bc.First()
	for ak != nil || bk != nil {
		if !bytes.Equal(ak, bk) {
			return n, fmt.Errorf("bucket %q: key %q in the original, %q in the copy", name, ak, bk)
		}
		switch {
		case av == nil && bv == nil:
			if _, err := sameBucket(a.Bucket(ak), b.Bucket(bk), name+"/"+string(ak)); err != nil {
				return n, err
			}
		case av == nil || bv == nil || !bytes.Equal(av, bv):
			return n, fmt.Errorf("bucket %q: key %q has another value in the copy", name, ak)
		}
		n++
		ak, av = ac.Next()
		bk, bv = bc.Next()
	}
	return n, nil
}

// checkCopy opens the copy as a store (as the next start will) and runs
// Check on it.
func checkCopy(ctx context.Context, path string, shardCount uint32, opts Options) error {
	s, err := Open(path, Options{ShardCount: shardCount, LockTimeout: opts.LockTimeout})
	if err != nil {
		return err
	}
	err = s.Check(ctx)
	if cerr := s.Close(); err == nil {
		err = cerr
	}
	return err
}

// syncDir fsyncs a directory, making a rename in it durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
