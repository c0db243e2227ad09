package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"

	"github.com/hashicorp/memberlist"
)

// Gossip encryption keys.
//
// memberlist encrypts every gossip packet and push/pull stream with the
// primary key of its keyring and decrypts with whichever installed key
// fits. A key is rotated without cutting anyone off in three steps, each
// applied to every node before the next begins (the procedure of Serf and
// Consul, whose keyring this is):
//
//  1. install the new key beside the old one: keys [old, new];
//  2. make the new key primary: [new, old];
//  3. remove the old key: [new].
//
// At every moment of every step any two nodes share a key one encrypts
// with and the other can decrypt. SetGossipKeys applies a step to a
// running node; each member's key fingerprints travel in its node meta
// (Member.GossipKeys), so any node's view shows whether a step has reached
// every member before the next one starts.

// MaxGossipKeys bounds Config.GossipKeys and SetGossipKeys: one rotation
// needs two; a few more leave room for an overlapping one.
const MaxGossipKeys = 4

// ErrEncryptionOff is returned by SetGossipKeys on a node started without
// gossip encryption: memberlist fixes encryption on or off at start, so
// turning it on needs every node restarted with keys.
var ErrEncryptionOff = errors.New("cluster: gossip encryption was off at start")

// validateGossipKeys checks a key list: 1..MaxGossipKeys keys of 16, 24
// or 32 bytes, no key twice.
func validateGossipKeys(keys [][]byte) error {
	if len(keys) == 0 {
		return errors.New("no key")
	}
	if len(keys) > MaxGossipKeys {
		return fmt.Errorf("%d keys, at most %d", len(keys), MaxGossipKeys)
	}
	for i, k := range keys {
		if n := len(k); n != 16 && n != 24 && n != 32 {
			return fmt.Errorf("key %d is %d bytes, want 16, 24 or 32 (AES-128/192/256)", i+1, n)
		}
		for j := range i {
			if bytes.Equal(keys[j], k) {
				return fmt.Errorf("keys %d and %d are the same key", j+1, i+1)
			}
		}
	}
	return nil
}

// KeyFingerprint returns the fingerprint fairshard shows for a gossip key:
// the first 4 bytes of its SHA-256, in hex (8 characters). It names a key
// in logs, node meta and /v1/cluster without revealing it.
func KeyFingerprint(key []byte) string {
	sum := sha256.Sum256(key)
	return hex.EncodeToString(sum[:4])
}

func fingerprints(keys [][]byte) []string {
	out := make([]string, len(keys))
	for i, k := range keys {
		out[i] = KeyFingerprint(k)
	}
	return out
}

// installedKeys returns this node's keyring, primary first (memberlist
// keeps it at index 0); nil without encryption.
func (c *Cluster) installedKeys() [][]byte {
	if c.keyring == nil {
		return nil
	}
	return slices.Clone(c.keyring.GetKeys())
}

// GossipKeys returns the fingerprints (KeyFingerprint) of this node's
// gossip keys, primary first; empty without encryption.
func (c *Cluster) GossipKeys() []string { return fingerprints(c.installedKeys()) }

// SetGossipKeys makes keys (primary first) this node's gossip keys: it
// installs the new ones, switches the primary to keys[0], removes the
// installed keys not in keys, in that order, and then announces the new
// fingerprints in its node meta (bounded like SetLeaving's announcement;
// ctx's deadline applies). Apply one rotation step to every node before the
// next (see the notes above). Errors: ErrEncryptionOff, ErrShutdown, an
// invalid list (wrapping ErrInvalidConfig; nothing changed), or the
// announcement timed out (the keys are in use all the same).
func (c *Cluster) SetGossipKeys(ctx context.Context, keys [][]byte) error {
	if c.shutdown.Load() {
		return ErrShutdown
	}
	if c.keyring == nil {
		return fmt.Errorf("%w: start every node with gossip keys to turn it on", ErrEncryptionOff)
	}
	if err := validateGossipKeys(keys); err != nil {
		return fmt.Errorf("%w: gossip keys: %v", ErrInvalidConfig, err)
	}
	c.metaMu.Lock()
	before := fingerprints(c.installedKeys())
	for _, k := range keys {
		if err := c.keyring.AddKey(k); err != nil {
			c.metaMu.Unlock()
			return fmt.Errorf("install gossip key %s: %w", KeyFingerprint(k), err)
		}
	}
	if err := c.keyring.UseKey(keys[0]); err != nil {
		c.metaMu.Unlock()
		return fmt.Errorf("make gossip key %s primary: %w", KeyFingerprint(keys[0]), err)
	}
	var drop [][]byte // collected first: RemoveKey rewrites the ring's slice in place
	for _, k := range c.keyring.GetKeys() {
		if !slices.ContainsFunc(keys, func(w []byte) bool { return bytes.Equal(k, w) }) {
			drop = append(drop, bytes.Clone(k))
		}
	}
	for _, k := range drop {
		if err := c.keyring.RemoveKey(k); err != nil {
			c.metaMu.Unlock()
			return fmt.Errorf("remove gossip key %s: %w", KeyFingerprint(k), err)
		}
	}
	meta, err := c.encodeMeta(c.state)
	if err != nil {
		c.metaMu.Unlock()
		return err
	}
	c.meta.Store(&meta)
	c.metaMu.Unlock()

	after := c.GossipKeys()
	c.log.Info("gossip keys changed", "before", before, "after", after, "primary", after[0])
	c.Recompute()
	if err := c.announce(ctx, "gossip keys", c.ml.UpdateNode); err != nil {
		return fmt.Errorf("announce the gossip keys of node %q: %w", c.name, err)
	}
	return nil
}

// newKeyring builds memberlist's keyring from cfg: GossipKeys, or the
// single SecretKey; nil (no encryption) without either.
func newKeyring(cfg *Config) (*memberlist.Keyring, error) {
	keys := cfg.GossipKeys
	if len(keys) == 0 && len(cfg.SecretKey) > 0 {
		keys = [][]byte{cfg.SecretKey}
	}
	if len(keys) == 0 {
		return nil, nil
	}
	return memberlist.NewKeyring(keys, keys[0])
}
