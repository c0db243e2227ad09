package node

import (
	"context"
	"errors"
	"fmt"
)

// ErrNoKeyFile is returned by ReloadGossipKeys on a node started without
// --gossip-key-file: there is nothing to read again.
var ErrNoKeyFile = errors.New("no --gossip-key-file to reload")

// ReloadGossipKeys reads --gossip-key-file again and makes its keys the
// node's gossip keys (cluster.SetGossipKeys: install the new ones, switch
// the primary, remove the rest), one step of a key rotation
// (docs/operations.md "Rotating the gossip key"). cmd/node calls it on
// SIGHUP. A file that cannot be read or holds a bad list changes nothing.
// Errors: ErrNoKeyFile, the file's error, cluster.ErrEncryptionOff (the
// node started without keys), or the announcement of the new fingerprints
// timed out (the keys are in use all the same).
func (n *Node) ReloadGossipKeys(ctx context.Context) error {
	if n.cfg.GossipKeyFile == "" {
		return ErrNoKeyFile
	}
	keys, err := LoadGossipKeys(n.cfg.GossipKeyFile)
	if err != nil {
		return err
	}
	if err := n.cl.SetGossipKeys(ctx, keys); err != nil {
		return fmt.Errorf("apply gossip keys from %s: %w", n.cfg.GossipKeyFile, err)
	}
	n.log.Info("gossip keys reloaded", "file", n.cfg.GossipKeyFile, "keys", n.cl.GossipKeys())
	return nil
}
