package transfer_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
	"github.com/fairshard/fairshard/transfer"
)

// oneShardSource is a Source without ReadShards: Move reads it one shard
// at a time.
type oneShardSource struct{ transfer.Source }

// TestMoveOneShardAtATime: over a source that reads one shard per call,
// Move skips a shard the source owns again (ErrShardOwned) without an
// error, moves the others, and on a read failure goes on to the next
// shard and returns the first failure naming its shard.
func TestMoveOneShardAtATime(t *testing.T) {
	src, dst := openStore(t), openStore(t)
	keys := fill(t, src, 120, 10)
	owned := uint32(5)
	src.SetOwnedShards([]uint32{owned})
	mv := newMover(t, oneShardSource{src}, transfer.MoverConfig{Limits: transfer.Limits{MaxRows: 25}})
	st, err := mv.Move(ctx, dst, allShards())
	if err != nil {
		t.Fatal(err)
	}
	ownedRows := 0
	for _, k := range keys {
		if shards.ShardOf(k, shardCount) == owned {
			ownedRows++
		}
	}
	if st.Rows != len(keys)-ownedRows || st.Deleted != st.Rows {
		t.Fatalf("moved %d rows, deleted %d; want %d (all but shard %d's)", st.Rows, st.Deleted, len(keys)-ownedRows, owned)
	}

	failing, dst2 := openStore(t), openStore(t)
	fill(t, failing, 10, 10)
	failing.SetOwnedShards([]uint32{})
	if err := failing.Close(); err != nil {
		t.Fatal(err)
	}
	mv = newMover(t, oneShardSource{failing}, transfer.MoverConfig{})
	st, err = mv.Move(ctx, dst2, []uint32{3, 4})
	if !errors.Is(err, outbox.ErrClosed) || !strings.Contains(err.Error(), "shard 3: mark rows for transfer: ") || st.Rows != 0 {
		t.Fatalf("move from a closed store: %+v %v; want no rows and shard 3's ErrClosed", st, err)
	}
}

// TestMoveStopsOnACancelledContext: a cancelled Move returns the
// context's error and marks nothing.
func TestMoveStopsOnACancelledContext(t *testing.T) {
	src, dst := openStore(t), openStore(t)
	fill(t, src, 50, 10)
	src.SetOwnedShards([]uint32{})
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	mv := newMover(t, src, transfer.MoverConfig{})
	st, err := mv.Move(cctx, dst, allShards())
	if !errors.Is(err, context.Canceled) || st.Rows != 0 {
		t.Fatalf("cancelled move: %+v %v, want context.Canceled and no rows", st, err)
	}
	if n, err := src.MarkedRows(ctx); err != nil || n != 0 {
		t.Fatalf("%d rows marked after a cancelled move (%v)", n, err)
	}
}
