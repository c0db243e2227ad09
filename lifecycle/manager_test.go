package lifecycle_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/fairshard/fairshard/lifecycle"
)

// svc is a service that records its steps; its loop waits for its context.
func (r *recorder) svc(name string) lifecycle.Service {
	return lifecycle.Service{
		Name:  name,
		Start: func(context.Context) error { r.add("start " + name); return nil },
		Run: func(ctx context.Context) error {
			<-ctx.Done()
			r.add("loop end " + name)
			return ctx.Err()
		},
		Stop: func(ctx context.Context) error {
			if ctx.Err() != nil {
				r.add("hard stop " + name)
				return nil
			}
			time.Sleep(5 * time.Millisecond) // an unordered stop would interleave
			r.add("stop " + name)
			return nil
		},
	}
}

func TestManagerStartsInOrderAndStopsInReverse(t *testing.T) {
	rec := &recorder{}
	m := lifecycle.NewManager(nil)
	for _, n := range []string{"store", "cluster", "dispatcher"} {
		if err := m.Add(rec.svc(n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := m.Stop(context.Background()); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"start store", "start cluster", "start dispatcher",
		// Each service's Stop runs before its loop ends, and the whole
		// service is stopped before the one started before it.
		"stop dispatcher", "loop end dispatcher",
		"stop cluster", "loop end cluster",
		"stop store", "loop end store",
	}
	if got := rec.get(); !slices.Equal(got, want) {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}
	if err := m.Stop(context.Background()); err != nil {
		t.Fatalf("second Stop = %v, want the first's nil", err)
	}
	if err := m.Add(rec.svc("late")); !errors.Is(err, lifecycle.ErrStarted) {
		t.Fatalf("Add after Stop = %v, want ErrStarted", err)
	}
	if err := m.Start(context.Background()); !errors.Is(err, lifecycle.ErrStopped) {
		t.Fatalf("Start after Stop = %v, want ErrStopped", err)
	}
}

// A failed Start stops the walk; Stop then stops every service added,
// including those never started (their Stop releases what their
// constructor took), and runs no loop that was not launched.
func TestManagerFailedStartThenStopStopsEverything(t *testing.T) {
	rec := &recorder{}
	m := lifecycle.NewManager(nil)
	boom := errors.New("boom")
	bad := rec.svc("cluster")
	bad.Start = func(context.Context) error { return boom }
	for _, s := range []lifecycle.Service{rec.svc("store"), bad, rec.svc("dispatcher")} {
		if err := m.Add(s); err != nil {
			t.Fatal(err)
		}
	}
	err := m.Start(context.Background())
	if !errors.Is(err, boom) {
		t.Fatalf("Start = %v, want boom", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // a hard stop
	if err := m.Stop(ctx); err != nil {
		t.Fatal(err)
	}
	want := []string{"start store", "hard stop dispatcher", "hard stop cluster", "hard stop store", "loop end store"}
	if got := rec.get(); !slices.Equal(got, want) {
		t.Fatalf("events\n got %v\nwant %v", got, want)
	}
}

func TestManagerStopReturnsStopErrorsAndLoopFailures(t *testing.T) {
	m := lifecycle.NewManager(nil)
	stopErr, loopErr := errors.New("drain timed out"), errors.New("loop broke")
	_ = m.Add(lifecycle.Service{Name: "a", Run: func(context.Context) error { return loopErr }})
	_ = m.Add(lifecycle.Service{Name: "b", Stop: func(context.Context) error { return stopErr }})
	if err := m.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	err := m.Stop(context.Background())
	if !errors.Is(err, stopErr) || !errors.Is(err, loopErr) {
		t.Fatalf("Stop = %v, want both errors", err)
	}
	if got := m.Names(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("Names = %v", got)
	}
}

// Stop waits for a Start in progress (here one blocked until its context
// ends), so no Stop step runs beside a Start step.
func TestManagerStopWaitsForStart(t *testing.T) {
	rec := &recorder{}
	m := lifecycle.NewManager(nil)
	entered := make(chan struct{})
	_ = m.Add(lifecycle.Service{Name: "join", Start: func(ctx context.Context) error {
		close(entered)
		<-ctx.Done()
		rec.add("start returned")
		return ctx.Err()
	}, Stop: func(context.Context) error { rec.add("stop join"); return nil }})
	ctx, cancel := context.WithCancel(context.Background())
	startErr := make(chan error, 1)
	go func() { startErr <- m.Start(ctx) }()
	<-entered
	stopped := make(chan error, 1)
	go func() { stopped <- m.Stop(context.Background()) }()
	select {
	case <-stopped:
		t.Fatal("Stop returned while Start was still running")
	case <-time.After(20 * time.Millisecond):
	}
	cancel()
	if err := <-startErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("Start = %v", err)
	}
	if err := <-stopped; err != nil {
		t.Fatal(err)
	}
	if got := rec.get(); !slices.Equal(got, []string{"start returned", "stop join"}) {
		t.Fatalf("events %v", got)
	}
}
