// Package router places the rows of an append: each row goes to the node
// owning its shard in the node's applied ownership view. Rows this node
// owns (or that no live member owns) are stored here; the rest are
// forwarded to their owners, one call per owner, concurrently; rows whose
// owner does not answer are stored here and answered "accepted" (held: the
// handoff moves them once the owner answers). It returns once every row is
// durable somewhere. The router knows nothing of HTTP: the API decodes and
// answers, a Forwarder carries rows to peers.
//
// # Replication seam
//
// Each row's destination comes from its shard's replica set in the applied
// view (OwnershipSnapshot.ReplicaSet): today the primary alone. Replicated
// shards (#14) plug in at destination/store: the primary stores locally and
// copies to the backups of the set before answering.
package router

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
)

// StatusAccepted is a row's answer when it is held on this node because
// its owner could not be reached (handed off later). Stored rows answer
// outbox.AppendCreated or outbox.AppendDuplicate.
const StatusAccepted = "accepted"

// DefaultForwardTimeout bounds one forwarded call.
const DefaultForwardTimeout = 10 * time.Second

// Store is what the router needs of the local store.
type Store interface {
	Append(ctx context.Context, rows []outbox.Row) ([]outbox.AppendOutcome, error)
}

// Forwarder stores rows on the peer at apiAddr (a forwarded append, which
// the peer stores without forwarding again) and returns one outcome per
// row; *peer.Client implements it.
type Forwarder interface {
	Append(ctx context.Context, apiAddr string, rows []outbox.Row) ([]string, error)
}

// Config wires a Router. Every field but Logger, Registerer and
// ForwardTimeout is required.
type Config struct {
	// Self is this node's name.
	Self string
	// ShardCount is the cluster's shard count.
	ShardCount uint32
	// Store is this node's store.
	Store Store
	// Ownership returns the node's applied ownership view.
	Ownership func() *cluster.OwnershipSnapshot
	// Forwarder carries rows to their owners.
	Forwarder Forwarder
	// ForwardTimeout bounds one forwarded call. Defaults to 10 s.
	ForwardTimeout time.Duration
	// Logger receives a warning per failed forward (nil discards).
	Logger *slog.Logger
	// Registerer receives fairshard_forward_errors_total (nil: none).
	Registerer prometheus.Registerer
}

// Result is one row's answer.
type Result struct {
	DispatchKey string
	// Status is "created", "duplicate" or "accepted" (StatusAccepted).
	Status string
	Shard  uint32
	// Node is where the row is durably stored now.
	Node string
}

// Router places appended rows. Safe for concurrent use.
type Router struct {
	cfg           Config
	log           *slog.Logger
	forwardErrors prometheus.Counter
}

// New returns a Router, registering its metric on cfg.Registerer.
func New(cfg Config) (*Router, error) {
	if cfg.Store == nil || cfg.Ownership == nil || cfg.Forwarder == nil || cfg.ShardCount == 0 {
		return nil, fmt.Errorf("router: Store, Ownership, Forwarder and ShardCount are required")
	}
	if cfg.ForwardTimeout <= 0 {
		cfg.ForwardTimeout = DefaultForwardTimeout
	}
	r := &Router{cfg: cfg, log: cfg.Logger}
	if r.log == nil {
		r.log = slog.New(slog.DiscardHandler)
	}
	r.forwardErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "fairshard_forward_errors_total", Help: "Forwarded appends that failed; their rows were held here and answered accepted.",
	})
	if cfg.Registerer != nil {
		if err := cfg.Registerer.Register(r.forwardErrors); err != nil {
			return nil, fmt.Errorf("router: register metrics: %w", err)
		}
	}
	return r, nil
}

// destination is where one row is stored: here, or on the member addr.
type destination struct {
	local     bool
	owner     string
	ownerAddr string
}

// destination chooses a row's node from its shard's replica set in snap:
// the primary; this node when it is the primary, when no live member is
// (the rows wait here for one) or when the primary serves no API.
func (r *Router) destination(snap *cluster.OwnershipSnapshot, shard uint32) destination {
	primary := snap.ReplicaSet(shard).Primary()
	if primary == "" || primary == r.cfg.Self {
		return destination{local: true}
	}
	m, ok := snap.Member(primary)
	if !ok || m.APIAddr == "" {
		return destination{local: true}
	}
	return destination{owner: m.Name, ownerAddr: m.APIAddr}
}

// Append computes each row's shard (setting Row.Shard), stores the rows
// this node owns and forwards the rest, and returns one Result per row, in
// order, once every row is durable on some node. An error (a local store
// failure) means the batch may be partly stored; retrying it is safe
// (insert-or-ignore by dispatch_key).
func (r *Router) Append(ctx context.Context, rows []outbox.Row) ([]Result, error) {
	snap := r.cfg.Ownership()
	results := make([]Result, len(rows))
	var local []int
	remote := map[string][]int{}
	addr := map[string]string{}
	for i := range rows {
		shard := shards.ShardOf(rows[i].DispatchKey, r.cfg.ShardCount)
		rows[i].Shard = shard
		results[i] = Result{DispatchKey: rows[i].DispatchKey, Shard: shard}
		d := r.destination(snap, shard)
		if d.local {
			local = append(local, i)
			continue
		}
		remote[d.owner] = append(remote[d.owner], i)
		addr[d.owner] = d.ownerAddr
	}
	var mu sync.Mutex
	var fallback []int // rows whose owner did not answer
	var wg sync.WaitGroup
	for owner, idx := range remote {
		wg.Go(func() {
			batch := make([]outbox.Row, len(idx))
			for j, i := range idx {
				batch[j] = rows[i]
			}
			cctx, cancel := context.WithTimeout(ctx, r.cfg.ForwardTimeout)
			outcomes, err := r.cfg.Forwarder.Append(cctx, addr[owner], batch)
			cancel()
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				r.forwardErrors.Inc()
				r.log.Warn("forward to shard owner failed; holding rows here", "owner", owner, "rows", len(idx), "err", err)
				fallback = append(fallback, idx...)
				return
			}
			for j, i := range idx {
				results[i].Status, results[i].Node = outcomes[j], owner
			}
		})
	}
	if err := r.store(ctx, rows, local, results, false); err != nil {
		wg.Wait()
		return nil, err
	}
	wg.Wait()
	slices.Sort(fallback)
	if err := r.store(ctx, rows, fallback, results, true); err != nil {
		return nil, err
	}
	return results, nil
}

// store appends rows[idx] to the local store and fills their results;
// held rows (owner unreachable) that were created answer StatusAccepted.
func (r *Router) store(ctx context.Context, rows []outbox.Row, idx []int, results []Result, held bool) error {
	if len(idx) == 0 {
		return nil
	}
	batch := make([]outbox.Row, len(idx))
	for j, i := range idx {
		batch[j] = rows[i]
	}
	outcomes, err := r.cfg.Store.Append(ctx, batch)
	if err != nil {
		return fmt.Errorf("store %d rows on %s: %w", len(batch), r.cfg.Self, err)
	}
	for j, i := range idx {
		st := string(outcomes[j])
		if held && outcomes[j] == outbox.AppendCreated {
			st = StatusAccepted
		}
		results[i].Status, results[i].Node = st, r.cfg.Self
	}
	return nil
}
