package cluster

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"unicode/utf8"

	"github.com/hashicorp/memberlist"
)

// ProtocolVersion is fairshard's cluster protocol version: the node-meta
// codec, the config gossip messages (kv.WireVersion) and the ownership
// function (shards.Assign) together. Nodes refuse peers that speak another
// version ([ErrProtocolMismatch]); bump it whenever any of the three
// changes incompatibly. Version 2: the config gossip moved to package kv
// (kv.WireVersion 2: tombstones carry their deletion time, full states
// their sender). Version 3: a joining node owns nothing until every peer
// answers its member query (accept.go), which version 2 nodes ignore.
const ProtocolVersion uint8 = 3

// metaFormat is the first byte of encoded node meta. A decoder reads the
// fields it knows and ignores trailing bytes, so a later format may append
// fields without breaking older nodes (a change of meaning needs a new
// ProtocolVersion instead).
const metaFormat byte = 1

// MemberState is a member's own declared state, carried in its node meta.
type MemberState string

const (
	// MemberActive is a member that owns shards.
	MemberActive MemberState = "active"
	// MemberLeaving is a member draining before a graceful leave: it owns
	// no shards, so its peers take them over, but it is still reachable at
	// its APIAddr while it hands off its rows (DESIGN.md "handoff").
	MemberLeaving MemberState = "leaving"
)

func (s MemberState) code() byte {
	if s == MemberLeaving {
		return 1
	}
	return 0
}

func memberStateFromCode(b byte) (MemberState, error) {
	switch b {
	case 0:
		return MemberActive, nil
	case 1:
		return MemberLeaving, nil
	default:
		return "", fmt.Errorf("unknown member state %d", b)
	}
}

// nodeMeta is what a node tells its peers about itself in memberlist's
// node metadata (≤ memberlist.MetaMaxSize = 512 bytes).
//
// Encoding (format 1): format byte, protocol version byte, shard count
// (uvarint), state byte, name (uvarint length + bytes), API address
// (uvarint length + bytes), then the gossip key fingerprints: a count byte
// and 4 bytes each, primary first (absent in metas written before them,
// read as none).
type nodeMeta struct {
	Protocol   uint8
	ShardCount uint32
	State      MemberState
	Name       string
	APIAddr    string
	// GossipKeys are the fingerprints (KeyFingerprint) of the member's
	// gossip keys, primary first.
	GossipKeys []string
}

func (m nodeMeta) encode() []byte {
	b := make([]byte, 0, 16+len(m.Name)+len(m.APIAddr))
	b = append(b, metaFormat, m.Protocol)
	b = binary.AppendUvarint(b, uint64(m.ShardCount))
	b = append(b, m.State.code())
	b = appendString(b, m.Name)
	b = appendString(b, m.APIAddr)
	b = append(b, byte(len(m.GossipKeys)))
	for _, fp := range m.GossipKeys {
		raw, _ := hex.DecodeString(fp) // KeyFingerprint: 8 hex digits
		b = append(b, raw...)
	}
	return b
}

// encodeChecked encodes m and checks memberlist's size limit, which
// memberlist enforces with a panic (PITFALLS).
func (m nodeMeta) encodeChecked() ([]byte, error) {
	b := m.encode()
	if len(b) > memberlist.MetaMaxSize {
		return nil, fmt.Errorf("%w: node meta is %d bytes, memberlist allows %d: shorten Name or APIAddr",
			ErrInvalidConfig, len(b), memberlist.MetaMaxSize)
	}
	return b, nil
}

func decodeMeta(b []byte) (nodeMeta, error) {
	var m nodeMeta
	r := reader{b: b}
	if len(b) == 0 {
		return m, errors.New("node meta is empty (not a fairshard node?)")
	}
	if f := r.byte(); f != metaFormat {
		return m, fmt.Errorf("node meta format %d, this node reads %d", f, metaFormat)
	}
	m.Protocol = r.byte()
	sc := r.uvarint()
	if sc > uint64(MaxShardCount) {
		return m, fmt.Errorf("node meta shard count %d above %d", sc, MaxShardCount)
	}
	m.ShardCount = uint32(sc)
	st := r.byte()
	m.Name = r.string(MaxNodeNameBytes)
	m.APIAddr = r.string(MaxAPIAddrBytes)
	if r.err == nil && len(r.b) > 0 {
		n := int(r.byte())
		if n > MaxGossipKeys {
			return nodeMeta{}, fmt.Errorf("node meta lists %d gossip keys, at most %d", n, MaxGossipKeys)
		}
		for range n {
			if len(r.b) < 4 {
				r.err = errShort
				break
			}
			m.GossipKeys = append(m.GossipKeys, hex.EncodeToString(r.b[:4]))
			r.b = r.b[4:]
		}
	}
	if r.err != nil {
		return nodeMeta{}, fmt.Errorf("node meta: %w", r.err)
	}
	var err error
	if m.State, err = memberStateFromCode(st); err != nil {
		return nodeMeta{}, fmt.Errorf("node meta: %w", err)
	}
	return m, nil
}

func appendUvarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBytes(b []byte, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

// reader decodes the little binary formats of this package without ever
// panicking: the first error sticks and later reads return zero values.
type reader struct {
	b   []byte
	err error
}

var errShort = errors.New("truncated")

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
