package node

import (
	"errors"
	"fmt"
	"testing"

	"github.com/fairshard/fairshard/cluster"
)

// TestJoinTallyCountsOnlyCompletedAttempts: a run of failed state exchanges
// refuses the start however the join wait ends. Before joinTally, an
// attempt cut off by the wait counted as "no seed answered" and reset the
// run, so TestStartFailsWhenTheStateExchangeFails failed in CI under load
// (the node served alone beside the cluster that had refused it).
func TestJoinTallyCountsOnlyCompletedAttempts(t *testing.T) {
	exchange := fmt.Errorf("join 127.0.0.1:7946: %w", cluster.ErrStateExchange)
	for _, tc := range []struct {
		name     string
		outcomes []error
		refused  bool
	}{
		{"no attempt completed", nil, false},
		{"one failed exchange may be a seed shutting down", []error{exchange}, false},
		{"two failed exchanges", []error{exchange, exchange}, true},
		{"a seed that stopped answering ends the run", []error{exchange, exchange, cluster.ErrNoPeers}, false},
		{"the run starts again", []error{exchange, cluster.ErrNoPeers, exchange, exchange}, true},
		{"another failure between breaks the run", []error{exchange, errors.New("dial tcp: i/o timeout"), exchange}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var tally joinTally
			for _, err := range tc.outcomes {
				tally.record(err)
			}
			if got := tally.refusedByExchange(); got != tc.refused {
				t.Fatalf("after %v: refused = %v, want %v", tc.outcomes, got, tc.refused)
			}
			if tc.refused && !errors.Is(tally.last, cluster.ErrStateExchange) {
				t.Fatalf("last = %v, want the run's state exchange error", tally.last)
			}
		})
	}
}
