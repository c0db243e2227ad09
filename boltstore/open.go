package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"runtime"
	"runtime/debug"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// bbolt's on-disk meta page (go.etcd.io/bbolt/internal/common): a 16-byte
// page header, then magic, version, page size, flags (4 bytes each), the
// root bucket (16), freelist pgid, high-water pgid, txid and an FNV-64a
// checksum of the preceding 56 bytes (8 each).
const (
	boltMagic      = 0xED0CDAED
	boltVersion    = 2
	pageHeaderSize = 16
	metaSumLen     = 56
	metaLen        = metaSumLen + 8
)

type diskMeta struct {
	valid    bool
	pageSize uint32
	pgid     uint64
	txid     uint64
}

func parseMeta(b []byte) diskMeta {
	if len(b) < pageHeaderSize+metaLen {
		return diskMeta{}
	}
	m := b[pageHeaderSize : pageHeaderSize+metaLen]
	le := binary.LittleEndian
	d := diskMeta{pageSize: le.Uint32(m[8:]), pgid: le.Uint64(m[40:]), txid: le.Uint64(m[48:])}
	h := fnv.New64a()
	_, _ = h.Write(m[:metaSumLen])
	d.valid = le.Uint32(m[0:]) == boltMagic && le.Uint32(m[4:]) == boltVersion &&
		h.Sum64() == le.Uint64(m[metaSumLen:])
	return d
}

// precheckFile catches a truncated file before bbolt maps it: bbolt trusts
// the meta page's high-water mark and would fault (SIGBUS, not a
// recoverable panic) reading pages past the end of the file. It reports
// whether the file holds data (false: absent or empty, a new store).
func precheckFile(path string) (bool, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open %s: %w", path, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("stat %s: %w", path, err)
	}
	size := info.Size()
	if size == 0 {
		return false, nil
	}
	buf := make([]byte, pageHeaderSize+metaLen)
	if _, err := f.ReadAt(buf, 0); err != nil {
		return true, fmt.Errorf("%s: %w: cannot read meta page 0 (%d bytes): %v", path, ErrCorrupt, size, err)
	}
	m0 := parseMeta(buf)
	ps := int64(os.Getpagesize())
	if m0.valid {
		ps = int64(m0.pageSize)
	}
	var m1 diskMeta
	if _, err := f.ReadAt(buf, ps); err == nil || errors.Is(err, io.EOF) {
		m1 = parseMeta(buf)
	}
	// bbolt uses the valid meta with the higher txid.
	a, b := m0, m1
	if m1.txid > m0.txid {
		a, b = m1, m0
	}
	if !a.valid {
		a = b
	}
	if !a.valid {
		return true, fmt.Errorf("%s: %w: no valid bbolt meta page (not a bbolt file, or both metas damaged)", path, ErrCorrupt)
	}
	if need := int64(a.pgid) * int64(a.pageSize); size < need {
		return true, fmt.Errorf("%s: %w: truncated: file is %d bytes, its meta page needs %d", path, ErrCorrupt, size, need)
	}
	return true, nil
}

// classifyOpenErr maps a bbolt.Open error to the store's sentinels.
func classifyOpenErr(path string, opts Options, err error) error {
	var pe *fs.PathError
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return fmt.Errorf("open %s: %w (waited %s for the file lock)", path, ErrLocked, opts.LockTimeout)
	case errors.As(err, &pe) || errors.Is(err, fs.ErrPermission) || errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("open %s: %w", path, err)
	default:
		return fmt.Errorf("open %s: %w: %v", path, ErrCorrupt, err)
	}
}

// guard runs fn with faults turned into panics and every panic turned into
// an ErrCorrupt error: bbolt panics (or faults) on a bad page instead of
// returning an error (bbolt#335, #778).
func guard(what string, fn func() error) (err error) {
	old := debug.SetPanicOnFault(true)
	defer debug.SetPanicOnFault(old)
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%s: %w: bbolt panicked: %v", what, ErrCorrupt, r)
		}
	}()
	return fn()
}

// walkFile reads every page reachable from the file's root through a
// read-only handle, inside guard. It runs before the read-write Open because
// bbolt's read-write Open (with NoFreelistSync) walks the same pages on a
// goroutine of its own, where a panic on a bad page would kill the process.
func walkFile(path string, opts Options) error {
	db, err := bolt.Open(path, 0o600, &bolt.Options{
		ReadOnly:     true,
		Timeout:      opts.LockTimeout,
		FreelistType: bolt.FreelistMapType,
	})
	if err != nil {
		return classifyOpenErr(path, opts, err)
	}
	defer db.Close()
	return guard("check "+path, func() error {
		return db.View(func(tx *bolt.Tx) error {
			return tx.ForEach(func(name []byte, b *bolt.Bucket) error {
				return walkBucket(b)
			})
		})
	})
}

func walkBucket(b *bolt.Bucket) error {
	var sum byte
	err := b.ForEach(func(k, v []byte) error {
		if v == nil {
			if sub := b.Bucket(k); sub != nil {
				return walkBucket(sub)
			}
			return nil
		}
		// Touch one byte per page of the value, so overflow pages are read.
		for i := 0; i < len(v); i += 1024 {
			sum ^= v[i]
		}
		if len(v) > 0 {
			sum ^= v[len(v)-1]
		}
		return nil
	})
	runtime.KeepAlive(sum) // keeps the page reads from being optimised away
	return err
}

// openBolt opens the file read-write with the options PITFALLS.md asks for
// (lock timeout, NoFreelistSync with the map freelist, never NoSync),
// containing any panic. If the path names another file once the lock is
// held (Compact renamed its verified copy over it while we waited for the
// lock), the lock is on a file no one will see again: it reopens the path.
func openBolt(path string, opts Options) (*bolt.DB, error) {
	for attempt := 0; ; attempt++ {
		db, file, err := openBoltOnce(path, opts)
		if err != nil {
			return nil, err
		}
		pfi, perr := os.Stat(path)
		ffi, ferr := file.Stat()
		if perr == nil && ferr == nil && os.SameFile(pfi, ffi) {
			return db, nil
		}
		_ = db.Close()
		if attempt == 2 {
			return nil, fmt.Errorf("open %s: the file was replaced while this process waited for its lock, three times", path)
		}
	}
}

func openBoltOnce(path string, opts Options) (*bolt.DB, *os.File, error) {
	var file *os.File
	var db *bolt.DB
	err := guard("open "+path, func() error {
		var err error
		db, err = bolt.Open(path, 0o600, &bolt.Options{
			Timeout:        opts.LockTimeout,
			NoFreelistSync: true,
			FreelistType:   bolt.FreelistMapType,
			OpenFile: func(name string, flag int, perm os.FileMode) (*os.File, error) {
				f, err := os.OpenFile(name, flag, perm)
				file = f
				return f, err
			},
		})
		if err != nil {
			return classifyOpenErr(path, opts, err)
		}
		return nil
	})
	if err != nil && db == nil && file != nil && errors.Is(err, ErrCorrupt) {
		// bbolt panicked half-way: release the file (and its lock) ourselves.
		_ = file.Close()
	}
	return db, file, err
}
