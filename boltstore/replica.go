package boltstore

import (
	"context"
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// ClaimedByShard returns, per shard holding claimed rows here (owned or
// not), how many: a new primary waits until no other member holds
// claimed rows of a shard it takes over, so the rows its old primary is
// delivering are not delivered twice (package replication). It first
// waits for the write transaction in progress, if any (awaitWrites), so
// the answer includes every claim begun before the call. Cost: that wait
// (at most one batch) and one pass over the per-shard counters.
func (s *Store) ClaimedByShard(ctx context.Context) (map[uint32]int64, error) {
	// A claim reads the claim scope inside the writer's transaction, so a
	// batch begun before a scope change may still commit claims of shards
	// this node no longer owns: wait for it, or a new primary's handover
	// check could read "nothing claimed" just before such a claim lands
	// (TestScaleIn saw rows delivered twice across a graceful leave).
	if err := s.awaitWrites(ctx); err != nil {
		return nil, err
	}
	out := map[uint32]int64{}
	err := s.view(ctx, "count claimed rows per shard", func(_ *bolt.Tx, b buckets) error {
		return b.shards.ForEach(func(k, v []byte) error {
			if len(k) != 4 {
				return fmt.Errorf("%w: shards key %x", ErrCorrupt, k)
			}
			c, err := decodeCounts(v, shCountsLen)
			if err != nil {
				return fmt.Errorf("%w: shard %x counters", ErrCorrupt, k)
			}
			if c[shClaimed] > 0 {
				out[binary.BigEndian.Uint32(k)] = c[shClaimed]
			}
			return nil
		})
	})
	return out, err
}
