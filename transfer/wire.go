package transfer

import (
	"math"

	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/fairshard/fairshard/internal/bincodec"
	"github.com/fairshard/fairshard/outbox"
)

// ContentType is the media type of a batch in the binary encoding
// (EncodeBatch): what a node's handoff sink sends. Encoding is a copy of
// the fields, with no base64 or escaping, so it costs a fraction of JSON
// for payload-heavy rows.
const ContentType = "application/x-fairshard-rows"

// batchMagic starts every encoded batch: "FSR" and the format version 1.
var batchMagic = []byte("FSR\x01")

// ErrBadBatch is returned (wrapped) by DecodeBatch for input that is not
// a well-formed batch; the error says where it went wrong.
var ErrBadBatch = errors.New("transfer: malformed batch")

// Row status codes on the wire.
var (
	statusCodes = map[outbox.Status]byte{outbox.StatusPending: 1, outbox.StatusClaimed: 2,
		outbox.StatusDone: 3, outbox.StatusFailed: 4, outbox.StatusCancelled: 5}
	statusByCode = [...]outbox.Status{1: outbox.StatusPending, 2: outbox.StatusClaimed,
		3: outbox.StatusDone, 4: outbox.StatusFailed, 5: outbox.StatusCancelled}
)

// Time presence flags.
const (
	hasVisible = 1 << iota
	hasClaimed
	hasCreated
	hasFinished
	hasPayload
)

// EncodeBatch appends the binary encoding of rows to dst and returns it:
// the magic "FSR\x01", uvarint row count, then per row: str(dispatch_key),
// str(workflow_id), uvarint ordinal, str(namespace), str(task_queue),
// str(activity_type), str(content_type), status(1), flags(1), uvarint
// attempt, the set times as (varint unix seconds, uvarint nanos) in the
// order visible_after, claimed_at, created_at, finished_at, str(last_error),
// uvarint shard, uvarint gen, uvarint seq, and str(payload) when present
// (str(s) = uvarint len ‖ bytes). A row with an unknown status is encoded
// with status 0, which DecodeBatch refuses.
func EncodeBatch(dst []byte, rows []outbox.Row) []byte {
	dst = append(dst, batchMagic...)
	dst = binary.AppendUvarint(dst, uint64(len(rows)))
	for i := range rows {
		r := &rows[i]
		dst = bincodec.AppendString(dst, r.DispatchKey)
		dst = bincodec.AppendString(dst, r.WorkflowID)
		dst = binary.AppendUvarint(dst, r.Ordinal)
		dst = bincodec.AppendString(dst, r.Namespace)
		dst = bincodec.AppendString(dst, r.TaskQueue)
		dst = bincodec.AppendString(dst, r.ActivityType)
		dst = bincodec.AppendString(dst, r.ContentType)
		var flags byte
		times := [...]time.Time{r.VisibleAfter, r.ClaimedAt, r.CreatedAt, r.FinishedAt}
		for j, t := range times {
			if !t.IsZero() {
				flags |= 1 << j
			}
		}
		if r.Payload != nil {
			flags |= hasPayload
		}
		dst = append(dst, statusCodes[r.Status], flags)
		dst = binary.AppendUvarint(dst, uint64(r.Attempt))
		for j, t := range times {
			if flags&(1<<j) != 0 {
				dst = binary.AppendVarint(dst, t.Unix())
				dst = binary.AppendUvarint(dst, uint64(t.Nanosecond()))
			}
		}
		dst = bincodec.AppendString(dst, r.LastError)
		dst = binary.AppendUvarint(dst, uint64(r.Shard))
		dst = binary.AppendUvarint(dst, uint64(r.Version.Gen))
		dst = binary.AppendUvarint(dst, r.Version.Seq)
		if r.Payload != nil {
			dst = binary.AppendUvarint(dst, uint64(len(r.Payload)))
			dst = append(dst, r.Payload...)
		}
	}
	return dst
}

// EncodedSize is an upper bound of EncodeBatch's output for rows, to size
// its buffer.
func EncodedSize(rows []outbox.Row) int {
	n := len(batchMagic) + binary.MaxVarintLen64
	for i := range rows {
		n += outbox.RowBytes(&rows[i]) + 12*binary.MaxVarintLen64
	}
	return n
}

// DecodeBatch decodes a batch made by EncodeBatch. It refuses, with an
// error wrapping ErrBadBatch, a wrong magic, more than maxRows rows (when
// maxRows > 0), a field running past the end, an unknown status or flag,
// a time whose nanoseconds are out of range, a number out of its field's range,
// and trailing bytes. Strings are copied; payloads alias b (the caller
// hands b over). It validates the encoding only: field contents (names,
// sizes) are the store's to check.
func DecodeBatch(b []byte, maxRows int) ([]outbox.Row, error) {
	if len(b) < len(batchMagic) || string(b[:len(batchMagic)]) != string(batchMagic) {
		return nil, fmt.Errorf("%w: not a batch (magic %q)", ErrBadBatch, b[:min(len(b), len(batchMagic))])
	}
	d := bincodec.NewReader(b[len(batchMagic):])
	n := d.Uvarint()
	if d.Err() != nil {
		return nil, fmt.Errorf("%w: row count: %w", ErrBadBatch, d.Err())
	}
	if maxRows > 0 && n > uint64(maxRows) {
		return nil, fmt.Errorf("%w: %d rows, at most %d", ErrBadBatch, n, maxRows)
	}
	// Every row takes at least 20 bytes: bound the allocation by the input.
	if n > uint64(d.Len()/20+1) {
		return nil, fmt.Errorf("%w: %d rows in %d bytes", ErrBadBatch, n, d.Len())
	}
	rows := make([]outbox.Row, n)
	for i := range rows {
		r := &rows[i]
		r.DispatchKey = d.RawString(math.MaxInt)
		r.WorkflowID = d.RawString(math.MaxInt)
		r.Ordinal = d.Uvarint()
		r.Namespace = d.RawString(math.MaxInt)
		r.TaskQueue = d.RawString(math.MaxInt)
		r.ActivityType = d.RawString(math.MaxInt)
		r.ContentType = d.RawString(math.MaxInt)
		code, flags := d.Byte(), d.Byte()
		if d.Err() == nil && (int(code) >= len(statusByCode) || statusByCode[code] == "") {
			d.Fail(fmt.Errorf("status code %d", code))
		}
		if d.Err() == nil && flags&^(hasVisible|hasClaimed|hasCreated|hasFinished|hasPayload) != 0 {
			d.Fail(fmt.Errorf("unknown flags %#x", flags))
		}
		if d.Err() == nil {
			r.Status = statusByCode[code]
		}
		r.Attempt = uint32(d.Bounded(1<<32 - 1))
		for j, t := range [...]*time.Time{&r.VisibleAfter, &r.ClaimedAt, &r.CreatedAt, &r.FinishedAt} {
			if flags&(1<<j) != 0 {
				sec := d.Varint()
				nsec := d.Bounded(999_999_999)
				if d.Err() == nil {
					*t = time.Unix(sec, int64(nsec)).UTC()
				}
			}
		}
		r.LastError = d.RawString(math.MaxInt)
		r.Shard = uint32(d.Bounded(1<<32 - 1))
		r.Version.Gen = uint32(d.Bounded(1<<32 - 1))
		r.Version.Seq = d.Uvarint()
		if flags&hasPayload != 0 {
			r.Payload = d.Bytes(math.MaxInt)
		}
		if d.Err() != nil {
			return nil, fmt.Errorf("%w: row %d: %w", ErrBadBatch, i, d.Err())
		}
	}
	if d.Len() != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the last row", ErrBadBatch, d.Len())
	}
	return rows, nil
}
