package node

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fairshard/fairshard/outbox/memstore"
)

// failingWrites is memstore with the optional Writable method, to force
// the one state a memory store cannot reach (a failed commit); the real
// fault (a full tmpfs) is TestNotReadyWhileTheDiskIsFull's.
type failingWrites struct {
	*memstore.Store
	err atomic.Pointer[error]
}

func (s *failingWrites) Writable() error {
	if p := s.err.Load(); p != nil {
		return *p
	}
	return nil
}

// /readyz is Node.Ready: 503 while the cluster has not accepted the node
// (its applied ownership view says so) and while the store cannot write
// (naming the cause), 200 again once both hold. The node split had wired
// /readyz to the bare "started" flag, which lost the acceptance check.
func TestReadyzIsNodeReady(t *testing.T) {
	cfg := DefaultConfig()
	cfg.NodeName = "readyz"
	cfg.HTTPAddr, cfg.GossipAddr, cfg.GossipProfile = "127.0.0.1:0", "127.0.0.1:0", "fast"
	store := &failingWrites{Store: memstore.New(cfg.Shards)}
	n, err := NewWithStore(cfg, store, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	readyz := func() (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + n.APIAddr() + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	want := func(what string, status int, text string) {
		t.Helper()
		if st, b := readyz(); st != status || !strings.Contains(b, text) {
			t.Fatalf("%s: /readyz %d %s; want %d with %q", what, st, b, status, text)
		}
		if n.Ready() != (status == http.StatusOK) {
			t.Fatalf("%s: Ready() = %v with /readyz %d", what, n.Ready(), status)
		}
	}
	want("started", http.StatusOK, "ready")

	accepted := n.ownership()
	unaccepted := *accepted
	unaccepted.Accepted = false
	// The ownership loop may apply a fresh (accepted) view at any moment,
	// replacing the injected one between the two reads (CI saw /readyz
	// 503, then Ready() true): judge only rounds the injected view lasted.
	for try := 0; ; try++ {
		n.view.applied.Store(&unaccepted)
		st, b := readyz()
		ready := n.Ready()
		if n.view.applied.Load() != &unaccepted {
			if try == 50 {
				t.Fatal("the ownership loop replaced the injected view in 50 rounds out of 50")
			}
			continue
		}
		if st != http.StatusServiceUnavailable || !strings.Contains(b, "not accepted by the cluster") || ready {
			t.Fatalf("not accepted: /readyz %d %s, Ready() = %v; want 503 naming it, false", st, b, ready)
		}
		break
	}
	n.view.applied.Store(accepted)
	want("accepted again", http.StatusOK, "ready")

	cause := errors.New("commit: no space left on device")
	store.err.Store(&cause)
	want("store cannot write", http.StatusServiceUnavailable, "the store cannot write: commit: no space left on device")
	store.err.Store(nil)
	want("store writable again", http.StatusOK, "ready")
}
