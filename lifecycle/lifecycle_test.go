package lifecycle_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fairshard/fairshard/lifecycle"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recorder notes the order in which loops saw their context end and
// returned.
type recorder struct {
	mu     sync.Mutex
	events []string
}

func (r *recorder) add(s string) {
	r.mu.Lock()
	r.events = append(r.events, s)
	r.mu.Unlock()
}

func (r *recorder) get() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// loop waits for ctx, then takes a moment to stop (so an unordered stop
// would interleave the events).
func (r *recorder) loop(name string) lifecycle.Loop {
	return lifecycle.Loop{Name: name, Run: func(ctx context.Context) error {
		<-ctx.Done()
		r.add("stopping " + name)
		time.Sleep(5 * time.Millisecond)
		r.add("stopped " + name)
		return ctx.Err()
	}}
}

func TestStopsInReverseStartOrderWaitingForEach(t *testing.T) {
	rec := &recorder{}
	g := lifecycle.NewGroup(nil)
	for _, n := range []string{"persist", "recompute", "join"} {
		if err := g.Go(nil, rec.loop(n)); err != nil {
			t.Fatal(err)
		}
	}
	if got := g.Running(); !slices.Equal(got, []string{"persist", "recompute", "join"}) {
		t.Fatalf("running = %v", got)
	}
	if err := g.Stop(context.Background()); err != nil {
		t.Fatalf("clean stop returned %v", err)
	}
	want := []string{"stopping join", "stopped join", "stopping recompute", "stopped recompute", "stopping persist", "stopped persist"}
	if got := rec.get(); !slices.Equal(got, want) {
		t.Fatalf("events = %v, want %v", got, want)
	}
	if got := g.Running(); len(got) != 0 {
		t.Fatalf("running after Stop = %v", got)
	}
	// Idempotent, and a stopped group starts nothing.
	if err := g.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop = %v", err)
	}
	ran := false
	err := g.Go(nil, lifecycle.Loop{Name: "late", Run: func(context.Context) error { ran = true; return nil }})
	if !errors.Is(err, lifecycle.ErrStopped) || ran {
		t.Fatalf("Go after Stop = %v (ran %v), want ErrStopped and not run", err, ran)
	}
}

func TestFailuresAreReturnedByStop(t *testing.T) {
	boom := errors.New("disk gone")
	g := lifecycle.NewGroup(nil)
	_ = g.Go(nil, lifecycle.Loop{Name: "fails", Run: func(context.Context) error { return boom }})
	_ = g.Go(nil, lifecycle.Loop{Name: "clean", Run: func(ctx context.Context) error { <-ctx.Done(); return nil }})
	deadline := time.Now().Add(5 * time.Second)
	for slices.Contains(g.Running(), "fails") {
		if time.Now().After(deadline) {
			t.Fatal("failing loop did not return")
		}
		time.Sleep(time.Millisecond)
	}
	err := g.Stop(context.Background())
	if !errors.Is(err, boom) {
		t.Fatalf("Stop = %v, want the loop's error", err)
	}
	if want := `loop "fails": disk gone`; err.Error() != want {
		t.Fatalf("Stop = %q, want %q", err, want)
	}
}

func TestCallerContextEndsOneLoop(t *testing.T) {
	g := lifecycle.NewGroup(nil)
	ctx, cancel := context.WithCancel(context.Background())
	rec := &recorder{}
	_ = g.Go(nil, rec.loop("long"))
	_ = g.Go(ctx, rec.loop("bounded"))
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for !slices.Equal(g.Running(), []string{"long"}) {
		if time.Now().After(deadline) {
			t.Fatalf("running = %v, want only the unbounded loop", g.Running())
		}
		time.Sleep(time.Millisecond)
	}
	if err := g.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestStopBoundedByContextStillWaits(t *testing.T) {
	g := lifecycle.NewGroup(nil)
	release := make(chan struct{})
	var returned sync.WaitGroup
	returned.Add(2)
	slow := func(name string) lifecycle.Loop {
		return lifecycle.Loop{Name: name, Run: func(ctx context.Context) error {
			defer returned.Done()
			<-ctx.Done()
			<-release // takes longer than Stop's context allows
			return nil
		}}
	}
	_ = g.Go(nil, slow("first"))
	_ = g.Go(nil, slow("second"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	go func() { time.Sleep(100 * time.Millisecond); close(release) }()
	err := g.Stop(ctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Stop = %v, want the deadline", err)
	}
	returned.Wait() // both returned before Stop did (goleak checks the rest)
}
