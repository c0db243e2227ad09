package outbox

import (
	"bytes"
	"cmp"
	"fmt"
	"strings"
	"time"
)

// Version is the durable version of one row's state. Copies of a row held
// by different nodes (a handoff resent, a duplicate left by a partition, a
// replica) are reconciled by [Merge], which keeps the copy that is greater
// in the order [Compare] defines; Version is the main part of that order.
//
// Gen (the generation) starts at 0 and is raised only by a redrive, the one
// transition that leaves a terminal state. Seq counts the row's durable
// changes: [FirstVersion] at Append, +1 on every Retry, re-arm, Complete,
// Fail, Cancel and Redrive. A claim does not raise Seq: claims are local to
// the node delivering the row (they are not handed off or replicated), and
// a claimed row is already ordered above the pending row it came from by
// its status (see Compare); every way out of a claim (settle, re-arm,
// redrive) raises Seq, so a claim is identified by the Version it was made
// at, which is what settles are fenced with (CompleteParams.Claim and
// friends).
//
// The zero Version is what a row has when nothing says otherwise: a row
// written by a data file of format 1, or received from a node that does not
// send versions. It orders below every versioned state of the same
// generation and class, so an upgraded node's newer state wins.
//
// Rules and reasons: docs/adr/0008-row-versions-and-the-merge-lattice.md.
type Version struct {
	// Gen is the redrive generation: 0 from Append, +1 per redrive.
	Gen uint32 `json:"gen"`
	// Seq is the change counter within the row's life (never lowered).
	Seq uint64 `json:"seq"`
}

// FirstVersion is the Version Append gives a new row.
var FirstVersion = Version{Gen: 0, Seq: 1}

// Next is v after one more change of the row.
func (v Version) Next() Version { return Version{Gen: v.Gen, Seq: v.Seq + 1} }

// Redriven is v after a redrive: a new generation (and a change).
func (v Version) Redriven() Version { return Version{Gen: v.Gen + 1, Seq: v.Seq + 1} }

// IsZero reports whether v is the zero (unknown) Version.
func (v Version) IsZero() bool { return v == Version{} }

// String renders v as "gen.seq", e.g. "1.7".
func (v Version) String() string { return fmt.Sprintf("%d.%d", v.Gen, v.Seq) }

// terminalRank orders terminal statuses of one generation: a done row was
// delivered, which outranks an operator's cancel, which outranks a dead
// letter (the row can still be redriven, and a cancel or a delivery ends
// that). Live statuses rank 0.
func terminalRank(s Status) int {
	switch s {
	case StatusDone:
		return 3
	case StatusCancelled:
		return 2
	case StatusFailed:
		return 1
	}
	return 0
}

// liveRank orders live statuses at one (Gen, Seq): a claim is above the
// pending state it was made from.
func liveRank(s Status) int {
	switch s {
	case StatusClaimed:
		return 2
	case StatusPending:
		return 1
	}
	return 0
}

// Compare orders two copies of one row (same DispatchKey): negative when a
// is older than b, positive when newer, 0 when they are the same state.
// It is a total order:
//
//  1. Version.Gen: a redriven row (higher generation) is newer than any
//     copy of an earlier generation, dead letters included.
//  2. Terminal above live within a generation: a finished row never goes
//     back to pending or claimed because a copy carries a later change
//     counter (a stale replica, a resent handoff, a partition duplicate).
//  3. Between terminal copies: done > cancelled > failed, then Version.Seq.
//     Between live copies: Version.Seq, then claimed > pending (a claim is
//     above the state it was made from; a re-arm or retry is above the
//     claim, having raised Seq).
//  4. Ties (equal versions and status, which only a partition's two
//     primaries can produce) are broken by the row's content, field by
//     field: Attempt, VisibleAfter, FinishedAt, LastError, ClaimedAt,
//     then the immutable fields and the payload. CreatedAt is not part of
//     the order: Merge keeps the earlier one separately.
//
// Times compare as instants. Both copies are assumed valid (a known
// Status); an unknown status ranks below every known one.
func Compare(a, b Row) int {
	if c := cmp.Compare(a.Version.Gen, b.Version.Gen); c != 0 {
		return c
	}
	ta, tb := a.Status.Terminal(), b.Status.Terminal()
	switch {
	case ta && !tb:
		return 1
	case tb && !ta:
		return -1
	case ta:
		if c := cmp.Compare(terminalRank(a.Status), terminalRank(b.Status)); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Version.Seq, b.Version.Seq); c != 0 {
			return c
		}
	default:
		if c := cmp.Compare(a.Version.Seq, b.Version.Seq); c != 0 {
			return c
		}
		if c := cmp.Compare(liveRank(a.Status), liveRank(b.Status)); c != 0 {
			return c
		}
	}
	return compareContent(&a, &b)
}

// compareContent is Compare's last resort: every field but Version, Status
// (already compared) and CreatedAt, in a fixed order.
func compareContent(a, b *Row) int {
	if c := cmp.Or(
		cmp.Compare(a.Attempt, b.Attempt),
		a.VisibleAfter.Compare(b.VisibleAfter),
		a.FinishedAt.Compare(b.FinishedAt),
		strings.Compare(a.LastError, b.LastError),
		a.ClaimedAt.Compare(b.ClaimedAt),
		cmp.Compare(a.Shard, b.Shard),
		strings.Compare(a.WorkflowID, b.WorkflowID),
		cmp.Compare(a.Ordinal, b.Ordinal),
		strings.Compare(a.Namespace, b.Namespace),
		strings.Compare(a.TaskQueue, b.TaskQueue),
		strings.Compare(a.ActivityType, b.ActivityType),
		strings.Compare(a.ContentType, b.ContentType),
		bytes.Compare(a.Payload, b.Payload),
		strings.Compare(a.DispatchKey, b.DispatchKey),
		strings.Compare(string(a.Status), string(b.Status)),
	); c != 0 {
		return c
	}
	// A nil payload sorts before an empty one, so Compare is 0 only for
	// copies that are identical but for CreatedAt.
	switch {
	case a.Payload == nil && b.Payload != nil:
		return -1
	case a.Payload != nil && b.Payload == nil:
		return 1
	}
	return 0
}

// Merge reconciles two copies of one row (same DispatchKey) into one: the
// newer copy by [Compare], with CreatedAt the earlier non-zero CreatedAt
// of the two (the row existed since then). It is pure and a join: Merge is
// commutative, associative and idempotent, so copies can meet in any order,
// any number of times (a resent batch is harmless) and every node that has
// seen the same copies holds the same row. Every store applies incoming
// copies with it, after [NormalizeIncoming].
func Merge(a, b Row) Row {
	out := a
	if Compare(a, b) < 0 {
		out = b
	}
	out.CreatedAt = earlier(a.CreatedAt, b.CreatedAt)
	return out
}

// MergeIncoming is how a store applies an incoming copy in (already
// through [NormalizeIncoming]) to the row it holds, stored: [Merge], except
// that a row claimed here keeps its claim against a live copy of its own
// generation, whatever that copy's Seq. Claims are not replicated, so such
// a copy never saw this claim: it is another node's re-arm of its own
// stale claim (a restarted backup re-arms what it held) or a retry it
// scheduled while it was primary. Taking it would turn the row pending here
// while its delivery still runs, and the next sweep would deliver it again
// (a chaos run: a restarted backup's re-arm reached the primary mid
// delivery, and the primary sent the row twice). The claim's own settle
// raises Seq and meets that copy again under Merge: a done row outranks
// any live copy, a retry or re-arm is ordered by Seq. A terminal copy or
// a later generation (a redrive) still replaces the claim. Only
// CreatedAt, the earlier of the two, is taken from in then.
func MergeIncoming(stored, in Row) Row {
	if stored.Status == StatusClaimed && !in.Status.Terminal() && in.Version.Gen == stored.Version.Gen {
		stored.CreatedAt = earlier(stored.CreatedAt, in.CreatedAt)
		return stored
	}
	return Merge(stored, in)
}

// earlier returns the earlier of two instants, a zero time counting as
// "unknown" (later than any other).
func earlier(a, b time.Time) time.Time {
	switch {
	case a.IsZero():
		return b
	case b.IsZero():
		return a
	case b.Before(a):
		return b
	}
	return a
}

// NormalizeIncoming prepares a copy received from another node (handoff,
// sync, replication) for Merge, as every store does before merging: a
// claimed copy becomes pending with ClaimedAt cleared (its sender is not
// delivering it here; its Version is kept, so a local claim at the same
// Version still wins), Attempt 0 becomes 1, a zero CreatedAt becomes now
// and a zero VisibleAfter becomes CreatedAt, FinishedAt is kept only on a
// terminal row and set to now on one without it, and a done or cancelled
// copy is slimmed by [Slim] (a sender that keeps its tombstones' payloads
// sends the same state). Version is kept as sent (zero from a node that
// sends none). Append applies the same defaults to new rows.
func NormalizeIncoming(r *Row, now time.Time) {
	if r.Status == StatusClaimed {
		r.Status = StatusPending
	}
	r.Attempt = cmp.Or(r.Attempt, 1)
	if r.CreatedAt.IsZero() {
		r.CreatedAt = now
	}
	if r.VisibleAfter.IsZero() {
		r.VisibleAfter = r.CreatedAt
	}
	r.ClaimedAt = time.Time{}
	if r.Status.Terminal() {
		if r.FinishedAt.IsZero() {
			r.FinishedAt = now
		}
		Slim(r)
	} else {
		r.FinishedAt = time.Time{}
	}
}
