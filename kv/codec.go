package kv

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
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
	b = appendString(b, e.Version.Node)
	b = appendString(b, e.Key)
	b = binary.AppendUvarint(b, uint64(len(e.Value)))
	b = append(b, e.Value...)
	if e.Deleted {
		b = binary.AppendUvarint(b, uint64(e.DeletedAt))
	}
	return b
}

func readEntry(r *reader) Entry {
	var e Entry
	flags := r.byte()
	e.Deleted = flags&1 != 0
	e.Version.Clock = r.uvarint()
	e.Version.Node = r.string(MaxNodeBytes)
	e.Key = r.string(MaxKeyBytes)
	if v := r.bytes(MaxValueBytes); len(v) > 0 {
		e.Value = v // aliases the message: apply copies what it keeps
	}
	if e.Deleted {
		at := r.uvarint()
		if at > 1<<62 {
			r.fail(fmt.Errorf("deletion time %d out of range", at))
		}
		e.DeletedAt = int64(at)
	}
	if r.err == nil && flags&^1 != 0 {
		r.fail(fmt.Errorf("unknown entry flags %#x", flags))
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
	b = appendString(b, sender)
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
	r := reader{b: b}
	d.kind = r.byte()
	ver := r.byte()
	if r.err != nil {
		return d, fmt.Errorf("kv gossip: %w", r.err)
	}
	if ver != WireVersion {
		return d, fmt.Errorf("%w: %d, this node speaks %d", errWireVersion, ver, WireVersion)
	}
	switch d.kind {
	case msgEntry:
		d.entries = []Entry{readEntry(&r)}
	case msgState:
		d.sender = r.string(MaxNodeBytes)
		n := r.uvarint()
		if r.err == nil && n > uint64(len(r.b)/minEncodedEntry) {
			return d, fmt.Errorf("kv gossip: state claims %d entries in %d bytes", n, len(r.b))
		}
		d.entries = make([]Entry, 0, n)
		for i := uint64(0); i < n && r.err == nil; i++ {
			d.entries = append(d.entries, readEntry(&r))
		}
		if r.err == nil && d.sender == "" {
			return d, errors.New("kv gossip: state without a sender")
		}
	default:
		return d, fmt.Errorf("kv gossip: unknown message kind %d", d.kind)
	}
	if r.err != nil {
		return d, fmt.Errorf("kv gossip: %w", r.err)
	}
	if len(r.b) != 0 {
		return d, fmt.Errorf("kv gossip: %d trailing bytes", len(r.b))
	}
	for _, e := range d.entries {
		if err := e.Validate(); err != nil {
			return d, fmt.Errorf("kv gossip: %w", err)
		}
	}
	return d, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// reader decodes the wire format without ever panicking: the first error
// sticks and later reads return zero values.
type reader struct {
	b   []byte
	err error
}

var errShort = errors.New("truncated")

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *reader) byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 1 {
		r.err = errShort
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = errors.New("bad varint")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// bytes reads a length-prefixed byte string of at most limit bytes; the
// result aliases the input.
func (r *reader) bytes(limit int) []byte {
	n := r.uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(limit) {
		r.err = fmt.Errorf("length %d above limit %d", n, limit)
		return nil
	}
	if uint64(len(r.b)) < n {
		r.err = errShort
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

func (r *reader) string(limit int) string {
	v := r.bytes(limit)
	if r.err != nil {
		return ""
	}
	if !utf8.Valid(v) {
		r.err = errors.New("string is not valid UTF-8")
		return ""
	}
	return string(v)
}
