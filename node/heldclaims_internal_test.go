package node

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/outbox/memstore"
	"github.com/fairshard/fairshard/outbox/outboxtest"
)

// The node's claim rule counts the claims of every shard held here: right
// after an ownership change the rows of a shard just lost are still being
// delivered here, and counting only owned shards let the next sweep claim
// past the ceiling.
func TestClaimsCountEveryShardHeldHere(t *testing.T) {
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), DataFileName), boltstore.Options{ShardCount: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bolt.Close() })
	for _, tc := range []struct {
		name  string
		store Store
	}{
		{"boltstore", bolt},
		{"memstore", memstore.New(64)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			if _, err := tc.store.Append(ctx, []outbox.Row{outboxtest.Row("a", "ns", "q"), outboxtest.Row("b", "ns", "q")}); err != nil {
				t.Fatal(err)
			}
			if _, err := tc.store.Claim(ctx, outbox.ClaimParams{Limit: 2, Now: outboxtest.T0}); err != nil {
				t.Fatal(err)
			}
			tc.store.SetOwnedShards([]uint32{}) // the shards moved away
			got, err := (&Node{}).claims(tc.store).Claimed(ctx, []string{"ns"})
			if err != nil || got["ns"] != 2 {
				t.Errorf("claims = %v, %v; want the 2 claims still held here", got, err)
			}
		})
	}
}
