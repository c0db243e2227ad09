package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/httperr"
	"github.com/fairshard/fairshard/internal/peer"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/replication"
	"github.com/fairshard/fairshard/shards"
)

// ---- appends ----

func (a *API) handleAppend(w http.ResponseWriter, r *http.Request) {
	code := http.StatusOK
	defer func() { a.m.appendRequests.WithLabelValues(strconv.Itoa(code)).Inc() }()
	if a.Draining() {
		code = http.StatusServiceUnavailable
		writeError(w, &httperr.Error{Status: code, Code: api.CodeUnavailable, Message: "node is draining; append through another node"})
		return
	}
	// The body is read and validated before the request is admitted as a
	// write: a client still sending holds no slot of the intake gate, so
	// it cannot hold a stop.
	rows, err := decodeAppend(w, r, time.Now().UTC())
	if err != nil {
		code = err.(*httperr.Error).Status
		writeError(w, err)
		return
	}
	if a.Draining() || !a.intake.enter() {
		code = http.StatusServiceUnavailable
		writeError(w, &httperr.Error{Status: code, Code: api.CodeUnavailable, Message: "node is draining; append through another node"})
		return
	}
	defer a.intake.exit()
	routed, err := a.cfg.Router.Append(r.Context(), rows)
	if err != nil {
		code = http.StatusServiceUnavailable
		// Retryable: nothing is reported stored, appends are idempotent.
		w.Header().Set("Retry-After", "1")
		ae := &httperr.Error{Status: code, Code: api.CodeUnavailable, Message: "append failed; retrying the same batch is safe: " + err.Error()}
		if errors.Is(err, replication.ErrInsufficientCopies) {
			ae.Code = api.CodeInsufficientCopies
			ae.Message = "fewer replicas than the write-copies minimum made a row durable; nothing is reported stored, retrying the same batch is safe: " + err.Error()
		}
		writeError(w, ae)
		return
	}
	results := make([]api.AppendResult, len(routed))
	for i, res := range routed {
		results[i] = api.AppendResult{DispatchKey: res.DispatchKey, Status: api.AppendStatus(res.Status), Shard: res.Shard, Node: res.Node, Copies: res.Copies}
		a.m.appendRows.WithLabelValues(res.Status).Inc()
	}
	a.cfg.Dispatcher.Wake()
	httperr.WriteJSON(w, http.StatusOK, map[string]any{"rows": results})
}

// ---- reads ----

func (a *API) handleGetRow(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if key == "" || len(key) > MaxKeyBytes {
		writeError(w, httperr.Field("dispatch_key", "must be 1-%d bytes", MaxKeyBytes))
		return
	}
	// The shard's replicas in set order (the primary's copy is the one
	// being delivered; a backup's may lag by the replication lag), then
	// this node, then every other member (a copy not yet handed to a
	// changed replica set).
	snap := a.cfg.Ownership()
	set := snap.ReplicaSet(shards.ShardOf(key, a.cfg.ShardCount)).Replicas
	order := append([]string(nil), set...)
	if !slices.Contains(order, a.cfg.Self) {
		order = append(order, a.cfg.Self)
	}
	addrs := map[string]string{}
	var unanswered []string
	for _, m := range snap.Members {
		addrs[m.Name] = m.APIAddr
		if !slices.Contains(order, m.Name) && m.APIAddr != "" {
			order = append(order, m.Name)
		}
	}
	for _, name := range order {
		if name == a.cfg.Self {
			row, err := a.cfg.Store.Get(r.Context(), key)
			if err == nil {
				httperr.WriteJSON(w, http.StatusOK, a.lookupView(r.Context(), row))
				return
			}
			if !errors.Is(err, outbox.ErrNotFound) {
				writeError(w, err)
				return
			}
			continue
		}
		if addrs[name] == "" {
			continue
		}
		// Bounded per peer, so one unreachable peer cannot stall the lookup.
		cctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		v, err := a.cfg.Peers.GetRow(cctx, addrs[name], key)
		cancel()
		if err == nil {
			httperr.WriteJSON(w, http.StatusOK, v)
			return
		}
		if !errors.Is(err, peer.ErrNotFound) {
			unanswered = append(unanswered, name)
		}
	}
	if len(unanswered) > 0 {
		// Not "no such row": a member that did not answer may hold it.
		w.Header().Set("Retry-After", "1")
		writeError(w, &httperr.Error{Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable,
			Message: fmt.Sprintf("no row with dispatch_key %q on the nodes that answered; %s did not answer: retry", key, strings.Join(unanswered, ", "))})
		return
	}
	writeError(w, &httperr.Error{Status: http.StatusNotFound, Code: api.CodeNotFound, Message: fmt.Sprintf("no row with dispatch_key %q on any node", key)})
}
