package node

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/outbox/memstore"
	"github.com/fairshard/fairshard/outbox/outboxtest"
)

// The dispatcher's view of the store counts claims of every shard held
// here, and keeps boltstore's one-transaction sweep (BatchClaimer): losing
// it behind the wrapper would cost one commit per route and sweep.
func TestHeldClaimsKeepsTheStoresUpgrades(t *testing.T) {
	bolt, err := boltstore.Open(filepath.Join(t.TempDir(), DataFileName), boltstore.Options{ShardCount: 64})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = bolt.Close() })
	for _, tc := range []struct {
		name  string
		store Store
		batch bool
	}{
		{"boltstore", bolt, true},
		{"memstore", memstore.New(64), false},
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
			held := heldClaims(tc.store)
			if _, ok := held.(backpressure.BatchClaimer); ok != tc.batch {
				t.Errorf("wrapped store is a BatchClaimer: %v, want %v", ok, tc.batch)
			}
			got, err := held.CountClaimedByNamespace(ctx, []string{"ns"})
			if err != nil || got["ns"] != 2 {
				t.Errorf("CountClaimedByNamespace = %v, %v; want the 2 claims still held here", got, err)
			}
		})
	}
}
