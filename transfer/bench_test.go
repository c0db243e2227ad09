package transfer_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/transfer"
)

// BenchmarkMove moves every row of a store to another (both real bbolt
// files, no network) through a Mover with the default limits, and the same
// rows through the binary batch encoding (what a node's sink sends). One op
// moves all rows; reported: rows/s and MB/s of row bytes.
//
//	go test -run '^$' -bench BenchmarkMove -benchtime 3x ./transfer
func BenchmarkMove(b *testing.B) {
	for _, tc := range []struct {
		rows, payload int
	}{{20_000, 100}, {200, 1 << 20}} {
		if testing.Short() {
			// make test runs every benchmark once with -short, for its
			// checks (every row moved): a tenth of the rows.
			tc.rows /= 10
		}
		for _, wire := range []bool{false, true} {
			b.Run(fmt.Sprintf("rows=%d/payload=%d/wire=%v", tc.rows, tc.payload, wire), func(b *testing.B) {
				var el time.Duration
				bytes := 0
				for range b.N {
					b.StopTimer()
					src, dst := openStore(b), openStore(b)
					fill(b, src, tc.rows, tc.payload)
					src.SetOwnedShards([]uint32{})
					var sink transfer.Sink = dst
					if wire {
						sink = transfer.SinkFunc(func(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error) {
							got, err := transfer.DecodeBatch(transfer.EncodeBatch(nil, rows), 0)
							if err != nil {
								return outbox.MergeResult{}, err
							}
							return dst.Merge(ctx, got)
						})
					}
					mv := newMover(b, src, transfer.MoverConfig{})
					b.StartTimer()
					start := time.Now()
					st, err := mv.Move(ctx, sink, allShards())
					el += time.Since(start)
					if err != nil || st.Rows != tc.rows {
						b.Fatalf("moved %d of %d: %v", st.Rows, tc.rows, err)
					}
					bytes += st.Bytes
				}
				b.ReportMetric(float64(tc.rows*b.N)/el.Seconds(), "rows/s")
				b.ReportMetric(float64(bytes)/1e6/el.Seconds(), "MB/s")
			})
		}
	}
}
