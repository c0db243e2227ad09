package boltstore

// ownedSet is an immutable snapshot of the shards this node owns. A new set
// is built by SetOwnedShards and swapped in atomically; readers never see a
// half-built set.
type ownedSet struct {
	all  bool     // every shard is owned (the default before SetOwnedShards)
	bits []uint64 // bit s set ⇔ shard s owned; unused when all
}

func (o *ownedSet) has(shard uint32) bool {
	if o.all {
		return true
	}
	i := shard / 64
	return int(i) < len(o.bits) && o.bits[i]&(1<<(shard%64)) != 0
}

func newOwnedSet(owned []uint32, shardCount uint32) *ownedSet {
	if owned == nil {
		return &ownedSet{all: true}
	}
	bits := make([]uint64, (shardCount+63)/64)
	n := uint32(0)
	for _, s := range owned {
		if s >= shardCount {
			continue
		}
		if bits[s/64]&(1<<(s%64)) == 0 {
			bits[s/64] |= 1 << (s % 64)
			n++
		}
	}
	if n == shardCount {
		return &ownedSet{all: true}
	}
	return &ownedSet{bits: bits}
}
