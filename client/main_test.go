package client_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/internal/testnode"
	"github.com/fairshard/fairshard/node"
)

// TestMain closes the nodes the examples started, then fails on any
// goroutine left behind (nodes, clients, servers).
func TestMain(m *testing.M) {
	testnode.Main(m, func() {
		exampleMu.Lock()
		defer exampleMu.Unlock()
		for _, n := range exampleNodeList {
			_ = n.Close()
		}
		for _, d := range exampleDirs {
			_ = os.RemoveAll(d)
		}
		if exampleTarget != nil {
			exampleTarget.Close()
		}
	})
}

// nodeConfig is an in-process test node's config (testnode.Config) with
// every route delivered to target.
func nodeConfig(dir, target string) node.Config {
	cfg := testnode.Config(dir)
	cfg.DefaultTarget = target
	return cfg
}

// startNode starts a real in-process node (closed at cleanup) delivering to
// a target that takes everything except task queue "rejected" (422: a dead
// letter at once), and returns its base URL.
func startNode(t *testing.T, mutate func(*node.Config)) string {
	t.Helper()
	target := httptest.NewServer(newTarget())
	t.Cleanup(target.Close)
	cfg := nodeConfig(t.TempDir(), target.URL+"/deliver/{namespace}/{task_queue}")
	if mutate != nil {
		mutate(&cfg)
	}
	return testnode.Start(t, cfg).URL
}

// newTarget is a delivery target: 200, except 422 for task queue
// "rejected".
func newTarget() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/rejected") {
			http.Error(w, "invoice number missing", http.StatusUnprocessableEntity)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
}

var (
	exampleMu       sync.Mutex
	exampleNodeList []*node.Node
	exampleDirs     []string
	exampleTarget   *httptest.Server
)

// exampleNodes starts a fresh single-node cluster for one example and
// returns its URL; TestMain closes it. In your code, Options.Nodes are the
// base URLs of your cluster's nodes, e.g. "http://10.0.0.1:8080".
func exampleNodes() []string {
	exampleMu.Lock()
	defer exampleMu.Unlock()
	if exampleTarget == nil {
		exampleTarget = httptest.NewServer(newTarget())
	}
	dir, err := os.MkdirTemp("", "fairshard-client-example-")
	if err != nil {
		panic(err)
	}
	exampleDirs = append(exampleDirs, dir)
	cfg := nodeConfig(dir, exampleTarget.URL+"/deliver/{namespace}/{task_queue}")
	cfg.NodeName = "n1"
	n, err := node.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		panic(err)
	}
	exampleNodeList = append(exampleNodeList, n)
	return []string{"http://" + n.APIAddr()}
}
