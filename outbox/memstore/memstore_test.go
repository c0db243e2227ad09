package memstore_test

import (
	"testing"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/outbox/memstore"
	"github.com/fairshard/fairshard/outbox/outboxtest"
)

func TestStoreContract(t *testing.T) {
	outboxtest.RunStoreSuite(t, func(t *testing.T) outbox.Store {
		s := memstore.New(64)
		t.Cleanup(func() { _ = s.Close() })
		return s
	})
}
