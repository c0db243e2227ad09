package loadgen

import (
	"math"
	"slices"
	"sync"
	"time"
)

// Latencies collects durations and reports percentiles. Safe for concurrent
// use. It keeps every sample (8 bytes each): fine for the millions of rows
// a test or demo run produces.
type Latencies struct {
	mu      sync.Mutex
	samples []time.Duration
}

// Add records one sample.
func (l *Latencies) Add(d time.Duration) {
	l.mu.Lock()
	l.samples = append(l.samples, d)
	l.mu.Unlock()
}

// Count returns the number of samples.
func (l *Latencies) Count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.samples)
}

// Percentiles returns the given percentiles (0–100) of the samples, nearest
// rank; zero durations when there are no samples.
func (l *Latencies) Percentiles(ps ...float64) []time.Duration {
	l.mu.Lock()
	s := slices.Clone(l.samples)
	l.mu.Unlock()
	out := make([]time.Duration, len(ps))
	if len(s) == 0 {
		return out
	}
	slices.Sort(s)
	for i, p := range ps {
		rank := int(math.Ceil(p/100*float64(len(s)))) - 1
		out[i] = s[min(max(rank, 0), len(s)-1)]
	}
	return out
}

// Summary is a latency digest in milliseconds.
type Summary struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// Summary digests the samples.
func (l *Latencies) Summary() Summary {
	p := l.Percentiles(50, 90, 99, 100)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
	return Summary{Count: l.Count(), P50: ms(p[0]), P90: ms(p[1]), P99: ms(p[2]), Max: ms(p[3])}
}
