package node

import (
	"testing"
	"time"
)

// A pause long enough for the peers to declare the node dead is always
// above the pause threshold, for every gossip profile; and the threshold
// leaves a loaded host's scheduling delays (a few hundred ms under the
// test profiles) below it.
func TestPauseThresholdIsBelowFailureDetection(t *testing.T) {
	for _, tc := range []struct {
		profile string
		want    time.Duration
	}{
		{"lan", 2 * time.Second},
		{"shared-host", 880 * time.Millisecond},
		{"fast", 304 * time.Millisecond},
	} {
		got := pauseThreshold(tc.profile)
		detect := gossipProfile(tc.profile).MinFailureDetection()
		t.Logf("%s: threshold %v, shortest failure detection %v", tc.profile, got, detect)
		if got != tc.want {
			t.Errorf("%s: threshold %v, want %v", tc.profile, got, tc.want)
		}
		if got >= detect {
			t.Errorf("%s: threshold %v is not below the shortest failure detection %v: a pause that gets the node replaced could go unnoticed", tc.profile, got, detect)
		}
	}
}
