package testnode

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/fairshard/fairshard/node"
)

// Node is a running in-process test node.
type Node struct {
	*node.Node
	// Config is the config it was built from.
	Config node.Config
	// URL is http://host:port of its bound API listener (the advertised
	// address differs only when AdvertiseHTTP is set).
	URL string
	// Logs holds everything it logged (debug level and up).
	Logs *LogBuffer
}

// Constructor is a node constructor: node.New, or one that wraps another store
// (node.NewWithStore).
type Constructor func(node.Config, *slog.Logger) (*node.Node, error)

// Start builds a node from cfg with node.New and starts it; see StartWith.
func Start(t testing.TB, cfg node.Config) *Node {
	t.Helper()
	return StartWith(t, cfg, node.New)
}

// StartWith builds a node from cfg with build, logging into its Logs, and
// starts it (failing the test if either fails). At cleanup it closes the
// node, failing the test on a close error, and prints the node's logs when
// the test failed.
func StartWith(t testing.TB, cfg node.Config, build Constructor) *Node {
	t.Helper()
	logs := &LogBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	n, err := build(cfg, log.With("node", cfg.NodeName))
	if err != nil {
		t.Fatalf("node.New(%s): %v", cfg.NodeName, err)
	}
	t.Cleanup(func() {
		if err := n.Close(); err != nil {
			t.Errorf("close %s: %v", cfg.NodeName, err)
		}
		if t.Failed() {
			t.Logf("logs of %s:\n%s", cfg.NodeName, logs.String())
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := n.Start(ctx); err != nil {
		t.Fatalf("start %s: %v", cfg.NodeName, err)
	}
	tn := &Node{Node: n, Config: cfg, URL: "http://" + n.APIAddr(), Logs: logs}
	if cfg.AdvertiseHTTP != "" {
		tn.URL = "http://" + n.ListenAddr()
	}
	return tn
}

// LogBuffer is a bytes.Buffer for one writer and readers in other
// goroutines: a node's log, a command's stderr.
type LogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *LogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *LogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
