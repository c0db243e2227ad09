package boltstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/fairshard/fairshard/internal/bincodec"
	"github.com/fairshard/fairshard/outbox"
)

// On-disk layout (format version 3). Every bucket is top level.
//
//	rows      dispatch_key                       → encoded row (see encodeRow)
//	byshard   group(2) ‖ time(12) ‖ dispatch_key → shard(4)  every row; group = shard mod 16, time = CreatedAt
//	pending   route ‖ time(12) ‖ dispatch_key    → 1   pending, not in transfer; time = VisibleAfter
//	claimed   time(12) ‖ dispatch_key            → 1   claimed rows; time = ClaimedAt
//	tombs     time(12) ‖ dispatch_key            → 1   done/cancelled; time = FinishedAt
//	dead      time(12) ‖ dispatch_key            → 1   failed; time = FinishedAt
//	dlq       str(namespace) ‖ dispatch_key      → 1   failed, paged by key per namespace
//	transfer  dispatch_key                       → 1   rows marked in-transfer (handoff)
//	routes    route                              → uvarint: entries of route in "pending"
//	ns        namespace                          → counts: pending, claimed, done, failed, cancelled
//	nsshard   str(namespace) ‖ shard(4)          → counts: pending, claimed
//	shards    shard(4)                           → counts: pending, claimed, terminal, in-transfer
//	digests   shard(4)                           → uvarint rows ‖ sum(8): the shard's outbox.ShardDigest
//	bundles   shard(4) ‖ first dispatch_key      → packed done/cancelled rows (bundle.go)
//	bexp      time(12) ‖ bundle key              → 1   time = the bundle's earliest FinishedAt
//	config    key                                → opaque bytes (cluster config entries)
//	meta      "format" → uvarint, "shard_count" → uint32
//
// Format 3 (this build) added the bundles and bexp buckets: done and
// cancelled rows are packed into bundles (bundle.go) by the pack pass. A
// format 1 or 2 file is upgraded when it is opened (the two buckets are
// created; its slim tombstones are packed by the next pack passes), and a
// build that reads only format 2 refuses an upgraded file.
//
// Format 2 added the row Version (row values of format 2) and
// the digests bucket. A format 1 file (written before row versions) is
// upgraded when it is opened: its digests are computed in one pass over
// the rows and the meta format becomes 2. Its row values stay as they are
// (row format 1 decodes with the zero Version) until a change rewrites
// them. A build that reads only format 1 refuses an upgraded file.
//
// route = str(namespace) ‖ str(task_queue), str(s) = uvarint(len(s)) ‖ s: a
// prefix-free encoding, so one route's keys are one contiguous key range.
// time(12) = (uint64(unix seconds) XOR 1<<63) big-endian ‖ uint32(nanos)
// big-endian: sorts like the instant, for any year.
// Counter entries whose counts are all zero are deleted, so iterating a
// counter bucket costs what is non-zero.
//
// Rows are keyed by dispatch_key alone, so keys a producer writes together
// ("{workflow_id}:{ordinal}") stay together in the B+tree and a commit
// rewrites few leaf pages. A shard's rows are found through byshard, which a
// claim or settle never touches. Its keys grow with time inside each of 16
// shard groups, so an append batch rewrites at most ~16 tail pages of it
// (per-shard ranges would rewrite up to one page per shard, ShardCount
// pages per commit: measured, that halved append throughput with 256
// shards, because every page written costs fsync time). The price is paid
// by the handoff: ReadShard reads the shard's group and skips the other
// shards' entries by value (at most ~16 entries read per row returned).
var (
	bucketRows     = []byte("rows")
	bucketByShard  = []byte("byshard")
	bucketPending  = []byte("pending")
	bucketClaimed  = []byte("claimed")
	bucketTombs    = []byte("tombs")
	bucketDead     = []byte("dead")
	bucketDLQ      = []byte("dlq")
	bucketTransfer = []byte("transfer")
	bucketRoutes   = []byte("routes")
	bucketNS       = []byte("ns")
	bucketNSShard  = []byte("nsshard")
	bucketShards   = []byte("shards")
	bucketDigests  = []byte("digests")
	bucketConfig   = []byte("config")
	bucketMeta     = []byte("meta")

	allBuckets = [][]byte{bucketRows, bucketByShard, bucketPending, bucketClaimed, bucketTombs, bucketDead,
		bucketDLQ, bucketTransfer, bucketRoutes, bucketNS, bucketNSShard, bucketShards,
		bucketConfig, bucketMeta, bucketDigests, bucketBundles, bucketBExp}

	metaFormat     = []byte("format")
	metaShardCount = []byte("shard_count")
)

// formatVersion is the file format this build writes; it also reads
// formatV1 and formatV2 files, upgrading them at Open.
const (
	formatVersion = 3
	formatV2      = 2
	formatV1      = 1
)

// Row value formats: rowV1 (file format 1) has no Version; rowV2 has one.
const (
	rowV1 = 1
	rowV2 = 2
)

const timeKeyLen = 12

var errBadValue = errors.New("malformed value")

func statusCode(s outbox.Status) byte {
	switch s {
	case outbox.StatusPending:
		return 1
	case outbox.StatusClaimed:
		return 2
	case outbox.StatusDone:
		return 3
	case outbox.StatusFailed:
		return 4
	case outbox.StatusCancelled:
		return 5
	}
	return 0
}

func statusOf(c byte) (outbox.Status, bool) {
	switch c {
	case 1:
		return outbox.StatusPending, true
	case 2:
		return outbox.StatusClaimed, true
	case 3:
		return outbox.StatusDone, true
	case 4:
		return outbox.StatusFailed, true
	case 5:
		return outbox.StatusCancelled, true
	}
	return "", false
}

func appendTimeKey(b []byte, t time.Time) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(t.Unix())^(1<<63))
	return binary.BigEndian.AppendUint32(b, uint32(t.Nanosecond()))
}

func decodeTimeKey(b []byte) time.Time {
	sec := int64(binary.BigEndian.Uint64(b) ^ (1 << 63))
	return time.Unix(sec, int64(binary.BigEndian.Uint32(b[8:]))).UTC()
}

func appendShard(b []byte, shard uint32) []byte { return binary.BigEndian.AppendUint32(b, shard) }

func rowKey(dispatchKey string) []byte { return []byte(dispatchKey) }

// byShardGroups is the number of shard groups in the byshard index.
const byShardGroups = 16

func byShardGroup(shard uint32) []byte {
	return binary.BigEndian.AppendUint16(nil, uint16(shard%byShardGroups))
}

func byShardKey(shard uint32, createdAt time.Time, dispatchKey string) []byte {
	b := make([]byte, 0, 2+timeKeyLen+len(dispatchKey))
	b = binary.BigEndian.AppendUint16(b, uint16(shard%byShardGroups))
	return append(appendTimeKey(b, createdAt), dispatchKey...)
}

func routeKey(namespace, taskQueue string) []byte {
	b := make([]byte, 0, len(namespace)+len(taskQueue)+4)
	return bincodec.AppendString(bincodec.AppendString(b, namespace), taskQueue)
}

func pendingKey(route []byte, visibleAfter time.Time, dispatchKey string) []byte {
	b := make([]byte, 0, len(route)+timeKeyLen+len(dispatchKey))
	b = append(b, route...)
	b = appendTimeKey(b, visibleAfter)
	return append(b, dispatchKey...)
}

func timeIndexKey(t time.Time, dispatchKey string) []byte {
	b := make([]byte, 0, timeKeyLen+len(dispatchKey))
	return append(appendTimeKey(b, t), dispatchKey...)
}

func dlqKey(namespace, dispatchKey string) []byte {
	b := make([]byte, 0, len(namespace)+len(dispatchKey)+2)
	return append(bincodec.AppendString(b, namespace), dispatchKey...)
}

// nsShardKey is str(namespace) ‖ shard(4): one namespace's per-shard
// counters are one contiguous key range (usually one page), so a batch
// touches one page per namespace, not one per shard.
func nsShardKey(namespace string, shard uint32) []byte {
	return appendShard(bincodec.AppendString(make([]byte, 0, 6+len(namespace)), namespace), shard)
}

// decodeRoute splits a routes-bucket key back into its scope.
func decodeRoute(b []byte) (outbox.ClaimScope, error) {
	d := bincodec.NewReader(b)
	ns := d.RawString(math.MaxInt)
	tq := d.RawString(math.MaxInt)
	if d.Err() != nil || d.Len() != 0 {
		return outbox.ClaimScope{}, fmt.Errorf("route key %x: %w", b, errBadValue)
	}
	return outbox.ClaimScope{Namespace: ns, TaskQueue: tq}, nil
}

// Row value flags.
const (
	flagVisible  = 1 << iota // VisibleAfter non-zero
	flagClaimed              // ClaimedAt non-zero
	flagCreated              // CreatedAt non-zero
	flagFinished             // FinishedAt non-zero
	flagPayload              // Payload non-nil
)

// encodeRow encodes every Row field but DispatchKey, which is the rows key:
// format(1)=rowV2 status(1) flags(1) uvarint gen, uvarint seq, uvarint
// attempt, uvarint ordinal, uvarint shard, the non-zero times as (varint
// seconds, uvarint nanos), then str(workflow_id, namespace, task_queue,
// activity_type, content_type, last_error) and, if non-nil, str(payload).
// A rowV1 value is the same without gen and seq.
func encodeRow(dst []byte, r *outbox.Row) []byte {
	var flags byte
	if !r.VisibleAfter.IsZero() {
		flags |= flagVisible
	}
	if !r.ClaimedAt.IsZero() {
		flags |= flagClaimed
	}
	if !r.CreatedAt.IsZero() {
		flags |= flagCreated
	}
	if !r.FinishedAt.IsZero() {
		flags |= flagFinished
	}
	if r.Payload != nil {
		flags |= flagPayload
	}
	dst = append(dst, rowV2, statusCode(r.Status), flags)
	dst = binary.AppendUvarint(dst, uint64(r.Version.Gen))
	dst = binary.AppendUvarint(dst, r.Version.Seq)
	dst = binary.AppendUvarint(dst, uint64(r.Attempt))
	dst = binary.AppendUvarint(dst, r.Ordinal)
	dst = binary.AppendUvarint(dst, uint64(r.Shard))
	for i, t := range [...]time.Time{r.VisibleAfter, r.ClaimedAt, r.CreatedAt, r.FinishedAt} {
		if flags&(1<<i) != 0 {
			dst = binary.AppendVarint(dst, t.Unix())
			dst = binary.AppendUvarint(dst, uint64(t.Nanosecond()))
		}
	}
	for _, s := range [...]string{r.WorkflowID, r.Namespace, r.TaskQueue, r.ActivityType, r.ContentType, r.LastError} {
		dst = bincodec.AppendString(dst, s)
	}
	if r.Payload != nil {
		dst = binary.AppendUvarint(dst, uint64(len(r.Payload)))
		dst = append(dst, r.Payload...)
	}
	return dst
}

// decodeRow decodes a rows-bucket entry. Every slice is copied: the result
// outlives the transaction.
func decodeRow(key, val []byte) (outbox.Row, error) {
	r, _, err := decodeRowPayload(key, val, true)
	return r, err
}

// decodeRowPayload is decodeRow that copies the payload only when
// withPayload is set (else Payload is nil) and returns the payload's
// length either way.
func decodeRowPayload(key, val []byte, withPayload bool) (outbox.Row, int, error) {
	var r outbox.Row
	r.DispatchKey = string(key)
	if len(val) < 3 || (val[0] != rowV1 && val[0] != rowV2) {
		return r, 0, fmt.Errorf("row %q: %w (header)", r.DispatchKey, errBadValue)
	}
	st, ok := statusOf(val[1])
	if !ok {
		return r, 0, fmt.Errorf("row %q: %w (status %d)", r.DispatchKey, errBadValue, val[1])
	}
	r.Status = st
	flags := val[2]
	d := bincodec.NewReader(val[3:])
	if val[0] == rowV2 {
		gen := d.Bounded(1<<32 - 1)
		r.Version = outbox.Version{Gen: uint32(gen), Seq: d.Uvarint()}
	}
	r.Attempt = uint32(d.Uvarint())
	r.Ordinal = d.Uvarint()
	r.Shard = uint32(d.Uvarint())
	for i, t := range [...]*time.Time{&r.VisibleAfter, &r.ClaimedAt, &r.CreatedAt, &r.FinishedAt} {
		if flags&(1<<i) != 0 {
			sec := d.Varint()
			nsec := d.Uvarint()
			*t = time.Unix(sec, int64(nsec)).UTC()
		}
	}
	r.WorkflowID = d.RawString(math.MaxInt)
	r.Namespace = d.RawString(math.MaxInt)
	r.TaskQueue = d.RawString(math.MaxInt)
	r.ActivityType = d.RawString(math.MaxInt)
	r.ContentType = d.RawString(math.MaxInt)
	r.LastError = d.RawString(math.MaxInt)
	payloadLen := 0
	if flags&flagPayload != 0 {
		p := d.Bytes(math.MaxInt)
		payloadLen = len(p)
		if withPayload && d.Err() == nil {
			r.Payload = append(make([]byte, 0, len(p)), p...)
		}
	}
	if d.Err() != nil || d.Len() != 0 {
		return r, 0, fmt.Errorf("row %q: %w", r.DispatchKey, errBadValue)
	}
	return r, payloadLen, nil
}

// counts is a fixed-arity vector of non-negative counters stored as uvarints.
type counts []int64

func decodeCounts(b []byte, n int) (counts, error) {
	c := make(counts, n)
	d := bincodec.NewReader(b)
	for i := range c {
		c[i] = int64(d.Uvarint())
	}
	if d.Err() != nil || d.Len() != 0 {
		return nil, errBadValue
	}
	return c, nil
}

func (c counts) zero() bool {
	for _, v := range c {
		if v != 0 {
			return false
		}
	}
	return true
}

func (c counts) encode() []byte {
	b := make([]byte, 0, len(c)*2)
	for _, v := range c {
		b = binary.AppendUvarint(b, uint64(v))
	}
	return b
}

// Positions in the ns counter vector.
const (
	nsPending = iota
	nsClaimed
	nsDone
	nsFailed
	nsCancelled
	nsCountsLen
)

// Positions in the nsshard counter vector.
const (
	nssPending = iota
	nssClaimed
	nssCountsLen
)

// Positions in the shards counter vector.
const (
	shPending = iota
	shClaimed
	shTerminal
	shTransfer
	shCountsLen
)

func nsIndex(s outbox.Status) int {
	switch s {
	case outbox.StatusPending:
		return nsPending
	case outbox.StatusClaimed:
		return nsClaimed
	case outbox.StatusDone:
		return nsDone
	case outbox.StatusFailed:
		return nsFailed
	default:
		return nsCancelled
	}
}

// digestVal encodes a shard digest: uvarint rows ‖ sum (8 bytes, big-endian).
func digestVal(rows int64, sum uint64) []byte {
	b := binary.AppendUvarint(make([]byte, 0, 18), uint64(rows))
	return binary.BigEndian.AppendUint64(b, sum)
}

func decodeDigest(v []byte) (rows int64, sum uint64, err error) {
	n, k := binary.Uvarint(v)
	if k <= 0 || len(v) != k+8 {
		return 0, 0, errBadValue
	}
	return int64(n), binary.BigEndian.Uint64(v[k:]), nil
}
