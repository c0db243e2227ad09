package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/internal/tick"
)

// Slot data dirs (--data-dir with "{slot}"): replicas of one compose
// service share a volume, and each takes a slot dir, "{slot}" replaced by
// slot-0, slot-1, ... Each slot holds the bbolt file, the node name bound
// to the slot when it was first used (slotNameFile) and, while a node
// serves from it, a lease file (slotLeaseFile) whose time the node renews
// every slotLeaseRefresh and removes when it leaves the cluster
// gracefully.
//
// A starting node takes (openSlot), among the slots whose file lock it
// can get:
//
//  1. a slot bound to its own node name (--node-name, by default the
//     hostname): a killed or restarted container gets its own slot, rows
//     and name back, whichever other slots a scale-in freed;
//  2. else the lowest slot whose node is not a live member: one that left
//     the cluster gracefully (no lease), or whose lease is older than
//     slotLeaseTTL (its node died more than a minute ago, longer than the
//     cluster takes to declare it dead and release its name);
//  3. else a new slot.
//
// A slot whose lease is fresh and whose name is another node's is never
// taken: that node crashed moments ago and may be restarting, and the
// cluster still counts it as a member.
const (
	slotNameFile     = "node-name"
	slotLeaseFile    = "lease"
	slotLeaseRefresh = 5 * time.Second
	slotLeaseTTL     = time.Minute
	maxSlots         = 1024
)

// slotInfo is what openSlot reads of one existing slot dir.
type slotInfo struct {
	index int
	dir   string
	name  string    // bound node name, "" if none yet
	lease time.Time // lease file's time, zero without one
}

// slotDir returns the dir of slot i under the --data-dir pattern.
func slotDir(pattern string, i int) string {
	return strings.ReplaceAll(pattern, "{slot}", "slot-"+strconv.Itoa(i))
}

// readSlots lists the existing slot dirs of pattern, by index, up to the
// first index that does not exist, which it returns too.
func readSlots(pattern string) ([]slotInfo, int) {
	var out []slotInfo
	for i := range maxSlots {
		dir := slotDir(pattern, i)
		if _, err := os.Stat(dir); err != nil {
			return out, i
		}
		si := slotInfo{index: i, dir: dir}
		if b, err := os.ReadFile(filepath.Join(dir, slotNameFile)); err == nil {
			si.name = strings.TrimSpace(string(b))
		}
		if st, err := os.Stat(filepath.Join(dir, slotLeaseFile)); err == nil {
			si.lease = st.ModTime()
		}
		out = append(out, si)
	}
	return out, maxSlots
}

// slotOrder returns the dirs to try, in the order of the rule above.
func slotOrder(slots []slotInfo, fresh int, pattern, name string, now time.Time) []string {
	var mine, free []string
	for _, s := range slots {
		switch {
		case s.name == name:
			mine = append(mine, s.dir)
		case s.name == "" || s.lease.IsZero() || now.Sub(s.lease) > slotLeaseTTL:
			free = append(free, s.dir)
		}
	}
	order := append(mine, free...)
	if fresh < maxSlots {
		order = append(order, slotDir(pattern, fresh))
	}
	return order
}

// openSlot opens the slot the rule above gives: it tries the candidates in
// order and takes the first whose lock it gets within 200 ms.
func openSlot(cfg Config, opts boltstore.Options, now time.Time) (*boltstore.Store, string, error) {
	opts.LockTimeout = 200 * time.Millisecond
	slots, fresh := readSlots(cfg.DataDir)
	for _, dir := range slotOrder(slots, fresh, cfg.DataDir, cfg.NodeName, now) {
		s, err := openIn(dir, opts)
		if errors.Is(err, boltstore.ErrLocked) {
			continue
		}
		return s, dir, err
	}
	return nil, "", fmt.Errorf("data dir %s: every slot is in use or held by a live member (%d slots)", cfg.DataDir, len(slots))
}

// slotNodeName returns the node name bound to a slot dir, binding name to
// it on first use.
func slotNodeName(dir, name string) (string, error) {
	path := filepath.Join(dir, slotNameFile)
	b, err := os.ReadFile(path)
	if err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("read node name of slot %s: %w", dir, err)
	}
	if err := os.WriteFile(path, []byte(name+"\n"), 0o640); err != nil {
		return "", fmt.Errorf("bind node name to slot %s: %w", dir, err)
	}
	return name, nil
}

// renewSlotLease writes the slot's lease file (its time is what counts).
func renewSlotLease(dir string) error {
	path := filepath.Join(dir, slotLeaseFile)
	if err := os.WriteFile(path, []byte("held by a running node; removed when it leaves the cluster\n"), 0o640); err != nil {
		return fmt.Errorf("write the lease of slot %s: %w", dir, err)
	}
	return nil
}

// slotLeaseLoop renews the slot's lease every slotLeaseRefresh until ctx
// ends.
func (n *Node) slotLeaseLoop(ctx context.Context) {
	_ = tick.Every(ctx, slotLeaseRefresh, func(context.Context) {
		if err := renewSlotLease(n.slotDir); err != nil {
			n.log.Warn("renewing the slot lease failed", "err", err)
		}
	})
}

// releaseSlot removes the slot's lease once the node has left the cluster:
// the slot is free for any node from then on.
func (n *Node) releaseSlot() {
	if n.slotDir == "" {
		return
	}
	if err := os.Remove(filepath.Join(n.slotDir, slotLeaseFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		n.log.Warn("releasing the slot lease failed", "err", err)
	}
}
