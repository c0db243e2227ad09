package replication

import (
	"context"
	"fmt"
	"slices"

	"github.com/fairshard/fairshard/outbox"
)

// Bulk shard sync: a node that holds none of a set of shards copies them
// from one source in a stream: each call reads pages of up to
// bulkReadShards shards (Peers.ReadShards, one budget of rows and bytes),
// the next call is in flight while the previous pages merge, and pages
// are merged here in transactions of about bulkFlushRows rows or
// bulkFlushBytes bytes. Large transactions matter: rows are keyed by
// dispatch_key, so a shard's rows land on pages all over the B+tree, and
// every commit rewrites each page it touched (merging 100,000 rows in
// 2,000-row commits ran at 17–19k rows/s here, in 10,000-row commits at
// 26–55k; past ~20,000 rows per transaction bbolt slows down again, its
// in-memory leaves growing unsplit: 3.5k rows/s at 50,000). A shard is
// marked synced once the transaction holding its last page committed.

const (
	bulkReadShards = 256
	bulkFlushRows  = 8000
	bulkFlushBytes = 32 << 20
)

// bulkCopy copies shards whole from peer into the local store and marks
// each synced as its last rows commit. It returns the number of shards it
// did not finish and the first error.
func (r *Replicator) bulkCopy(ctx context.Context, v *View, peer string, shards []uint32) (int, error) {
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan fetchedPages, 1)
	go r.readShardPages(fctx, v.Addrs[peer], shards, ch)
	var acc []outbox.Row
	accBytes := 0
	var complete []uint32 // shards whose last page is in acc
	synced := 0
	sink := pullSink{r: r, skipped: map[uint32]bool{}} // shards with a hole: not synced
	flush := func() error {
		if len(acc) > 0 {
			if _, err := sink.Merge(ctx, acc); err != nil {
				return fmt.Errorf("merge %d rows copied from %s: %w", len(acc), peer, err)
			}
			r.m.syncRows.WithLabelValues("bulk").Add(float64(len(acc)))
			r.m.syncBytes.WithLabelValues("bulk").Add(float64(accBytes))
		}
		for _, s := range complete {
			if !sink.skipped[s] && r.markSynced(v, s) {
				synced++
			}
		}
		acc, accBytes, complete = acc[:0], 0, complete[:0]
		return nil
	}
	for f := range ch {
		if f.err != nil {
			err := flush()
			if err == nil {
				err = fmt.Errorf("copy shards from %s: %w", peer, f.err)
			}
			return len(shards) - synced, err
		}
		for i, p := range f.pages {
			acc = append(acc, p.Rows...)
			accBytes += bytesOf(p.Rows)
			if p.Done || len(p.Rows) == 0 {
				complete = append(complete, f.reads[i].Shard)
			}
		}
		if len(acc) >= bulkFlushRows || accBytes >= bulkFlushBytes {
			if err := flush(); err != nil {
				return len(shards) - synced, err
			}
		}
	}
	if err := flush(); err != nil {
		return len(shards) - synced, err
	}
	if err := ctx.Err(); err != nil {
		return len(shards) - synced, err
	}
	if synced < len(shards) {
		return len(shards) - synced, fmt.Errorf("copy from %s: %d of %d shards synced (the view changed)", peer, synced, len(shards))
	}
	return 0, nil
}

// fetchedPages is one ReadShards answer of a bulk copy: the pages, the
// reads they answer (in order), or the call's error.
type fetchedPages struct {
	pages []outbox.ShardPage
	reads []outbox.ShardRead
	err   error
}

// readShardPages streams the pages of shards from the member at addr into
// ch, each call reading up to bulkReadShards shards from their cursors,
// and closes ch when every shard is read, after the first failed call
// (sent), or when ctx ends. A shard leaves the stream once a page of it
// is its last (done, or empty), and as soon as this node stops
// replicating it (a view change; all of them once it is leaving). A call
// answering no page is an error.
func (r *Replicator) readShardPages(ctx context.Context, addr string, shards []uint32, ch chan<- fetchedPages) {
	defer close(ch)
	queue := slices.Clone(shards)
	cursors := map[uint32][]byte{}
	for len(queue) > 0 {
		queue = slices.DeleteFunc(queue, func(s uint32) bool { return !r.replicatesNow(s) })
		if len(queue) == 0 {
			return
		}
		reads := make([]outbox.ShardRead, 0, min(len(queue), bulkReadShards))
		for _, s := range queue[:min(len(queue), bulkReadShards)] {
			reads = append(reads, outbox.ShardRead{Shard: s, After: cursors[s]})
		}
		cctx, ccancel := context.WithTimeout(ctx, r.cfg.CallTimeout)
		pages, err := r.cfg.Peers.ReadShards(cctx, addr, reads, 4*r.cfg.Limits.MaxRows, r.cfg.Limits.MaxBytes)
		ccancel()
		f := fetchedPages{pages: pages, reads: reads[:min(len(pages), len(reads))], err: err}
		if err == nil {
			done := map[uint32]bool{}
			for i, p := range pages {
				cursors[reads[i].Shard] = p.Next
				if p.Done || len(p.Rows) == 0 {
					done[reads[i].Shard] = true
				}
			}
			if len(pages) == 0 {
				f.err = fmt.Errorf("read of %d shards answered no page", len(reads))
			}
			queue = slices.DeleteFunc(queue, func(s uint32) bool { return done[s] })
		}
		select {
		case ch <- f:
		case <-ctx.Done():
			return
		}
		if f.err != nil {
			return
		}
	}
}
