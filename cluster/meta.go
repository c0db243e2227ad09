package cluster

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/hashicorp/memberlist"

	"github.com/fairshard/fairshard/internal/bincodec"
)

// ProtocolVersion is fairshard's cluster protocol version: the node-meta
// codec, the config gossip messages (kv.WireVersion) and the ownership
// function (shards.Assign) together. Nodes refuse peers that speak another
// version ([ErrProtocolMismatch]); bump it whenever any of the three
// changes incompatibly. Version 2: the config gossip moved to package kv
// (kv.WireVersion 2: tombstones carry their deletion time, full states
// their sender). Version 3: a joining node owns nothing until every peer
// answers its member query (accept.go), which version 2 nodes ignore.
// Version 4: the ownership function includes the replica sets
// (shards.ReplicaSets with the gossiped replication factor), and appends
// are forwarded and replicated through package replication's routes.
// Version 5: lease requests carry the sender's sequence (lease.Request
// seq), a field version 4 coordinators refuse.
const ProtocolVersion uint8 = 5

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
	b = bincodec.AppendString(b, m.Name)
	b = bincodec.AppendString(b, m.APIAddr)
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
	r := bincodec.NewReader(b)
	if len(b) == 0 {
		return m, errors.New("node meta is empty (not a fairshard node?)")
	}
	if f := r.Byte(); f != metaFormat {
		return m, fmt.Errorf("node meta format %d, this node reads %d", f, metaFormat)
	}
	m.Protocol = r.Byte()
	sc := r.Uvarint()
	if sc > uint64(MaxShardCount) {
		return m, fmt.Errorf("node meta shard count %d above %d", sc, MaxShardCount)
	}
	m.ShardCount = uint32(sc)
	st := r.Byte()
	m.Name = r.String(MaxNodeNameBytes)
	m.APIAddr = r.String(MaxAPIAddrBytes)
	if r.Err() == nil && r.Len() > 0 {
		n := int(r.Byte())
		if n > MaxGossipKeys {
			return nodeMeta{}, fmt.Errorf("node meta lists %d gossip keys, at most %d", n, MaxGossipKeys)
		}
		for range n {
			fp := r.Fixed(4)
			if r.Err() != nil {
				break
			}
			m.GossipKeys = append(m.GossipKeys, hex.EncodeToString(fp))
		}
	}
	if r.Err() != nil {
		return nodeMeta{}, fmt.Errorf("node meta: %w", r.Err())
	}
	var err error
	if m.State, err = memberStateFromCode(st); err != nil {
		return nodeMeta{}, fmt.Errorf("node meta: %w", err)
	}
	return m, nil
}
