// Package bincodec holds the tiny binary primitives that fairshard's
// binary formats are built from: a uvarint length followed by the bytes
// for strings and byte strings, uvarints and zig-zag varints for numbers,
// single bytes for kinds, flags and versions. Package cluster encodes its
// node meta and member query/answer messages with them, package kv its
// config gossip entries and full states, package transfer the batches of
// rows nodes send each other, and boltstore its row values and tombstone
// bundles; none may import another for it, so the codec lives here, below
// them all.
//
// [Reader] decodes hostile input (anything a peer sends) without ever
// panicking: every read is bounds-checked, every length is checked against
// a caller's limit before anything is sliced, and the first error sticks,
// so a decoder reads all its fields in a row and checks [Reader.Err] once.
//
// Nothing here knows a message layout; a change here changes every format
// that uses it: the gossip's (a new cluster.ProtocolVersion), the batch
// wire's and the data file's.
package bincodec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"unicode/utf8"
)

// Errors a [Reader] records. Their text is part of the log messages and
// errors of the packages that decode with it ("node meta: truncated",
// "kv gossip: bad varint"), so it stays as it is.
var (
	// ErrTruncated is recorded when the input ends before a field does.
	ErrTruncated = errors.New("truncated")
	// ErrBadVarint is recorded when a uvarint is cut short or overflows
	// 64 bits (encoding/binary.Uvarint returns n ≤ 0).
	ErrBadVarint = errors.New("bad varint")
	// ErrInvalidUTF8 is recorded by [Reader.String] for bytes that are
	// not valid UTF-8.
	ErrInvalidUTF8 = errors.New("string is not valid UTF-8")
)

// AppendString appends s to b as a uvarint length in bytes followed by the
// bytes of s, and returns the extended slice; [Reader.String] reads it.
func AppendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// AppendBytes appends p to b as a uvarint length in bytes followed by the
// bytes of p, and returns the extended slice; [Reader.Bytes] reads it. An
// empty or nil p is the single byte 0.
func AppendBytes(b []byte, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

// Reader reads the fields of one encoded message front to back. It never
// panics: once a read fails, the error is kept (the first one only, see
// [Reader.Fail]) and every later read returns its zero value (0, nil, "")
// without consuming anything. Slices it returns alias the input: a caller that keeps one past
// the input's lifetime copies it.
//
// A Reader is not safe for concurrent use; it is meant to live on the
// stack of one decode call.
type Reader struct {
	b   []byte
	err error
}

// NewReader returns a Reader over b, which it does not copy.
func NewReader(b []byte) *Reader { return &Reader{b: b} }

// Reset makes r a fresh Reader over b (no error recorded), so a decoder
// can keep a Reader by value and reuse it.
func (r *Reader) Reset(b []byte) { r.b, r.err = b, nil }

// Rest returns the unread bytes without consuming them (nil once an error
// is recorded); the result aliases the input. A decoder that slices a
// region it has measured out (a table, a body) reads it here.
func (r *Reader) Rest() []byte {
	if r.err != nil {
		return nil
	}
	return r.b
}

// Err returns the first error the Reader recorded ([ErrTruncated],
// [ErrBadVarint], [ErrInvalidUTF8], a "length N above limit M" error, or
// one given to [Reader.Fail]), or nil while every read has succeeded.
func (r *Reader) Err() error { return r.err }

// Fail records err as the Reader's error unless one is already recorded
// (the first error sticks). A decoder calls it for a field that reads well
// but means nothing valid (an unknown flag, a time out of range), so that
// later reads return zero values as after a read error. A nil err is
// ignored.
func (r *Reader) Fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

// Len returns the number of unread bytes, or 0 once an error is recorded.
// A decoder uses it to see whether optional trailing fields are present
// and to refuse trailing garbage.
func (r *Reader) Len() int {
	if r.err != nil {
		return 0
	}
	return len(r.b)
}

// Byte reads one byte. It records [ErrTruncated] at the end of the input.
func (r *Reader) Byte() byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) < 1 {
		r.err = ErrTruncated
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

// Uvarint reads an unsigned varint (encoding/binary's format, 1 to 10
// bytes). It records [ErrBadVarint] when the input ends inside the varint
// or the value overflows 64 bits.
func (r *Reader) Uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.err = ErrBadVarint
		return 0
	}
	r.b = r.b[n:]
	return v
}

// Varint reads a signed (zig-zag) varint (encoding/binary's format). It
// records [ErrBadVarint] like [Reader.Uvarint].
func (r *Reader) Varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.err = ErrBadVarint
		return 0
	}
	r.b = r.b[n:]
	return v
}

// Bounded reads a uvarint no larger than maxV; a larger one records a
// "number N over M" error (so a field of 32 bits, say, cannot wrap).
func (r *Reader) Bounded(maxV uint64) uint64 {
	v := r.Uvarint()
	if r.err == nil && v > maxV {
		r.err = fmt.Errorf("number %d over %d", v, maxV)
	}
	return v
}

// Fixed reads exactly n raw bytes (no length prefix); the result aliases
// the input and has capacity n, so appending to it never writes into the
// input. It records [ErrTruncated] when fewer than n bytes remain, and a
// "length N below zero" error for a negative n.
func (r *Reader) Fixed(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 {
		r.err = fmt.Errorf("length %d below zero", n)
		return nil
	}
	if len(r.b) < n {
		r.err = ErrTruncated
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// Bytes reads a byte string written by [AppendBytes]: a uvarint length,
// then that many bytes. limit is the largest length accepted, in bytes; a
// longer one records a "length N above limit M" error before anything is
// sliced, so a hostile length cannot make the caller allocate. It records
// [ErrBadVarint] for a bad length and [ErrTruncated] when fewer bytes
// remain than the length says. The result aliases the input (capacity =
// length) and is empty, not nil, for a zero length.
func (r *Reader) Bytes(limit int) []byte {
	n := r.Uvarint()
	if r.err != nil {
		return nil
	}
	if n > uint64(limit) {
		r.err = fmt.Errorf("length %d above limit %d", n, limit)
		return nil
	}
	if uint64(len(r.b)) < n {
		r.err = ErrTruncated
		return nil
	}
	v := r.b[:n:n]
	r.b = r.b[n:]
	return v
}

// RawString reads a string written by [AppendString] like [Reader.Bytes]
// (limit in bytes, same errors) without the UTF-8 check of
// [Reader.String]: for data the process wrote itself and validated then
// (its data file), read on hot paths. The result is a copy.
func (r *Reader) RawString(limit int) string {
	v := r.Bytes(limit)
	if r.err != nil {
		return ""
	}
	return string(v)
}

// String reads a string written by [AppendString] like [Reader.Bytes]
// (limit in bytes, same errors) and also records [ErrInvalidUTF8] when the
// bytes are not valid UTF-8. The result is a copy; it does not alias the
// input.
func (r *Reader) String(limit int) string {
	v := r.Bytes(limit)
	if r.err != nil {
		return ""
	}
	if !utf8.Valid(v) {
		r.err = ErrInvalidUTF8
		return ""
	}
	return string(v)
}
