package node

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fairshard/fairshard/boltstore"
)

// claimSlot does what New does with a {slot} data dir: open the slot the
// rule gives, bind or read its name, take its lease. It returns the store,
// the slot dir and the node name the slot gives.
func claimSlot(t *testing.T, pattern, hostname string, now time.Time) (*boltstore.Store, string, string) {
	t.Helper()
	cfg := Config{DataDir: pattern, NodeName: hostname}
	s, dir, err := openSlot(cfg, boltstore.Options{ShardCount: 16, TombstoneRetention: time.Hour}, now)
	if err != nil {
		t.Fatalf("%s: open a slot: %v", hostname, err)
	}
	name, err := slotNodeName(dir, hostname)
	if err != nil {
		t.Fatal(err)
	}
	if err := renewSlotLease(dir); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s, filepath.Base(dir), name
}

// The compose reproducer: up --scale node=3, then 5, then 1; docker kill
// the survivor and up again. Before the fix the survivor came back on the
// lowest free slot, slot-0, a removed replica's, under that replica's name
// and rows, leaving its own rows in slot-3 with nobody to serve them.
func TestSlotRuleKilledReplicaGetsItsOwnSlotBack(t *testing.T) {
	pattern := filepath.Join(t.TempDir(), "{slot}")
	now := time.Now()
	stores := map[string]*boltstore.Store{}
	for _, h := range []string{"h0", "h1", "h2", "h3", "h4"} { // scale 3, then 5
		s, dir, name := claimSlot(t, pattern, h, now)
		if want := "slot-" + h[1:]; dir != want || name != h {
			t.Fatalf("%s took %s as %s; want %s as %s", h, dir, name, want, h)
		}
		stores[h] = s
	}
	for _, h := range []string{"h0", "h1", "h2", "h4"} { // scale to 1: graceful stops
		_ = stores[h].Close()
		if err := os.Remove(filepath.Join(filepath.Dir(pattern), "slot-"+h[1:], slotLeaseFile)); err != nil {
			t.Fatal(err)
		}
	}
	_ = stores["h3"].Close() // docker kill: no graceful stop, the lease stays

	_, dir, name := claimSlot(t, pattern, "h3", now) // up again: same container, same hostname
	if dir != "slot-3" || name != "h3" {
		t.Fatalf("the killed replica came back on %s as %s; want its own slot-3 as h3", dir, name)
	}
}

// A new container (a hostname no slot is bound to) takes the lowest slot
// whose node is not a live member; it never takes the slot of a node that
// crashed within slotLeaseTTL (it may be restarting, and the cluster still
// counts it), unless that lease has expired.
func TestSlotRuleNewContainerSkipsLiveMembersSlots(t *testing.T) {
	pattern := filepath.Join(t.TempDir(), "{slot}")
	now := time.Now()
	s0, _, _ := claimSlot(t, pattern, "h0", now)
	s1, _, _ := claimSlot(t, pattern, "h1", now)
	claimSlot(t, pattern, "h2", now) // stays running: locked
	_ = s0.Close()                   // graceful stop
	if err := os.Remove(filepath.Join(filepath.Dir(pattern), "slot-0", slotLeaseFile)); err != nil {
		t.Fatal(err)
	}
	_ = s1.Close() // killed: its lease is fresh

	if _, dir, name := claimSlot(t, pattern, "n1", now); dir != "slot-0" || name != "h0" {
		t.Fatalf("a new container took %s as %s; want slot-0 as h0 (left the cluster gracefully)", dir, name)
	}
	if _, dir, name := claimSlot(t, pattern, "n2", now); dir != "slot-3" || name != "n2" {
		t.Fatalf("a new container took %s as %s; want a new slot-3 as n2, not h1's slot (h1 crashed moments ago)", dir, name)
	}
	// A minute later h1 is no live member any more: its slot is free.
	if _, dir, name := claimSlot(t, pattern, "n3", now.Add(slotLeaseTTL+time.Second)); dir != "slot-1" || name != "h1" {
		t.Fatalf("after h1's lease expired a new container took %s as %s; want slot-1 as h1", dir, name)
	}
}
