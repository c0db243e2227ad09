package cluster_test

import (
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/cluster/clustertest"
)

// BenchmarkSuspicionUnderLoad measures how often memberlist suspects a
// live member when the machine is loaded: 5 members on loopback, in one
// process, beside 0, 20 or 40 busy-looping processes (a load average of
// about that many runnable threads on this machine's cores), for each
// gossip profile the node offers. No member fails, so every suspicion is
// false. Reported per cell: suspicions (memberlist's "Suspect X has
// failed" on a prober) per member-minute, and false deaths ("Marking X as
// failed", which makes the others take its shards). Each cell then kills
// a member and fails unless its death is counted: the counter is live.
//
//	go test -run '^$' -bench SuspicionUnderLoad -benchtime 1x ./cluster
//
// Under -short (the gate) it runs one 3 s cell without load, so it keeps
// compiling and working.
func BenchmarkSuspicionUnderLoad(b *testing.B) {
	profiles := []struct {
		name string
		cfg  func() *cluster.Config
	}{
		{"lan", cluster.DefaultConfig},
		{"fast", cluster.FastConfig},
		{"shared-host", cluster.SharedHostConfig},
	}
	loads := []int{0, 20, 40}
	window := time.Minute
	if testing.Short() {
		profiles, loads, window = profiles[2:], loads[:1], 3*time.Second
	}
	for _, load := range loads {
		for _, p := range profiles {
			b.Run(fmt.Sprintf("load=%d/%s", load, p.name), func(b *testing.B) {
				for range b.N {
					suspects, deaths := suspicionRun(b, p.cfg(), load, window)
					perMemberMinute := float64(suspects) / (5 * window.Minutes())
					b.ReportMetric(perMemberMinute, "suspicions/member-min")
					b.ReportMetric(float64(deaths), "false-deaths")
				}
			})
		}
	}
}

// suspicionRun starts 5 members with profile's memberlist timings, waits
// for them to converge, starts load busy loops and counts the suspicions
// and deaths the members log over window.
func suspicionRun(b *testing.B, profile *cluster.Config, load int, window time.Duration) (suspects, deaths int64) {
	b.Helper()
	var counting atomic.Bool
	var nSuspect, nDead atomic.Int64
	logger := slog.New(&countingHandler{on: &counting, suspects: &nSuspect, deaths: &nDead})
	h := clustertest.Start(b, 5, clustertest.Options{Configure: func(_ int, cfg *cluster.Config) {
		setTimings(cfg.Config, profile.Config)
		cfg.Logger = logger
	}})
	h.WaitConverged(30 * time.Second)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var busy []*exec.Cmd
	for range load {
		cmd := exec.CommandContext(ctx, "sh", "-c", "while :; do :; done")
		if err := cmd.Start(); err != nil {
			b.Fatalf("start a busy loop: %v", err)
		}
		busy = append(busy, cmd)
	}
	b.ResetTimer()
	counting.Store(true)
	time.Sleep(window) // the measurement: load for a fixed window
	suspects, deaths = nSuspect.Load(), nDead.Load()
	b.StopTimer()
	cancel()
	for _, cmd := range busy {
		_ = cmd.Wait()
	}

	// The counter must see a real failure, or a zero above means nothing
	// (memberlist reworded its log lines): kill a member and wait for the
	// others to declare it dead.
	nDead.Store(0)
	h.Kill(4)
	deadline := time.Now().Add(30 * time.Second)
	for nDead.Load() == 0 {
		if time.Now().After(deadline) {
			b.Fatal("no member logged the killed member's death in 30 s: the counted messages changed")
		}
		time.Sleep(50 * time.Millisecond)
	}
	counting.Store(false)
	return suspects, deaths
}

// setTimings copies a profile's failure-detection and gossip timings into
// mc, keeping its addresses.
func setTimings(mc, profile *memberlist.Config) {
	mc.TCPTimeout = profile.TCPTimeout
	mc.IndirectChecks = profile.IndirectChecks
	mc.ProbeInterval = profile.ProbeInterval
	mc.ProbeTimeout = profile.ProbeTimeout
	mc.SuspicionMult = profile.SuspicionMult
	mc.SuspicionMaxTimeoutMult = profile.SuspicionMaxTimeoutMult
	mc.AwarenessMaxMultiplier = profile.AwarenessMaxMultiplier
	mc.GossipInterval = profile.GossipInterval
	mc.GossipToTheDeadTime = profile.GossipToTheDeadTime
	mc.PushPullInterval = profile.PushPullInterval
}

// countingHandler counts memberlist's suspicion and death records while on
// is set; it keeps nothing else.
type countingHandler struct {
	on               *atomic.Bool
	suspects, deaths *atomic.Int64
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if !h.on.Load() {
		return nil
	}
	switch {
	case strings.HasPrefix(r.Message, "Suspect "):
		h.suspects.Add(1)
	case strings.HasPrefix(r.Message, "Marking ") && strings.Contains(r.Message, " as failed"):
		h.deaths.Add(1)
	}
	return nil
}

func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }
