package kv

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/fairshard/fairshard/internal/bincodec"
)

// WireVersion is the version of this package's gossip messages (second
// byte of every message). A message of another version is dropped and
// counted; the host (cluster) refuses peers of another protocol version
// anyway, and bumps its own protocol version when this one changes.
//
// Version 2 (this one) added the sender's name to full states and the
// deletion time to tombstones; version 1 was cluster's original codec.
const WireVersion byte = 2

// Message kinds (first byte).
const (
	msgEntry byte = 1 // one entry, broadcast by gossip
	msgState byte = 2 // every entry of a node, push/pull
)

// Entry encoding: flags (bit 0: tombstone), clock (uvarint), node
// (uvarint length + bytes), key (same), value (same), and for a tombstone
// its deletion time (uvarint, Unix ms).
//
// State encoding: kind, version, sender node name, entry count (uvarint),
// entries.

// minEncodedEntry is the smallest encoded entry (flags, clock, three
// lengths), used to bound the count of a decoded state.
const minEncodedEntry = 5

func appendEntry(b []byte, e Entry) []byte {
	var flags byte
	if e.Deleted {
		flags |= 1
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, e.Version.Clock)
	b = bincodec.AppendString(b, e.Version.Node)
	b = bincodec.AppendString(b, e.Key)
	b = bincodec.AppendBytes(b, e.Value)
	if e.Deleted {
		b = binary.AppendUvarint(b, uint64(e.DeletedAt))
	}
	return b
}

func readEntry(r *bincodec.Reader) Entry {
	var e Entry
	flags := r.Byte()
	e.Deleted = flags&1 != 0
	e.Version.Clock = r.Uvarint()
	e.Version.Node = r.String(MaxNodeBytes)
	e.Key = r.String(MaxKeyBytes)
	if v := r.Bytes(MaxValueBytes); len(v) > 0 {
		e.Value = v // aliases the message: apply copies what it keeps
	}
	if e.Deleted {
		at := r.Uvarint()
		if at > 1<<62 {
			r.Fail(fmt.Errorf("deletion time %d out of range", at))
		}
		e.DeletedAt = int64(at)
	}
	if r.Err() == nil && flags&^1 != 0 {
		r.Fail(fmt.Errorf("unknown entry flags %#x", flags))
	}
	return e
}

// encodeEntryMsg encodes one entry as a gossip message.
func encodeEntryMsg(e Entry) []byte {
	b := make([]byte, 0, 2+encodedSize(e))
	b = append(b, msgEntry, WireVersion)
	return appendEntry(b, e)
}

// encodeState encodes a node's full state, sent by push/pull.
func encodeState(sender string, entries []Entry, sizeHint int) []byte {
	b := make([]byte, 0, 16+len(sender)+sizeHint)
	b = append(b, msgState, WireVersion)
	b = bincodec.AppendString(b, sender)
	b = binary.AppendUvarint(b, uint64(len(entries)))
	for _, e := range entries {
		b = appendEntry(b, e)
	}
	return b
}

// errWireVersion marks a message of another WireVersion.
var errWireVersion = errors.New("gossip message of another wire version")

// decoded is one decoded message.
type decoded struct {
	kind    byte
	sender  string // states only
	entries []Entry
}

// decode decodes a message or state; it never panics on hostile input and
// validates every entry. Values alias b: a merge that keeps an entry copies
// it (apply), so a steady-state push/pull, which keeps nothing, copies
// nothing.
func decode(b []byte) (decoded, error) {
	var d decoded
	r := bincodec.NewReader(b)
	d.kind = r.Byte()
	ver := r.Byte()
	if r.Err() != nil {
		return d, fmt.Errorf("kv gossip: %w", r.Err())
	}
	if ver != WireVersion {
		return d, fmt.Errorf("%w: %d, this node speaks %d", errWireVersion, ver, WireVersion)
	}
	switch d.kind {
	case msgEntry:
		d.entries = []Entry{readEntry(r)}
	case msgState:
		d.sender = r.String(MaxNodeBytes)
		n := r.Uvarint()
		if r.Err() == nil && n > uint64(r.Len()/minEncodedEntry) {
			return d, fmt.Errorf("kv gossip: state claims %d entries in %d bytes", n, r.Len())
		}
		d.entries = make([]Entry, 0, n)
		for i := uint64(0); i < n && r.Err() == nil; i++ {
			d.entries = append(d.entries, readEntry(r))
		}
		if r.Err() == nil && d.sender == "" {
			return d, errors.New("kv gossip: state without a sender")
		}
	default:
		return d, fmt.Errorf("kv gossip: unknown message kind %d", d.kind)
	}
	if r.Err() != nil {
		return d, fmt.Errorf("kv gossip: %w", r.Err())
	}
	if r.Len() != 0 {
		return d, fmt.Errorf("kv gossip: %d trailing bytes", r.Len())
	}
	for _, e := range d.entries {
		if err := e.Validate(); err != nil {
			return d, fmt.Errorf("kv gossip: %w", err)
		}
	}
	return d, nil
}
