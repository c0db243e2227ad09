// Package outbox owns fairshard's row model and the storage contract every
// outbox implementation honours. It is a leaf package: it imports nothing of
// fairshard's but [github.com/fairshard/fairshard/shards].
//
// # Row lifecycle
//
//	           Append                Claim                  Complete
//	(caller) ─────────▶ pending ─────────────▶ claimed ───────────────▶ done
//	                  │  ▲   ▲                  │  │
//	           Cancel │  │   └──── Retry ───────┘  │ Fail
//	                  ▼  │   (attempt+1, backoff)  ▼
//	          cancelled  └──── RearmStale ───── failed (dead letter)
//	                     ▲ (claim outlived its     │
//	                     │  visibility timeout)    │
//	                     └──────── Redrive ────────┘
//	                          (a new generation)
//
// done, failed and cancelled are terminal. A terminal row is kept as a
// tombstone for a retention window so a late duplicate Append of its
// dispatch_key reports [AppendDuplicate] instead of creating the row again.
// Done and cancelled tombstones are slim ([Slim]: no payload, no content
// type); a dead letter keeps its payload for a redrive.
//
// # Versions and copies
//
// Every change but a claim raises the row's [Version] (a redrive raises its
// generation). Copies of a row held by different nodes are reconciled by
// [Merge], a join over the order [Compare] defines: a finished row never
// goes back to live, a redriven row is never reverted by a stale copy of
// its dead letter. The transitions are shared functions ([ApplyClaim] …
// [ApplyRedrive]) so every Store applies them alike; settles are fenced by
// the claim they settle (CompleteParams.Claim and friends).
//
// # What this package does not own
//
// The fair claim planner lives in package backpressure, the bbolt
// implementation in package boltstore, the sweep-and-deliver loop in package
// dispatch. Shard ownership, handoff and HTTP live elsewhere; a Store only
// scopes its claims to the shards it is told it owns.
//
// # Concurrency
//
// Every [Store] implementation is safe for concurrent use. [Row] values are
// plain data: a Row returned by a Store is the caller's copy.
package outbox
