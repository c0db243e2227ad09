// Package memstore is the in-memory reference implementation of
// [outbox.Store], plus the shard-level calls a node needs beside it
// (owned-shard scoping, cancel and redrive, merging incoming copies, shard
// reads with in-transfer marks for package transfer, per-shard digests, and
// the admin reads and config entries of node.go). It
// is the executable documentation of the contract and the fast store behind
// planner and dispatcher unit tests; production uses boltstore. Nothing is
// durable. Every method is safe for concurrent use; one mutex serialises
// them, and most methods scan, which is fine for tests and wrong for
// production.
package memstore

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// Store is an in-memory outbox.Store. Build one with New.
type Store struct {
	shardCount uint32
	now        func() time.Time

	mu     sync.Mutex
	rows   map[string]*outbox.Row
	marked map[string]bool   // dispatch_keys in transfer (see ReadShard)
	owned  map[uint32]bool   // nil: every shard is owned
	config map[string][]byte // SaveConfigEntry; nil until the first
	// attempts is each row's attempt history (console.go); nil until the
	// first settle.
	attempts map[string][]outbox.Attempt
	closed   bool
}

var _ outbox.Store = (*Store)(nil)

// New returns an empty store that computes shards over shardCount shards
// (0 is treated as 1) and owns every shard until SetOwnedShards is called.
func New(shardCount uint32) *Store {
	return &Store{shardCount: max(shardCount, 1), now: time.Now, rows: map[string]*outbox.Row{}, marked: map[string]bool{}}
}

// ShardCount returns the store's shard_count.
func (s *Store) ShardCount() uint32 { return s.shardCount }

// SetOwnedShards scopes claims, counts and route listings to the given
// shards. A nil slice restores "owns every shard"; an empty non-nil slice
// owns nothing.
func (s *Store) SetOwnedShards(owned []uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if owned == nil {
		s.owned = nil
		return
	}
	s.owned = make(map[uint32]bool, len(owned))
	for _, sh := range owned {
		s.owned[sh] = true
	}
}

// Close makes every later call return outbox.ErrClosed. It is idempotent.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	return nil
}

// lock checks ctx, then takes the store's mutex unless the store is
// closed. On a nil error the caller holds the mutex.
func (s *Store) lock(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return outbox.ErrClosed
	}
	return nil
}

func (s *Store) ownsShardLocked(shard uint32) bool { return s.owned == nil || s.owned[shard] }

func (s *Store) ownsLocked(r *outbox.Row) bool { return s.ownsShardLocked(r.Shard) }

func (s *Store) nowOr(t time.Time) time.Time {
	if t.IsZero() {
		return s.now().UTC()
	}
	return t
}

// Append implements outbox.Store.
func (s *Store) Append(ctx context.Context, rows []outbox.Row) ([]outbox.AppendOutcome, error) {
	for i := range rows {
		if err := outbox.ValidateForAppend(i, &rows[i]); err != nil {
			return nil, err
		}
	}
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	now := s.now().UTC()
	out := make([]outbox.AppendOutcome, len(rows))
	for i := range rows {
		if _, ok := s.rows[rows[i].DispatchKey]; ok {
			out[i] = outbox.AppendDuplicate
			continue
		}
		r := rows[i].Clone()
		outbox.NewRow(&r, now)
		r.Shard = shards.ShardOf(r.DispatchKey, s.shardCount)
		s.rows[r.DispatchKey] = &r
		out[i] = outbox.AppendCreated
	}
	return out, nil
}

func byVisibleThenKey(a, b *outbox.Row) int {
	if c := a.VisibleAfter.Compare(b.VisibleAfter); c != 0 {
		return c
	}
	return strings.Compare(a.DispatchKey, b.DispatchKey)
}

// Claim implements outbox.Store. Rows in transfer are not claimable.
func (s *Store) Claim(ctx context.Context, p outbox.ClaimParams) ([]outbox.Row, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	return s.claimLocked(p, nil), nil
}

// ClaimBatch runs every claim run makes under one hold of the lock: the
// claims take effect together when it returns nil, and none of them when
// run returns an error (each claimed row gets its earlier state back), as
// boltstore's one-transaction ClaimBatch (backpressure.BatchClaimer).
func (s *Store) ClaimBatch(ctx context.Context, run func(claim func(outbox.ClaimParams) ([]outbox.Row, error)) error) error {
	if err := s.lock(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	var undo []outbox.Row // earlier states of the rows claimed so far
	err := run(func(p outbox.ClaimParams) ([]outbox.Row, error) { return s.claimLocked(p, &undo), nil })
	if err != nil {
		for i := range undo {
			*s.rows[undo[i].DispatchKey] = undo[i]
		}
	}
	return err
}

// claimLocked claims as Claim does, with s.mu held; with undo it appends
// each claimed row's earlier state.
func (s *Store) claimLocked(p outbox.ClaimParams, undo *[]outbox.Row) []outbox.Row {
	if p.Limit <= 0 {
		return nil
	}
	var cand []*outbox.Row
	for _, r := range s.rows {
		if r.Status != outbox.StatusPending || r.VisibleAfter.After(p.Now) || !s.ownsLocked(r) || s.marked[r.DispatchKey] {
			continue
		}
		if p.Scope != nil && r.Route() != *p.Scope {
			continue
		}
		if _, held := p.ExcludeWorkflows[r.WorkflowID]; held {
			continue
		}
		cand = append(cand, r)
	}
	slices.SortFunc(cand, byVisibleThenKey)
	if len(cand) > p.Limit {
		cand = cand[:p.Limit]
	}
	out := make([]outbox.Row, 0, len(cand))
	for _, r := range cand {
		if undo != nil {
			*undo = append(*undo, r.Clone())
		}
		outbox.ApplyClaim(r, p.Now)
		out = append(out, r.Clone())
	}
	return out
}

// RearmStale implements outbox.Store.
func (s *Store) RearmStale(ctx context.Context, p outbox.RearmParams) ([]outbox.Row, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	if p.Limit <= 0 {
		return nil, nil
	}
	var cand []*outbox.Row
	for _, r := range s.rows {
		if r.Status != outbox.StatusClaimed || !r.ClaimedAt.Before(p.OlderThan) {
			continue
		}
		if _, skip := p.ExcludeKeys[r.DispatchKey]; skip {
			continue
		}
		cand = append(cand, r)
	}
	slices.SortFunc(cand, func(a, b *outbox.Row) int {
		if c := a.ClaimedAt.Compare(b.ClaimedAt); c != 0 {
			return c
		}
		return strings.Compare(a.DispatchKey, b.DispatchKey)
	})
	if len(cand) > p.Limit {
		cand = cand[:p.Limit]
	}
	out := make([]outbox.Row, 0, len(cand))
	for _, r := range cand {
		outbox.ApplyRearm(r, p.VisibleAfter)
		out = append(out, r.Clone())
	}
	return out, nil
}

// Complete implements outbox.Store.
func (s *Store) Complete(ctx context.Context, p outbox.CompleteParams) error {
	now := s.nowOr(p.Now)
	_, err := s.change(ctx, p.DispatchKey, s.recording(outbox.AttemptDone, p.StatusCode, "", now, func(r *outbox.Row) bool {
		return outbox.ApplyComplete(r, p, now)
	}))
	return err
}

// Retry implements outbox.Store.
func (s *Store) Retry(ctx context.Context, p outbox.RetryParams) error {
	apply := func(r *outbox.Row) bool { return outbox.ApplyRetry(r, p) }
	if !p.Unattempted {
		apply = s.recording(outbox.AttemptRetry, p.StatusCode, p.LastError, s.nowOr(p.Now), apply)
	}
	_, err := s.change(ctx, p.DispatchKey, apply)
	return err
}

// Fail implements outbox.Store.
func (s *Store) Fail(ctx context.Context, p outbox.FailParams) error {
	now := s.nowOr(p.Now)
	_, err := s.change(ctx, p.DispatchKey, s.recording(outbox.AttemptFailed, p.StatusCode, p.LastError, now, func(r *outbox.Row) bool {
		return outbox.ApplyFail(r, p, now)
	}))
	return err
}

// Cancel implements outbox.Store.
func (s *Store) Cancel(ctx context.Context, p outbox.CancelParams) (bool, error) {
	return s.change(ctx, p.DispatchKey, func(r *outbox.Row) bool {
		return outbox.ApplyCancel(r, p, s.nowOr(p.Now))
	})
}

// Redrive turns failed rows of namespace back to pending in a new
// generation (outbox.ApplyRedrive), visible at now: keys nil redrives every
// dead letter of the namespace, otherwise only the listed keys that are
// failed rows of it. It returns the number of rows redriven.
func (s *Store) Redrive(ctx context.Context, namespace string, keys []string, now time.Time) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	now = s.nowOr(now)
	n := 0
	redrive := func(r *outbox.Row) {
		if r.Namespace == namespace && outbox.ApplyRedrive(r, now) {
			delete(s.marked, r.DispatchKey)
			n++
		}
	}
	if keys == nil {
		for _, r := range s.rows {
			redrive(r)
		}
		return n, nil
	}
	for _, k := range keys {
		if r, ok := s.rows[k]; ok {
			redrive(r)
		}
	}
	return n, nil
}

// change applies fn to the row of key, if any; a change clears the row's
// in-transfer mark (its new state must be sent again).
func (s *Store) change(ctx context.Context, key string, fn func(*outbox.Row) bool) (bool, error) {
	if err := s.lock(ctx); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	r, ok := s.rows[key]
	if !ok || !fn(r) {
		return false, nil
	}
	delete(s.marked, key)
	return true, nil
}

func (s *Store) count(ctx context.Context, keep func(*outbox.Row) bool) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.rows {
		if s.ownsLocked(r) && keep(r) {
			n++
		}
	}
	return n, nil
}

// CountInFlight implements outbox.Store.
func (s *Store) CountInFlight(ctx context.Context, namespace string) (int, error) {
	return s.count(ctx, func(r *outbox.Row) bool {
		return r.Namespace == namespace && (r.Status == outbox.StatusPending || r.Status == outbox.StatusClaimed)
	})
}

// CountClaimed implements outbox.Store.
func (s *Store) CountClaimed(ctx context.Context, namespace string) (int, error) {
	return s.count(ctx, func(r *outbox.Row) bool {
		return r.Namespace == namespace && r.Status == outbox.StatusClaimed
	})
}

// CountClaimedByNamespace implements outbox.Store.
func (s *Store) CountClaimedByNamespace(ctx context.Context, namespaces []string) (map[string]int, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := make(map[string]int, len(namespaces))
	for _, ns := range namespaces {
		out[ns] = 0
	}
	for _, r := range s.rows {
		if r.Status != outbox.StatusClaimed || !s.ownsLocked(r) {
			continue
		}
		if n, asked := out[r.Namespace]; asked {
			out[r.Namespace] = n + 1
		}
	}
	return out, nil
}

// PendingRoutes implements outbox.Store. Rows in transfer are not listed.
func (s *Store) PendingRoutes(ctx context.Context, now time.Time) ([]outbox.ClaimScope, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	seen := map[outbox.ClaimScope]bool{}
	for _, r := range s.rows {
		if r.Status == outbox.StatusPending && !r.VisibleAfter.After(now) && s.ownsLocked(r) && !s.marked[r.DispatchKey] {
			seen[r.Route()] = true
		}
	}
	out := make([]outbox.ClaimScope, 0, len(seen))
	for sc := range seen {
		out = append(out, sc)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Namespace != out[j].Namespace {
			return out[i].Namespace < out[j].Namespace
		}
		return out[i].TaskQueue < out[j].TaskQueue
	})
	return out, nil
}

// Get implements outbox.Store.
func (s *Store) Get(ctx context.Context, dispatchKey string) (outbox.Row, error) {
	if err := s.lock(ctx); err != nil {
		return outbox.Row{}, err
	}
	defer s.mu.Unlock()
	r, ok := s.rows[dispatchKey]
	if !ok {
		return outbox.Row{}, fmt.Errorf("get %q: %w", dispatchKey, outbox.ErrNotFound)
	}
	return r.Clone(), nil
}

// Merge stores copies of rows received from other nodes: each is validated
// (the whole batch first: outbox.ErrInvalidRow, nothing written), given its
// defaults by outbox.NormalizeIncoming and its Shard, and merged with the
// stored copy by outbox.MergeIncoming. A row that changes loses its in-transfer
// mark; so does a marked row an incoming copy does not change (the copy
// came back: the sender gave it up, so our own pending CompleteTransfer
// must not delete it).
func (s *Store) Merge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
	for i := range rows {
		if err := outbox.ValidateForAppend(i, &rows[i]); err != nil {
			return outbox.MergeResult{}, err
		}
		if !rows[i].Status.Valid() {
			return outbox.MergeResult{}, fmt.Errorf("%w: rows[%d].status %q (key %q)", outbox.ErrInvalidRow, i, rows[i].Status, rows[i].DispatchKey)
		}
	}
	if err := s.lock(ctx); err != nil {
		return outbox.MergeResult{}, err
	}
	defer s.mu.Unlock()
	now := s.now().UTC()
	var res outbox.MergeResult
	for i := range rows {
		in := rows[i].Clone()
		outbox.NormalizeIncoming(&in, now)
		in.Shard = shards.ShardOf(in.DispatchKey, s.shardCount)
		old, ok := s.rows[in.DispatchKey]
		if !ok {
			s.rows[in.DispatchKey] = &in
			res.Created++
			continue
		}
		merged := outbox.MergeIncoming(*old, in)
		delete(s.marked, in.DispatchKey)
		if outbox.Compare(merged, *old) == 0 && merged.CreatedAt.Equal(old.CreatedAt) {
			res.Skipped++
			continue
		}
		*old = merged
		res.Updated++
	}
	return res, nil
}

// ForeignShards returns, ascending, the shards this node does not own that
// hold pending or terminal rows here (in transfer or not): what a handoff
// still has to move. Claimed rows finish here first.
func (s *Store) ForeignShards(ctx context.Context) ([]uint32, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	seen := map[uint32]bool{}
	for _, r := range s.rows {
		if r.Status != outbox.StatusClaimed && !s.ownsLocked(r) {
			seen[r.Shard] = true
		}
	}
	out := make([]uint32, 0, len(seen))
	for sh := range seen {
		out = append(out, sh)
	}
	slices.Sort(out)
	return out, nil
}

// cursorOf is the resume token of a row: CreatedAt (unix seconds, nanos,
// big-endian, sign-flipped so it sorts like the instant) then the key.
func cursorOf(r *outbox.Row) []byte {
	b := binary.BigEndian.AppendUint64(nil, uint64(r.CreatedAt.Unix())^(1<<63))
	b = binary.BigEndian.AppendUint32(b, uint32(r.CreatedAt.Nanosecond()))
	return append(b, r.DispatchKey...)
}

// ReadShard implements the shard read package transfer uses (see
// outbox.ShardRead): rows of p.Shard in (CreatedAt, dispatch_key) order
// after p.After, bounded by MaxRows and MaxBytes, marked in-transfer when
// p.Mark is set.
func (s *Store) ReadShard(ctx context.Context, p outbox.ShardRead) (outbox.ShardPage, error) {
	if err := s.lock(ctx); err != nil {
		return outbox.ShardPage{}, err
	}
	defer s.mu.Unlock()
	return s.readShardLocked(p)
}

// ReadShards is a marking ReadShard of several shards at once, sharing one
// budget of maxRows rows and maxBytes bytes (see boltstore.Store.ReadShards):
// it stops once the budget is spent and returns the pages it read; a shard
// this node owns gets an empty, Done page.
func (s *Store) ReadShards(ctx context.Context, reads []outbox.ShardRead, maxRows, maxBytes int) ([]outbox.ShardPage, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var pages []outbox.ShardPage
	rows, size := 0, 0
	for _, p := range reads {
		if rows >= maxRows || (maxBytes > 0 && size >= maxBytes) {
			break
		}
		if p.Shard >= s.shardCount || s.ownsShardLocked(p.Shard) {
			pages = append(pages, outbox.ShardPage{Next: p.After, Done: true})
			continue
		}
		p.Mark, p.MaxRows, p.MaxBytes = true, maxRows-rows, 0
		if maxBytes > 0 {
			p.MaxBytes = maxBytes - size
		}
		page, err := s.readShardLocked(p)
		if err != nil {
			return nil, err
		}
		rows += len(page.Rows)
		for i := range page.Rows {
			size += outbox.RowBytes(&page.Rows[i])
		}
		pages = append(pages, page)
	}
	return pages, nil
}

func (s *Store) readShardLocked(p outbox.ShardRead) (outbox.ShardPage, error) {
	page := outbox.ShardPage{Next: p.After}
	if p.MaxRows <= 0 {
		return page, nil
	}
	if p.Mark && (p.Shard >= s.shardCount || s.ownsShardLocked(p.Shard)) {
		return page, fmt.Errorf("memstore: mark rows of shard %d for transfer: %w", p.Shard, outbox.ErrShardOwned)
	}
	type entry struct {
		cur []byte
		r   *outbox.Row
	}
	var all []entry
	for _, r := range s.rows {
		if r.Shard == p.Shard {
			if c := cursorOf(r); bytes.Compare(c, p.After) > 0 {
				all = append(all, entry{c, r})
			}
		}
	}
	slices.SortFunc(all, func(a, b entry) int { return bytes.Compare(a.cur, b.cur) })
	size := 0
	page.Done = true
	for _, e := range all {
		if len(page.Rows) >= p.MaxRows {
			page.Done = false
			break
		}
		if p.Mark && (e.r.Status == outbox.StatusClaimed || s.marked[e.r.DispatchKey]) {
			page.Next = e.cur
			continue
		}
		b := outbox.RowBytes(e.r)
		if p.MaxBytes > 0 && len(page.Rows) > 0 && size+b > p.MaxBytes {
			page.Done = false
			break
		}
		size += b
		page.Rows = append(page.Rows, e.r.Clone())
		page.Next = e.cur
		if p.Mark {
			s.marked[e.r.DispatchKey] = true
		}
	}
	return page, nil
}

// CompleteTransfer deletes the rows of keys still marked in-transfer (the
// receiver made them durable); rows changed or unmarked since are kept. It
// returns the number deleted.
func (s *Store) CompleteTransfer(ctx context.Context, keys []string) (int, error) {
	return s.endTransfer(ctx, keys, true)
}

// AbortTransfer unmarks the rows of keys still marked in-transfer. It
// returns the number unmarked.
func (s *Store) AbortTransfer(ctx context.Context, keys []string) (int, error) {
	return s.endTransfer(ctx, keys, false)
}

func (s *Store) endTransfer(ctx context.Context, keys []string, del bool) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	n := 0
	for _, k := range keys {
		if !s.marked[k] {
			continue
		}
		delete(s.marked, k)
		if del {
			delete(s.rows, k)
			delete(s.attempts, k)
		}
		n++
	}
	return n, nil
}

// MarkedRows counts the rows marked in-transfer.
func (s *Store) MarkedRows(ctx context.Context) (int, error) {
	if err := s.lock(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	return len(s.marked), nil
}

// ShardDigest returns the digest of the rows of shard held here (see
// outbox.ShardDigest), computed by a scan.
func (s *Store) ShardDigest(ctx context.Context, shard uint32) (outbox.ShardDigest, error) {
	if err := s.lock(ctx); err != nil {
		return outbox.ShardDigest{}, err
	}
	defer s.mu.Unlock()
	d := outbox.ShardDigest{Shard: shard}
	for _, r := range s.rows {
		if r.Shard == shard {
			d.Add(r)
		}
	}
	return d, nil
}

// ShardDigests returns the digests of every shard holding rows here,
// ascending by shard.
func (s *Store) ShardDigests(ctx context.Context) ([]outbox.ShardDigest, error) {
	if err := s.lock(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	m := map[uint32]*outbox.ShardDigest{}
	for _, r := range s.rows {
		d := m[r.Shard]
		if d == nil {
			d = &outbox.ShardDigest{Shard: r.Shard}
			m[r.Shard] = d
		}
		d.Add(r)
	}
	out := make([]outbox.ShardDigest, 0, len(m))
	for _, d := range m {
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b outbox.ShardDigest) int { return cmp.Compare(a.Shard, b.Shard) })
	return out, nil
}
