package demo_test

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fairshard/fairshard/demo"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("net/http.(*persistConn).writeLoop"),
		goleak.IgnoreTopFunction("internal/poll.runtime_pollWait"))
}

// TestDemoPlainOutput runs a short demo with stdout not a terminal: it must
// print plain periodic lines (no ANSI redraws), the node join, kill and
// wipe, and graceful stop events, and a summary with two copies per row and
// lost = 0.
func TestDemoPlainOutput(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a 3-node cluster for ~10 s")
	}
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sum, err := demo.Run(ctx, demo.Options{Nodes: 3, Duration: 6 * time.Second, Rate: 400, Out: &out, TTY: false, Dir: t.TempDir()})
	text := out.String()
	if err != nil {
		t.Fatalf("demo: %v\n%s", err, text)
	}
	if strings.Contains(text, "\033[") {
		t.Fatalf("non-TTY output contains ANSI escapes:\n%s", text)
	}
	progress := regexp.MustCompile(`(?m)^t=\d+s appended=\d+ delivered=\d+ \(\d+/s\) nodes=\[.*\] copies=\d+/\d+ \| noisy pending=\d+ claimed=\d+/\d+ `)
	if n := len(progress.FindAllString(text, -1)); n < 4 {
		t.Fatalf("want ≥ 4 periodic progress lines, got %d:\n%s", n, text)
	}
	for _, want := range []string{"event: node n4 joined", "event: killed n3 and deleted its data dir", "event: stopping n2 gracefully",
		"== fairshard demo summary ==", "lost            0", "copies per row  2", "kill and wipe   n3 (data dir deleted): lost = 0"} {
		if !strings.Contains(text, want) {
			t.Fatalf("output lacks %q:\n%s", want, text)
		}
	}
	if sum.Lost != 0 || sum.Appended == 0 || int64(sum.Delivered) < sum.Appended {
		t.Fatalf("summary: appended %d delivered %d lost %d", sum.Appended, sum.Delivered, sum.Lost)
	}
	// Exact quota mode: the target never sees more of a namespace at once
	// than its quota, through the join and the leave.
	for _, ns := range sum.Namespaces {
		if q := sum.Quotas[ns.Namespace]; q > 0 && ns.MaxInFlight > int(q) {
			t.Fatalf("%s: max concurrent %d > quota %d", ns.Namespace, ns.MaxInFlight, q)
		}
	}
}
