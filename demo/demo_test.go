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
// state the tenants, their load and quotas and the console's address up
// front, print plain periodic lines (no ANSI redraws) of at most 120
// characters, like every line before the summary's tables, the node
// join, kill and wipe, and graceful stop events, and a summary with two
// copies per row, lost = 0 and a verdict in which the quotas held.
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
	progress := regexp.MustCompile(`(?m)^t=\d+s appended=\d+ delivered=\d+ \(\d+/s\) nodes=\d+ \| in flight/pending noisy \d+/\d+ quiet \d+/\d+ small \d+/\d+$`)
	if n := len(progress.FindAllString(text, -1)); n < 4 {
		t.Fatalf("want ≥ 4 periodic progress lines, got %d:\n%s", n, text)
	}
	before, _, _ := strings.Cut(text, "== fairshard demo summary ==")
	for i, line := range strings.Split(before, "\n") {
		if len([]rune(line)) > 120 {
			t.Errorf("line %d has %d characters, want at most 120: %q", i+1, len([]rune(line)), line)
		}
	}
	intro := regexp.MustCompile(`(?m)^console: http://127\.0\.0\.1:\d+/ui/ .*\n(?s:.*)^TENANT .*QUOTA.*\nnoisy +\d+/s +4  64\nquiet +\d+/s +1  the default.*\nsmall +\d+/s +1  4\n`)
	if !intro.MatchString(text) {
		t.Errorf("no console address and tenant table (load, queues, quota) up front:\n%s", text)
	}
	for _, want := range []string{"verdict:", "held: no acknowledged row lost (0 lost of", "held: noisy's quota:", "held: small's quota:",
		"event: node n4 joined", "event: killed n3 and deleted its data dir", "event: stopping n2 gracefully",
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
