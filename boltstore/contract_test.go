package boltstore

import (
	"testing"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/outbox/outboxtest"
)

// TestStoreContract runs the shared outbox.Store suite, unchanged, against
// real bbolt files; every case's store is Check'ed at cleanup.
func TestStoreContract(t *testing.T) {
	outboxtest.RunStoreSuite(t, func(t *testing.T) outbox.Store {
		s, _ := newTestStore(t, func(o *Options) { o.ShardCount = 64 })
		return s
	})
}
