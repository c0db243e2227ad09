package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/fairshard/fairshard/node/peer"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
	"github.com/fairshard/fairshard/transfer"
)

// MaxHandoffBodyBytes is the body limit of the internal handoff route.
// Senders bound a batch by --handoff-batch-bytes (at most 32 MiB) plus one
// row, which fits as JSON (base64 payloads grow by a third).
const MaxHandoffBodyBytes = 64 << 20

// appendResult is one row's answer to POST /v1/rows.
type appendResult struct {
	DispatchKey string `json:"dispatch_key"`
	// Status is "created", "duplicate" or "accepted" (held durably on this
	// node because the owner could not be reached; handed off later).
	Status string `json:"status"`
	Shard  uint32 `json:"shard"`
	// Node is where the row is durably stored now.
	Node string `json:"node"`
}

// ---- appends ----

func (a *API) handleAppend(w http.ResponseWriter, r *http.Request) {
	code := http.StatusOK
	defer func() { a.m.appendRequests.WithLabelValues(strconv.Itoa(code)).Inc() }()
	if a.Draining() {
		code = http.StatusServiceUnavailable
		writeError(w, &APIError{Status: code, Code: CodeUnavailable, Message: "node is draining; append through another node"})
		return
	}
	// The body is read and validated before the request is admitted as a
	// write: a client still sending holds no slot of the intake gate, so
	// it cannot hold a stop (issue #13 item 6).
	rows, err := decodeAppend(w, r, time.Now().UTC())
	if err != nil {
		code = err.(*APIError).Status
		writeError(w, err)
		return
	}
	if a.Draining() || !a.intake.enter() {
		code = http.StatusServiceUnavailable
		writeError(w, &APIError{Status: code, Code: CodeUnavailable, Message: "node is draining; append through another node"})
		return
	}
	defer a.intake.exit()
	routed, err := a.cfg.Router.Append(r.Context(), rows)
	if err != nil {
		code = http.StatusServiceUnavailable
		writeError(w, &APIError{Status: code, Code: CodeUnavailable, Message: "append failed; retrying the same batch is safe: " + err.Error()})
		return
	}
	results := make([]appendResult, len(routed))
	for i, res := range routed {
		results[i] = appendResult{DispatchKey: res.DispatchKey, Status: res.Status, Shard: res.Shard, Node: res.Node}
		a.m.appendRows.WithLabelValues(res.Status).Inc()
	}
	a.cfg.Dispatcher.Wake()
	writeJSON(w, http.StatusOK, map[string]any{"rows": results})
}

// errLeaving answers node-to-node writes refused by a leaving node: the
// sender keeps the rows and hands them to the new owner later.
var errLeaving = &APIError{Status: http.StatusServiceUnavailable, Code: CodeUnavailable,
	Message: "node is leaving the cluster: it takes no more rows"}

func (a *API) handleInternalAppend(w http.ResponseWriter, r *http.Request) {
	body, err := readInternalBody(w, r, MaxForwardBodyBytes)
	if err != nil {
		writeError(w, err)
		return
	}
	var req peer.AppendRequest
	if err := strictUnmarshal(body, &req); err != nil {
		writeError(w, jsonError("", "body", err))
		return
	}
	if len(req.Rows) == 0 {
		writeError(w, fieldError("rows", "is empty"))
		return
	}
	if len(req.Rows) > MaxBatchRows {
		writeError(w, tooLarge("rows", "%d rows exceed the limit of %d per request", len(req.Rows), MaxBatchRows))
		return
	}
	rows := peer.RowsOf(req.Rows)
	if err := validateRemoteRows(rows, a.cfg.ShardCount, time.Now().UTC(), true); err != nil {
		writeError(w, err)
		return
	}
	if !a.intake.enter() {
		writeError(w, errLeaving)
		return
	}
	defer a.intake.exit()
	outcomes, err := a.cfg.Store.Append(r.Context(), rows)
	if err != nil {
		writeError(w, err)
		return
	}
	resp := peer.AppendResponse{Outcomes: make([]string, len(outcomes))}
	for i, o := range outcomes {
		resp.Outcomes[i] = string(o)
	}
	a.cfg.Dispatcher.Wake()
	writeJSON(w, http.StatusOK, resp)
}

// handleInternalHandoff is the receiving end of a transfer batch (a
// handoff or drain from another node: see package handoff): the rows are
// merged into the store (outbox.Merge by row version) and the answer, sent
// once they are durable, counts what was created, updated and skipped. The
// body is a batch in the binary encoding (Content-Type
// transfer.ContentType, what nodes send) or JSON {"rows": [RowView…]}
// (older nodes). Senders bound a batch by --handoff-batch-bytes plus one
// row, so the body limit is MaxHandoffBodyBytes.
func (a *API) handleInternalHandoff(w http.ResponseWriter, r *http.Request) {
	body, err := readInternalBody(w, r, MaxHandoffBodyBytes)
	if err != nil {
		writeError(w, err)
		return
	}
	var rows []outbox.Row
	if r.Header.Get("Content-Type") == transfer.ContentType {
		if rows, err = transfer.DecodeBatch(body, MaxRemoteRows); err != nil {
			writeError(w, &APIError{Status: http.StatusBadRequest, Code: CodeInvalidField, Field: "body", Message: "body: " + err.Error()})
			return
		}
	} else {
		var req peer.AppendRequest
		if err := strictUnmarshal(body, &req); err != nil {
			writeError(w, jsonError("", "body", err))
			return
		}
		rows = peer.RowsOf(req.Rows)
	}
	if err := validateRemoteRows(rows, a.cfg.ShardCount, time.Now().UTC(), false); err != nil {
		writeError(w, err)
		return
	}
	if !a.intake.enter() {
		writeError(w, errLeaving)
		return
	}
	defer a.intake.exit()
	res, err := a.cfg.Store.Merge(r.Context(), rows)
	if err != nil {
		writeError(w, err)
		return
	}
	a.m.handoffReceived.Add(float64(len(rows)))
	a.cfg.Dispatcher.Wake()
	writeJSON(w, http.StatusOK, res)
}

// ---- reads ----

func (a *API) handleGetRow(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if key == "" || len(key) > MaxKeyBytes {
		writeError(w, fieldError("dispatch_key", "must be 1-%d bytes", MaxKeyBytes))
		return
	}
	row, err := a.cfg.Store.Get(r.Context(), key)
	if err == nil {
		writeJSON(w, http.StatusOK, a.lookupView(r.Context(), row))
		return
	}
	if !errors.Is(err, outbox.ErrNotFound) {
		writeError(w, err)
		return
	}
	// Ask the owner first, then every other member (a row may be held on
	// the node that accepted it while its owner was unreachable).
	snap := a.cfg.Ownership()
	var order []string
	addrs := map[string]string{}
	if owner, ok := snap.Owner(shards.ShardOf(key, a.cfg.ShardCount)); ok && owner.Name != a.cfg.Self {
		order = append(order, owner.Name)
		addrs[owner.Name] = owner.APIAddr
	}
	for _, m := range snap.Members {
		if _, seen := addrs[m.Name]; !seen && m.Name != a.cfg.Self && m.APIAddr != "" {
			order = append(order, m.Name)
			addrs[m.Name] = m.APIAddr
		}
	}
	for _, name := range order {
		// Bounded per peer, so one unreachable peer cannot stall the lookup.
		cctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		v, err := a.cfg.Peers.GetRow(cctx, addrs[name], key)
		cancel()
		if err == nil {
			writeJSON(w, http.StatusOK, v)
			return
		}
	}
	writeError(w, &APIError{Status: http.StatusNotFound, Code: CodeNotFound, Message: fmt.Sprintf("no row with dispatch_key %q on any node", key)})
}

func (a *API) handleInternalGetRow(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if key == "" || len(key) > MaxKeyBytes {
		writeError(w, fieldError("dispatch_key", "must be 1-%d bytes", MaxKeyBytes))
		return
	}
	row, err := a.cfg.Store.Get(r.Context(), key)
	if errors.Is(err, outbox.ErrNotFound) {
		writeError(w, &APIError{Status: http.StatusNotFound, Code: CodeNotFound, Message: "not here"})
		return
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, a.lookupView(r.Context(), row))
}
