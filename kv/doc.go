// Package kv is the gossiped cluster config: a small replicated map of
// versioned entries (namespace settings, delivery targets, workflow holds
// as opaque values) that every node holds whole, spreads by gossip and
// keeps in its store across restarts.
//
// It knows nothing of memberlist or HTTP: a host (package cluster) feeds
// it its peers' messages and full states and sends what it hands out, and
// the node layer decides what the keys and values mean.
//
// # Merge laws
//
// Every key is last-writer-wins by [Version] (a hybrid logical clock,
// then the writer's node name as the deterministic tie-break); a delete is
// a tombstone that wins like any newer write. [Merge] and [MergeMaps] are
// pure, and idempotent, commutative and associative (property-tested with
// rapid), so replicas converge whatever order and however often gossip
// delivers entries.
//
// # What a host calls
//
//   - [Store.MergeMessage] for a gossiped entry, [Store.LocalState] and
//     [Store.MergeRemoteState] for the two halves of a push/pull, and
//     [Config].Broadcast to send each accepted change on.
//   - [Store.SetMembers] whenever membership changes: who must see a
//     tombstone before it is collected.
//   - [Store.RunPersist] and [Store.RunCollect], its two loops, under the
//     host's lifecycle; then [Store.Close].
//
// # Tombstones
//
// A tombstone is collected once every member has seen it or after a
// bounded time ([Store.Collect] has the exact rule), and past a cap the
// oldest go first, so the state a push/pull sends stays bounded.
//
// # Caps
//
// A write that would take the live entries past [Config].MaxEntries, or
// their encoded size past [Config].MaxBytes, fails with a [*LimitError]
// ([ErrLimit]) and changes nothing; deletes and shrinking writes always
// pass. Together with MaxTombstones they keep a node's full state, which
// memberlist refuses above 20 MiB, far below that
// (docs/adr/0037-config-caps.md has the measured figure). Remote entries
// are always taken in (replicas must converge), so concurrent writes on
// several nodes at the cap may pass it by what those nodes wrote meanwhile.
//
// # Persistence
//
// A local write returns once the [Persister] stored it. A remote change is
// applied at once (it is in the state peers see) and persisted by
// RunPersist, which retries a failed key with backoff until it succeeds.
//
// # Concurrency
//
// A [Store] is safe for concurrent use. Merges and reads never wait on
// the Persister; local writes and persistence are serialised with each
// other. Watches ([Store.Watch]) coalesce per key and never block a
// merge.
package kv
