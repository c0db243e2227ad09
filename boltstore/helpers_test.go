package boltstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/fairshard/fairshard/internal/testclock"
	"github.com/fairshard/fairshard/outbox"
)

func TestMain(m *testing.M) {
	if dir := os.Getenv(envCrashChild); dir != "" {
		os.Exit(crashChildMain(dir))
	}
	if path := os.Getenv(envLockChild); path != "" {
		os.Exit(lockChildMain(path))
	}
	goleak.VerifyTestMain(m)
}

// fakeClock is the injectable clock for Options.Now.
type fakeClock = testclock.Clock

func newFakeClock() *fakeClock { return testclock.New(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)) }

// testBundle is what setup hands a test besides the store.
type testBundle struct {
	path  string
	clock *fakeClock
	reg   *prometheus.Registry
	opts  Options
}

const testShardCount = 16

// newTestStore opens a store on a fresh file with a fake clock and its own
// registry. At cleanup it runs Check (so every test is an integrity test)
// and closes the store.
func newTestStore(t testing.TB, mod ...func(*Options)) (*Store, *testBundle) {
	t.Helper()
	b := &testBundle{path: filepath.Join(t.TempDir(), "outbox.db"), clock: newFakeClock(), reg: prometheus.NewPedanticRegistry()}
	b.opts = Options{ShardCount: testShardCount, Now: b.clock.Now, Registerer: b.reg, LockTimeout: 200 * time.Millisecond}
	for _, f := range mod {
		f(&b.opts)
	}
	s, err := Open(b.path, b.opts)
	if err != nil {
		t.Fatalf("open %s: %v", b.path, err)
	}
	cleanupCheck(t, s)
	return s, b
}

// cleanupCheck registers Check-then-Close for s.
func cleanupCheck(t testing.TB, s *Store) {
	t.Helper()
	t.Cleanup(func() {
		if err := s.Check(context.Background()); err != nil && !errors.Is(err, outbox.ErrClosed) {
			t.Errorf("check at cleanup: %v", err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
}

// reopen closes s and opens its file again with the same options (a fresh
// registry), returning the new store, checked at cleanup.
func reopen(t testing.TB, s *Store, b *testBundle) *Store {
	t.Helper()
	if err := s.Check(context.Background()); err != nil {
		t.Fatalf("check before reopen: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("close before reopen: %v", err)
	}
	b.reg = prometheus.NewPedanticRegistry()
	b.opts.Registerer = b.reg
	s2, err := Open(b.path, b.opts)
	if err != nil {
		t.Fatalf("reopen %s: %v", b.path, err)
	}
	cleanupCheck(t, s2)
	return s2
}

func row(key, ns, tq string) outbox.Row {
	return outbox.Row{DispatchKey: key, WorkflowID: "wf-" + key, Namespace: ns, TaskQueue: tq,
		ActivityType: "act", Payload: []byte("p-" + key), ContentType: "text/plain"}
}

func mustAppend(t testing.TB, s *Store, rows ...outbox.Row) []outbox.AppendOutcome {
	t.Helper()
	out, err := s.Append(context.Background(), rows)
	if err != nil {
		t.Fatalf("append: %v", err)
	}
	return out
}

func mustGet(t testing.TB, s *Store, key string) outbox.Row {
	t.Helper()
	r, err := s.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	return r
}

func mustCheck(t testing.TB, s *Store) {
	t.Helper()
	if err := s.Check(context.Background()); err != nil {
		t.Fatalf("check: %v", err)
	}
}

func keysOfRows(rows []outbox.Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.DispatchKey
	}
	return out
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// keyOnShard returns a dispatch_key with the given prefix whose shard is
// shard.
func keyOnShard(prefix string, shard uint32) string {
	for i := 0; ; i++ {
		k := fmt.Sprintf("%s-%d", prefix, i)
		if shardOf(k) == shard {
			return k
		}
	}
}

// beginTransfer marks up to limit transferable rows of shard in-transfer
// and returns them: a marking ReadShard from the shard's start (marked
// rows are stepped over, so repeated calls return the next rows).
func beginTransfer(s *Store, shard uint32, limit int) ([]outbox.Row, error) {
	p, err := s.ReadShard(context.Background(), outbox.ShardRead{Shard: shard, MaxRows: limit, Mark: true})
	return p.Rows, err
}

// claimOf returns the fence a test settles key with: its claim's version.
// A pending row is claimed first (alone, at the store clock), so a test can
// settle a row no Claim took; a claimed or terminal row's version is
// returned as it is.
func claimOf(t testing.TB, s *Store, key string) outbox.Version {
	t.Helper()
	var v outbox.Version
	_, err := s.settle(context.Background(), "test claim "+key, key, func(r *outbox.Row) bool {
		changed := outbox.ApplyClaim(r, s.now())
		v = r.Version
		return changed
	})
	if err != nil {
		t.Fatalf("claim %q: %v", key, err)
	}
	return v
}

// packAll calls PackTombstones until it returns 0 (one call packs one
// page of the tombstone index) and returns the rows packed.
func packAll(ctx context.Context, s *Store) (int, error) {
	total := 0
	for {
		n, err := s.PackTombstones(ctx)
		total += n
		if n == 0 || err != nil {
			return total, err
		}
	}
}
