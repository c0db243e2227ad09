package chaos

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"
)

// Run settings. Each flag has an environment variable for make and CI
// (flags win): CHAOS_DURATION, CHAOS_SEED, CHAOS_WIPE.
var (
	flagDuration = flag.Duration("chaos.duration", 0, "how long faults are injected (env CHAOS_DURATION; default 2m, the make test run)")
	flagSeed     = flag.Uint64("chaos.seed", 0, "the fault schedule's seed, to replay a run (env CHAOS_SEED; default: drawn and printed)")
	flagWipe     = flag.Bool("chaos.wipe", true, "add the kill-wipe nemesis: delete a killed node's data dir before its restart (on since replicated shards: R = 2 keeps a copy; env CHAOS_WIPE=0 turns it off)")
	flagNodes    = flag.Int("chaos.nodes", 4, "initial cluster size")
	flagRate     = flag.Float64("chaos.rate", 1, "load multiplier on the namespaces' mean rates (rows/s)")
	flagKeep     = flag.Bool("chaos.keep", false, "keep the run's work dir (node logs and data) even when it passes")
)

// defaultDuration is the short run of make test.
const defaultDuration = 2 * time.Minute

// runSettings resolves flags and environment.
type runSettings struct {
	Duration time.Duration
	Seed     uint64
	Wipe     bool
	Nodes    int
	Rate     float64
	Keep     bool
}

func settings() (runSettings, error) {
	s := runSettings{Duration: *flagDuration, Seed: *flagSeed, Wipe: *flagWipe, Nodes: *flagNodes, Rate: *flagRate, Keep: *flagKeep}
	if s.Duration == 0 {
		s.Duration = defaultDuration
		if v := os.Getenv("CHAOS_DURATION"); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				return s, fmt.Errorf("CHAOS_DURATION=%q: want a positive duration such as 30m", v)
			}
			s.Duration = d
		}
	}
	if s.Seed == 0 {
		if v := os.Getenv("CHAOS_SEED"); v != "" {
			n, err := strconv.ParseUint(v, 10, 64)
			if err != nil || n == 0 {
				return s, fmt.Errorf("CHAOS_SEED=%q: want a positive integer", v)
			}
			s.Seed = n
		} else {
			s.Seed = uint64(time.Now().UnixNano()%1_000_000_000) + 1
		}
	}
	if !flagPassed("chaos.wipe") && os.Getenv("CHAOS_WIPE") == "0" {
		s.Wipe = false
	}
	if s.Nodes < 3 || s.Nodes > 20 {
		return s, fmt.Errorf("-chaos.nodes=%d: want 3..20", s.Nodes)
	}
	if s.Rate <= 0 {
		return s, fmt.Errorf("-chaos.rate=%v: want > 0", s.Rate)
	}
	return s, nil
}

// flagPassed reports whether the named flag was set on the command line.
func flagPassed(name string) bool {
	passed := false
	flag.Visit(func(f *flag.Flag) { passed = passed || f.Name == name })
	return passed
}

// replayCommand is the command line that replays a run's schedule.
func (s runSettings) replayCommand() string {
	cmd := fmt.Sprintf("go test ./test/chaos -run TestChaos -count=1 -v -timeout %v -chaos.seed=%d -chaos.duration=%v",
		(s.Duration + 15*time.Minute).Round(time.Minute), s.Seed, s.Duration)
	if !s.Wipe {
		cmd += " -chaos.wipe=false"
	}
	if s.Nodes != 4 {
		cmd += fmt.Sprintf(" -chaos.nodes=%d", s.Nodes)
	}
	if s.Rate != 1 {
		cmd += fmt.Sprintf(" -chaos.rate=%v", s.Rate)
	}
	return cmd
}
