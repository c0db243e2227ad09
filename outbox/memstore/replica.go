package memstore

import (
	"context"

	"github.com/fairshard/fairshard/outbox"
)

// ClaimedByShard returns, per shard holding claimed rows (owned or not),
// how many (see boltstore.Store.ClaimedByShard).
func (s *Store) ClaimedByShard(ctx context.Context) (map[uint32]int64, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := map[uint32]int64{}
	for _, r := range s.rows {
		if r.Status == outbox.StatusClaimed {
			out[r.Shard]++
		}
	}
	return out, nil
}
