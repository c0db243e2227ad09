package settings

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/fairshard/fairshard/kv"
)

// ConfigStore keeps the gossiped config entries beside the node's rows,
// as opaque values by key (boltstore's config bucket; memstore's map).
type ConfigStore interface {
	SaveConfigEntry(ctx context.Context, key string, value []byte) error
	DeleteConfigEntry(ctx context.Context, key string) error
	LoadConfigEntries(ctx context.Context) (map[string][]byte, error)
}

// Persister keeps the gossiped config in the node's store, one
// JSON-encoded kv.Entry per key: the kv.Persister the node hands cluster.
type Persister struct{ Store ConfigStore }

var _ kv.Persister = Persister{}

// Save stores e under its key.
func (p Persister) Save(ctx context.Context, e kv.Entry) error {
	b, err := encodeEntry(e)
	if err != nil {
		return err
	}
	return p.Store.SaveConfigEntry(ctx, e.Key, b)
}

// Forget removes key.
func (p Persister) Forget(ctx context.Context, key string) error {
	return p.Store.DeleteConfigEntry(ctx, key)
}

// encodeEntry and decodeEntry persist config entries in the store. The
// JSON field names are those of the entries older versions persisted
// (Key, Value, Deleted, Version{Clock, Node}), plus DeletedAt.
func encodeEntry(e kv.Entry) ([]byte, error) { return json.Marshal(e) }

func decodeEntry(b []byte) (kv.Entry, error) {
	var e kv.Entry
	err := json.Unmarshal(b, &e)
	return e, err
}

// Load reads the persisted config entries for kv's Initial. A namespace's
// settings persisted by an older version as one document under
// "ns/{namespace}" are split into the per-field keys (with the document's
// version) and the document is removed, so a node upgraded in place keeps
// its pauses and quotas. Unreadable entries are skipped with a warning;
// errors are the store's.
func Load(ctx context.Context, store ConfigStore, log interface{ Warn(string, ...any) }) ([]kv.Entry, error) {
	saved, err := store.LoadConfigEntries(ctx)
	if err != nil {
		return nil, err
	}
	var out []kv.Entry
	for key, b := range saved {
		e, err := decodeEntry(b)
		if err != nil || e.Key != key {
			log.Warn("skipping unreadable persisted config entry", "key", key, "err", err)
			continue
		}
		rest, isNS := strings.CutPrefix(key, prefixNamespace)
		if !isNS || strings.Contains(rest, "/") {
			out = append(out, e)
			continue
		}
		fields, err := splitLegacyNamespace(e)
		if err != nil {
			log.Warn("skipping unreadable persisted namespace settings", "key", key, "err", err)
			continue
		}
		for _, f := range fields {
			b, err := encodeEntry(f)
			if err == nil {
				err = store.SaveConfigEntry(ctx, f.Key, b)
			}
			if err != nil {
				return nil, fmt.Errorf("migrate namespace settings %q: %w", key, err)
			}
		}
		if err := store.DeleteConfigEntry(ctx, key); err != nil {
			return nil, fmt.Errorf("migrate namespace settings %q: %w", key, err)
		}
		out = append(out, fields...)
	}
	return out, nil
}

// splitLegacyNamespace turns an "ns/{namespace}" document (the format
// before per-field keys) into its field entries, same version; a
// tombstone yields none. paused is always written (false when unset), so
// a namespace configured before stays listed.
func splitLegacyNamespace(e kv.Entry) ([]kv.Entry, error) {
	if e.Deleted {
		return nil, nil
	}
	var doc NamespaceSettings
	if err := json.Unmarshal(e.Value, &doc); err != nil {
		return nil, err
	}
	ns := strings.TrimPrefix(e.Key, prefixNamespace)
	field := func(name string, v any) kv.Entry {
		b, _ := json.Marshal(v)
		return kv.Entry{Key: nsKey(ns, name), Value: b, Version: e.Version}
	}
	out := []kv.Entry{field(fieldPaused, doc.Paused)}
	if doc.MaxInFlight != nil {
		out = append(out, field(fieldMaxInFlight, *doc.MaxInFlight))
	}
	if doc.Retry != nil {
		out = append(out, field(fieldRetry, *doc.Retry))
	}
	return out, nil
}
