// Package router places the rows of an append through the node's
// replicator (package replication): each row goes to its shard's replica
// set, primary first, and the append is answered only once every row is
// durable on the write-copies minimum of replicas (DESIGN.md "Replicated
// shards", write path). The router knows nothing of HTTP: the API decodes
// and answers; it only adapts the replicator's outcomes to the API's
// per-row results and counts them.
package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/replication"
)

// Placer stores rows on their replica sets (*replication.Replicator).
type Placer interface {
	// Route returns one outcome per row once every row is durable on
	// enough replicas, or an error (replication.ErrInsufficientCopies,
	// replication.ErrNoReplica, a store error).
	Route(ctx context.Context, rows []outbox.Row) ([]replication.Outcome, error)
}

// Config wires a Router. Placer is required.
type Config struct {
	// Placer stores the rows (the node's replicator).
	Placer Placer
	// Logger receives a line per refused append (nil discards).
	Logger *slog.Logger
	// Registerer receives fairshard_forward_errors_total (nil: none).
	Registerer prometheus.Registerer
}

// Result is one row's answer.
type Result struct {
	DispatchKey string
	// Status is "created" or "duplicate".
	Status string
	Shard  uint32
	// Node is the replica that coordinated the write (the primary unless
	// it could not be reached).
	Node string
	// Copies counts the replicas the row is durable on.
	Copies int
}

// ErrInsufficientCopies is returned (wrapped) when some row could not be
// made durable on the write-copies minimum of replicas: the append is
// refused (503 with Retry-After) and may be retried as it is.
var ErrInsufficientCopies = replication.ErrInsufficientCopies

// Router places appended rows. Safe for concurrent use.
type Router struct {
	cfg     Config
	log     *slog.Logger
	refused prometheus.Counter
}

// New returns a Router, registering its metric on cfg.Registerer.
func New(cfg Config) (*Router, error) {
	if cfg.Placer == nil {
		return nil, fmt.Errorf("router: Placer is required")
	}
	r := &Router{cfg: cfg, log: cfg.Logger}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.refused = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fairshard_forward_errors_total",
		Help: "Appends refused because a row could not be made durable on enough replicas (no replica answered, or fewer than the write-copies minimum did).",
	})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(r.refused); err != nil {
			return nil, fmt.Errorf("router: register metrics: %w", err)
		}
	}
	return r, nil
}

// Append stores rows on their replica sets (setting Row.Shard) and
// returns one Result per row, in order. An error means nothing is
// reported stored (some rows may be on some replicas): retrying the batch
// is safe (insert-or-ignore by dispatch_key).
func (r *Router) Append(ctx context.Context, rows []outbox.Row) ([]Result, error) {
	out, err := r.cfg.Placer.Route(ctx, rows)
	if err != nil {
		r.refused.Inc()
		if !errors.Is(err, replication.ErrInsufficientCopies) {
			r.log.Warn("append refused: a row's replicas could not be reached", "rows", len(rows), "err", err)
		}
		return nil, err
	}
	res := make([]Result, len(rows))
	for i := range rows {
		res[i] = Result{DispatchKey: rows[i].DispatchKey, Status: string(out[i].Status), Shard: rows[i].Shard,
			Node: out[i].Node, Copies: out[i].Copies}
	}
	return res, nil
}
