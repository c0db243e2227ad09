package outbox

import "time"

// The transitions below are the row lifecycle's state changes, shared by
// every Store implementation so they all move rows, raise versions and
// apply the settle fences identically. Each changes *r in place and reports
// whether it applied; when it returns false, *r is unchanged (the
// contract's no-op cases). Times are resolved by the caller (a zero
// instant in the params is the store clock's now by then).

// NewRow fills the defaults Append gives a new row: status pending, no
// claim and no finish time, Attempt 1 if zero, CreatedAt now if zero,
// VisibleAfter CreatedAt if zero, Version FirstVersion (a version the
// caller supplied is ignored: the row starts here). Shard is the store's.
func NewRow(r *Row, now time.Time) {
	r.Status = StatusPending
	NormalizeIncoming(r, now)
	r.Version = FirstVersion
}

// ApplyClaim flips a pending row to claimed at now. The Version is kept: a
// claim is local to the delivering node, ordered above the pending state by
// its status, and identified by this Version in the settle that ends it.
func ApplyClaim(r *Row, now time.Time) bool {
	if r.Status != StatusPending {
		return false
	}
	r.Status, r.ClaimedAt = StatusClaimed, now
	return true
}

// ApplyRearm flips a claimed row back to pending, visible at visibleAfter,
// keeping its Attempt; the Version moves on, so the stale claim's settles
// no longer match (its fence is the claim's Version).
func ApplyRearm(r *Row, visibleAfter time.Time) bool {
	if r.Status != StatusClaimed {
		return false
	}
	r.Status, r.ClaimedAt, r.VisibleAfter = StatusPending, time.Time{}, visibleAfter
	r.Version = r.Version.Next()
	return true
}

// holdsClaim reports whether r is claimed under the claim made at version
// claim: the fence every settle checks.
func holdsClaim(r *Row, claim Version) bool {
	return r.Status == StatusClaimed && r.Version == claim
}

// ApplyComplete marks a row done (FinishedAt now, ClaimedAt cleared, the
// row slimmed by [Slim]) if it
// is still claimed under p.Claim, or if it is pending in the claim's
// generation: the claim was re-armed (its delivery outlived the visibility
// timeout) but not claimed again, and the delivery did succeed, so
// recording it saves a duplicate. A row claimed again since (another
// Version), terminal, or redriven since (another generation) is left as it
// is.
func ApplyComplete(r *Row, p CompleteParams, now time.Time) bool {
	if !holdsClaim(r, p.Claim) && (r.Status != StatusPending || r.Version.Gen != p.Claim.Gen) {
		return false
	}
	r.Status, r.FinishedAt, r.ClaimedAt = StatusDone, now, time.Time{}
	r.Version = r.Version.Next()
	Slim(r)
	return true
}

// ApplyRetry flips a row claimed under p.Claim back to pending with Attempt
// p.NextAttempt (Attempt+1 if zero), VisibleAfter and LastError. Any other
// row (not claimed, or claimed again since) is left as it is: a stale
// claim's failure must not reschedule a newer attempt.
func ApplyRetry(r *Row, p RetryParams) bool {
	if !holdsClaim(r, p.Claim) {
		return false
	}
	r.Status, r.ClaimedAt = StatusPending, time.Time{}
	if p.NextAttempt != 0 {
		r.Attempt = p.NextAttempt
	} else {
		r.Attempt++
	}
	r.VisibleAfter, r.LastError = p.VisibleAfter, p.LastError
	r.Version = r.Version.Next()
	return true
}

// ApplyFail marks a row claimed under p.Claim failed (a dead letter;
// LastError set, FinishedAt now). Any other row is left as it is: a stale
// claim's failure must not dead-letter a row that was re-armed for another
// attempt.
func ApplyFail(r *Row, p FailParams, now time.Time) bool {
	if !holdsClaim(r, p.Claim) {
		return false
	}
	r.Status, r.LastError, r.FinishedAt, r.ClaimedAt = StatusFailed, p.LastError, now, time.Time{}
	r.Version = r.Version.Next()
	return true
}

// ApplyCancel marks a pending row cancelled (a tombstone like done;
// FinishedAt now, LastError = p.Reason when set; slimmed by [Slim]). Claimed rows are being
// delivered and cannot be withdrawn; terminal rows stay as they are.
func ApplyCancel(r *Row, p CancelParams, now time.Time) bool {
	if r.Status != StatusPending {
		return false
	}
	r.Status, r.FinishedAt = StatusCancelled, now
	if p.Reason != "" {
		r.LastError = p.Reason
	}
	r.Version = r.Version.Next()
	Slim(r)
	return true
}

// ApplyRedrive turns a failed row (a dead letter) back into a new pending
// row of the next generation: Attempt 1, LastError and FinishedAt cleared,
// visible at now. The new generation orders it above every copy of the
// dead letter, so a stale copy cannot undo the redrive.
func ApplyRedrive(r *Row, now time.Time) bool {
	if r.Status != StatusFailed {
		return false
	}
	r.Status, r.Attempt, r.LastError = StatusPending, 1, ""
	r.VisibleAfter, r.FinishedAt, r.ClaimedAt = now, time.Time{}, time.Time{}
	r.Version = r.Version.Redriven()
	return true
}

// Slim drops from a done or cancelled row what only delivery needed: the
// payload (Payload nil) and its ContentType. Such a row is a tombstone: it
// is kept for the dedupe window (the key, status, Version, times, Attempt,
// LastError, Shard and the row's identity and route stay, which is what
// dedupe, the row lookup, the indexes and the shard digest use) and will
// never be delivered again: a done or cancelled row never leaves its state
// (only a failed row is redriven, and a dead letter keeps its payload for
// that). A stored tombstone of a few dozen bytes instead of the whole row
// lets the pages its payload held be reused, so the data file stops
// growing with every fill-and-drain cycle.
//
// Any other row is left as it is. Slim does not change the Version: the
// slim and the full copy of one tombstone are the same state, and
// [DigestOf] (key, Version, status class) gives both the same digest.
// ApplyComplete and ApplyCancel slim the rows they finish, and
// [NormalizeIncoming] slims incoming copies, so every store holds and
// merges slim tombstones only. It reports whether it dropped anything.
func Slim(r *Row) bool {
	if r.Status != StatusDone && r.Status != StatusCancelled {
		return false
	}
	if r.Payload == nil && r.ContentType == "" {
		return false
	}
	r.Payload, r.ContentType = nil, ""
	return true
}

// IsSlim reports whether r is a tombstone as [Slim] leaves it: done or
// cancelled, with no payload and no content type.
func IsSlim(r *Row) bool {
	return (r.Status == StatusDone || r.Status == StatusCancelled) && r.Payload == nil && r.ContentType == ""
}
