package kv

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"strings"
	"unicode/utf8"
)

// Bounds of one entry. An entry must fit in a single gossip packet
// (memberlist.Config.UDPBufferSize, 1400 bytes by default, minus headers
// and encryption overhead), so values are small documents: split larger
// config across keys.
const (
	// MaxKeyBytes bounds Entry.Key (bytes).
	MaxKeyBytes = 128
	// MaxValueBytes bounds Entry.Value (bytes).
	MaxValueBytes = 1024
	// MaxNodeBytes bounds Version.Node, a node name (bytes); it matches
	// cluster.MaxNodeNameBytes.
	MaxNodeBytes = 128
)

// Version orders the writes of one key: a clock, then the name of the node
// that wrote it as the deterministic tie-break.
//
// Clock is a hybrid logical clock: a local write takes max(the greatest
// clock this store has seen + 1, the wall clock in Unix milliseconds), and
// every clock seen (its own writes, gossip, the initial entries) moves the
// store's clock forward (Lamport's witness rule). So a write made after
// seeing another is always newer than it, concurrent writes are ordered by
// roughly the time they were made, and a node that restarts never reuses a
// clock below one it gave out before its restart, even when the entry that
// carried it has been collected (a plain counter restarted from the
// persisted entries could).
type Version struct {
	// Clock is the writer's clock (≥ 1 for a real write).
	Clock uint64
	// Node is the writer's node name.
	Node string
}

// Compare returns -1, 0 or +1 as v is older than, equal to or newer than
// o: by Clock, then by Node (byte-wise).
func (v Version) Compare(o Version) int {
	if c := cmp.Compare(v.Clock, o.Clock); c != 0 {
		return c
	}
	return strings.Compare(v.Node, o.Node)
}

// String renders v as "clock@node".
func (v Version) String() string { return fmt.Sprintf("%d@%s", v.Clock, v.Node) }

// Entry is one versioned key of the replicated map. Value is opaque here
// (the node layer stores small JSON documents). A delete is a tombstone:
// Deleted set, Value empty, DeletedAt the time of the delete. Tombstones
// are gossiped like values so a stale copy cannot bring a deleted key back,
// and are collected later (see the package doc, "Tombstones").
//
// # Merge algebra
//
// Two copies of a key merge to the greater under a total order: Version,
// then a tombstone over a value, then Value byte-wise, then the later
// DeletedAt (the last three only matter if a version was ever reused). A
// whole map merges key by key ([MergeMaps]). Taking the maximum of a total
// order is idempotent (merge(a, a) = a), commutative (merge(a, b) =
// merge(b, a)) and associative (merge(merge(a, b), c) = merge(a, merge(b,
// c))), so every replica converges on the same map whatever order and
// however often gossip and push/pull deliver entries (dskit's Mergeable
// states the same laws). The tests check the three laws with rapid.
type Entry struct {
	// Key names the entry: UTF-8, 1..MaxKeyBytes bytes. The node layer
	// uses prefixes such as "ns/" per namespace.
	Key string
	// Value is the opaque value, ≤ MaxValueBytes bytes; empty in a
	// tombstone.
	Value []byte
	// Deleted marks a tombstone.
	Deleted bool
	// Version orders writes of Key: last writer wins.
	Version Version
	// DeletedAt is when a tombstone was written, in Unix milliseconds: the
	// deleting node's hybrid clock at the delete (Version.Clock), which is
	// at least its wall clock and every clock it had seen; 0 for a value.
	// It dates the tombstone for the time bound of its collection
	// (Config.TombstoneTTL).
	DeletedAt int64
}

// Compare is the total order of the merge algebra: -1, 0 or +1 as a loses
// to, equals or wins over b (both copies of one key).
func Compare(a, b Entry) int {
	if c := a.Version.Compare(b.Version); c != 0 {
		return c
	}
	if a.Deleted != b.Deleted {
		if a.Deleted {
			return 1
		}
		return -1
	}
	if c := bytes.Compare(a.Value, b.Value); c != 0 {
		return c
	}
	return cmp.Compare(a.DeletedAt, b.DeletedAt)
}

// Merge returns the winner of two copies of one key. It is pure.
func Merge(a, b Entry) Entry {
	if Compare(a, b) >= 0 {
		return a
	}
	return b
}

// MergeMaps merges two whole maps (key → entry) into a new map, key by
// key with Merge. It is pure; the inputs are not modified.
func MergeMaps(a, b map[string]Entry) map[string]Entry {
	out := maps.Clone(a)
	if out == nil {
		out = make(map[string]Entry, len(b))
	}
	for k, e := range b {
		if cur, ok := out[k]; ok {
			e = Merge(cur, e)
		}
		out[k] = e
	}
	return out
}

// Clone returns a deep copy of e (Value is copied).
func (e Entry) Clone() Entry {
	e.Value = bytes.Clone(e.Value)
	return e
}

// Validate checks the entry's bounds: key, value and node name sizes,
// UTF-8, a tombstone without a value. Errors name the key and wrap
// ErrInvalidEntry.
func (e Entry) Validate() error {
	var err error
	switch {
	case e.Key == "":
		err = errors.New("key is empty")
	case len(e.Key) > MaxKeyBytes:
		err = fmt.Errorf("key is %d bytes, limit %d", len(e.Key), MaxKeyBytes)
	case !utf8.ValidString(e.Key):
		err = fmt.Errorf("key %q is not valid UTF-8", e.Key)
	case len(e.Value) > MaxValueBytes:
		err = fmt.Errorf("value of key %q is %d bytes, limit %d", e.Key, len(e.Value), MaxValueBytes)
	case e.Deleted && len(e.Value) > 0:
		err = fmt.Errorf("tombstone of key %q carries a value", e.Key)
	case !e.Deleted && e.DeletedAt != 0:
		err = fmt.Errorf("value of key %q carries a deletion time", e.Key)
	case e.DeletedAt < 0:
		err = fmt.Errorf("tombstone of key %q has a negative deletion time", e.Key)
	case len(e.Version.Node) > MaxNodeBytes:
		err = fmt.Errorf("version node of key %q is %d bytes, limit %d", e.Key, len(e.Version.Node), MaxNodeBytes)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", ErrInvalidEntry, err)
	}
	return nil
}

// encodedSize is the size of e in the wire format (codec.go), the unit of
// the state-size cap.
func encodedSize(e Entry) int {
	n := 1 + uvarintLen(e.Version.Clock) + uvarintLen(uint64(len(e.Version.Node))) + len(e.Version.Node) +
		uvarintLen(uint64(len(e.Key))) + len(e.Key) + uvarintLen(uint64(len(e.Value))) + len(e.Value)
	if e.Deleted {
		n += uvarintLen(uint64(e.DeletedAt))
	}
	return n
}

func uvarintLen(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}
