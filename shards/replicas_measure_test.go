package shards

import (
	"fmt"
	"math"
	"os"
	"slices"
	"testing"
)

// replicaBalance returns the largest member load (shard copies held, any
// position) as a multiple of the ideal Copies()·S/N; 0 for an empty table.
func replicaBalance(tab *ReplicaTable) float64 {
	if tab.Len() == 0 {
		return 0
	}
	most := 0
	for _, m := range tab.Members() {
		most = max(most, tab.HeldCount(m))
	}
	return float64(most) / (float64(tab.Copies()) * float64(tab.ShardCount()) / float64(tab.Len()))
}

// failoverHits returns, per member that owns at least one shard, the share
// of its primary shards whose owner under Assign of the other members is
// already in the shard's replica set. With one member there is nobody to
// fail over to and the result is empty.
func failoverHits(tab *ReplicaTable) []float64 {
	names := tab.Members()
	if len(names) < 2 {
		return nil
	}
	var out []float64
	for x, m := range names {
		own := tab.Owners().Owned(m)
		if len(own) == 0 {
			continue
		}
		after := Assign(slices.Delete(slices.Clone(names), x, x+1), tab.ShardCount())
		hits := 0
		for _, s := range own {
			if tab.Holds(after.Owner(s), s) {
				hits++
			}
		}
		out = append(out, float64(hits)/float64(len(own)))
	}
	return out
}

// newMemberships counts the (member, shard) pairs in after's sets that are
// not in before's: the copies a membership change must sync.
func newMemberships(before, after *ReplicaTable) int {
	n := 0
	for s := range after.ShardCount() {
		for _, m := range after.Replicas(s) {
			if !before.Holds(m, s) {
				n++
			}
		}
	}
	return n
}

func surveyNames(trial, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("node-%d-%d", trial, i)
	}
	return names
}

func pct(v []float64, p float64) float64 {
	v = slices.Clone(v)
	slices.Sort(v)
	return v[int(math.Round(p*float64(len(v)-1)))]
}

// BenchmarkReplicaSetsSurvey prints the figures recorded in
// docs/BENCHMARKS.md (a measurement, so a benchmark: go test -run '^$'
// -bench ReplicaSetsSurvey -benchtime 1x -v ./shards) and reports the
// worst balance it saw. Under -short it runs 2 trials instead of 20.
func BenchmarkReplicaSetsSurvey(b *testing.B) {
	t := b
	trials := 20
	if testing.Short() {
		trials = 2
	}
	worst := 0.0
	defer func() { b.ReportMetric(worst, "worst-balance") }()
	ns := []int{1, 2, 3, 4, 5, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32}
	if v := os.Getenv("FAIRSHARD_SURVEY_N"); v != "" {
		var n int
		fmt.Sscan(v, &n)
		ns = []int{n}
	}
	for _, shards := range []uint32{1024, 4096} {
		for _, r := range []int{2, 3} {
			for _, n := range ns {
				var bal, hits, join, leave, extra []float64
				for k := range trials {
					names := surveyNames(k, n+1)
					before := ReplicaSets(names[:n], shards, r)
					bal = append(bal, replicaBalance(before))
					h := failoverHits(before)
					hits = append(hits, h...)
					after := ReplicaSets(names, shards, r)
					ideal := float64(after.Copies()) * float64(shards) / float64(n+1)
					moved := float64(newMemberships(before, after))
					join = append(join, moved/ideal)
					extra = append(extra, (moved-ideal)/(float64(after.Copies())*math.Sqrt(float64(shards))))
					if n >= 2 {
						leaver := names[k%n]
						left := ReplicaSets(slices.Delete(slices.Clone(names[:n]), k%n, k%n+1), shards, r)
						// Ideal for a leave: the leaver's copies must be re-made elsewhere.
						leave = append(leave, float64(newMemberships(before, left))/float64(max(before.HeldCount(leaver), 1)))
					}
				}
				hm, hmed, lmed, lmax := math.NaN(), math.NaN(), math.NaN(), math.NaN()
				if len(hits) > 0 {
					hm, hmed = slices.Min(hits), pct(hits, 0.5)
				}
				if len(leave) > 0 {
					lmed, lmax = pct(leave, 0.5), slices.Max(leave)
				}
				t.Logf("| %d | %d | %d | %.2f | %.2f | %.1f %% | %.1f %% | %.2f | %.2f | %.2f | %.2f | %.2f |", shards, r, n,
					pct(bal, 0.5), slices.Max(bal), 100*hm, 100*hmed, pct(join, 0.5), slices.Max(join), slices.Max(extra), lmed, lmax)
				worst = max(worst, slices.Max(bal))
			}
		}
	}
}
