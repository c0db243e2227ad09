package replication

import (
	"context"
	"errors"

	"github.com/fairshard/fairshard/outbox"
)

// Peers is how a Replicator reaches the other members (their Replicators,
// through the node-to-node API). Every call names the member by its API
// address (host:port). HTTPPeers is the implementation nodes use; Handler
// serves the other end.
type Peers interface {
	// Forward hands rows to a member of their replica sets acting as the
	// write coordinator (Replicator.Write there). Rows carry delays, not
	// instants: VisibleAfter − CreatedAt is the row's delay, and the
	// coordinator stamps both by its own clock (a receiver whose clock
	// runs ahead must not delay a row). It returns one Outcome per row, or
	// an error wrapping ErrNotReplica (the member is in none of the rows'
	// sets by its view), ErrInsufficientCopies (the write-copies minimum
	// was not met there) or a transport error.
	Forward(ctx context.Context, addr string, rows []outbox.Row) ([]Outcome, error)
	// Append stores new rows on a backup as Local.Append does (insert or
	// ignore by dispatch_key) and returns its outcomes, once durable.
	Append(ctx context.Context, addr string, rows []outbox.Row) ([]outbox.AppendOutcome, error)
	// Merge merges copies of rows into the member's store (outbox.Merge),
	// answered once durable.
	Merge(ctx context.Context, addr string, rows []outbox.Row) (outbox.MergeResult, error)
	// States returns the member's state of shards (nil: every shard it
	// holds or is a replica of): digest and whether it counts as synced.
	States(ctx context.Context, addr string, shards []uint32) (StatesReply, error)
	// ReadShards reads pages of shards on the member (copy reads: nothing
	// marked), for shard sync: reads[i] from its After, in order, sharing
	// one budget of maxRows rows and maxBytes bytes (a page holds at least
	// one row when one remains). It stops once the budget is spent, so it
	// may return fewer pages than reads; pages[i] answers reads[i].
	ReadShards(ctx context.Context, addr string, reads []outbox.ShardRead, maxRows, maxBytes int) ([]outbox.ShardPage, error)
	// Keys returns one page of the key/version list of a shard on the
	// member, for repair.
	Keys(ctx context.Context, addr string, shard uint32, after []byte, maxKeys int) (KeyPage, error)
	// Rows returns the member's copies of keys, read in order until about
	// maxBytes of rows were gathered (at least one key is examined), and
	// how many keys it examined: keys examined and not returned are not
	// held there; the caller asks again for keys[examined:].
	Rows(ctx context.Context, addr string, keys []string, maxBytes int) (rows []outbox.Row, examined int, err error)
	// Missing asks the member which of the key/versions it lacks (absent,
	// or held at an older version): the indexes of kvs to send. Synced
	// reports, per shard of kvs, whether the member counts as a synced
	// copy of it.
	Missing(ctx context.Context, addr string, kvs []KeyVersion) (MissingReply, error)
}

// Errors a coordinator answers a forwarded write with.
var (
	// ErrNotReplica: the member asked to coordinate a write is not in the
	// row's replica set by its own view (views differ for a moment after
	// a membership change); the sender tries the next replica.
	ErrNotReplica = errors.New("replication: not a replica of the row's shard")
	// ErrInsufficientCopies: fewer members of a row's replica set than the
	// write-copies minimum made the row durable; the append is refused
	// (HTTP 503 with Retry-After) and may be retried as it is.
	ErrInsufficientCopies = errors.New("replication: write-copies minimum not met")
	// ErrNoReplica: a row's shard has no live replica (no active member).
	ErrNoReplica = errors.New("replication: shard has no live replica")
	// ErrRefused: the member takes no rows (it is leaving).
	ErrRefused = errors.New("replication: member refuses rows")
)

// Outcome is one row's answer to a write.
type Outcome struct {
	// Status is outbox.AppendCreated or outbox.AppendDuplicate, as the
	// coordinator's store answered.
	Status outbox.AppendOutcome `json:"status"`
	// Node is the coordinator (the member that stored it first).
	Node string `json:"node"`
	// Copies counts the members of the row's replica set on which the row
	// is durable (fsync'd), the coordinator included.
	Copies int `json:"copies"`
}

// ShardState is one member's state of one shard.
type ShardState struct {
	Shard uint32 `json:"shard"`
	// Rows and Sum are the member's digest of the shard
	// (outbox.ShardDigest).
	Rows int64  `json:"rows"`
	Sum  uint64 `json:"sum"`
	// Replica: the member is in the shard's replica set by its view.
	Replica bool `json:"replica"`
	// Synced: the member is a replica and counts as a synced copy (it
	// held the shard through the last membership change, or finished a
	// shard sync since it joined the set).
	Synced bool `json:"synced"`
	// Claimed counts the shard's rows the member has claimed and not yet
	// settled (it is delivering them); Unshipped reports state changes of
	// the shard it has not yet shipped to every backup. A new primary
	// claims from the shard only once every other live member reports
	// neither (handover.go).
	Claimed   int64 `json:"claimed,omitempty"`
	Unshipped bool  `json:"unshipped,omitempty"`
	// Primary is the shard's primary by the member's view ("" before it
	// applies one). A new primary claims only once every other live
	// member names it here: a member whose view still names itself (two
	// nodes joining at once give short-lived views that differ) could
	// claim a row of the shard after answering "nothing claimed".
	Primary string `json:"primary,omitempty"`
}

// StatesReply is a member's answer to States.
type StatesReply struct {
	// Node is the member's name.
	Node string `json:"node"`
	// Joined reports whether the member applies a membership view yet
	// (false while it waits to join: its states say nothing).
	Joined bool `json:"joined"`
	// States lists the shards asked (or every shard it holds or replicates),
	// ascending.
	States []ShardState `json:"states"`
}

// KeyVersion is what repair compares: a row's key and version, and its
// status (claimed is reported as pending: claims are local).
type KeyVersion struct {
	Key     string         `json:"key"`
	Shard   uint32         `json:"shard"`
	Version outbox.Version `json:"version"`
	Status  outbox.Status  `json:"status"`
}

// KeyPage is one page of a shard's key/version list.
type KeyPage struct {
	Keys []KeyVersion `json:"keys"`
	// Next is the resume token after the page; Done: no key follows it.
	Next []byte `json:"next,omitempty"`
	Done bool   `json:"done"`
}

// MissingReply answers Missing.
type MissingReply struct {
	// Need lists the indexes of the asked key/versions the member lacks.
	Need []int `json:"need"`
	// Synced maps each shard of the asked keys to whether the member is a
	// synced replica of it.
	Synced map[uint32]bool `json:"synced"`
}

// keyVersionOf is a row's KeyVersion.
func keyVersionOf(r *outbox.Row) KeyVersion {
	st := r.Status
	if st == outbox.StatusClaimed {
		st = outbox.StatusPending
	}
	return KeyVersion{Key: r.DispatchKey, Shard: r.Shard, Version: r.Version, Status: st}
}

// compareKV orders two key/versions of one key as outbox.Compare orders
// the rows, as far as versions and statuses tell: generation, terminal
// above live, then (terminal) done > cancelled > failed and the change
// counter, or (live) the change counter. Claimed equals pending. Copies
// equal here differ at most in content (the digest does not see it
// either).
func compareKV(a, b KeyVersion) int {
	ra := outbox.Row{Status: a.Status, Version: a.Version}
	rb := outbox.Row{Status: b.Status, Version: b.Version}
	if ra.Status == outbox.StatusClaimed {
		ra.Status = outbox.StatusPending
	}
	if rb.Status == outbox.StatusClaimed {
		rb.Status = outbox.StatusPending
	}
	return outbox.Compare(ra, rb)
}
