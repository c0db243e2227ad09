package node

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/shards"
	"github.com/fairshard/fairshard/transfer"
)

// routes builds the HTTP API: public /v1 (bearer token when configured),
// node-to-node /internal/v1 (cluster secret), and open /metrics, /healthz,
// /readyz. Unknown paths and methods get JSON errors too.
//
// In GET /v1/rows/{dispatch_key} the key is best sent as one escaped path
// segment (url.PathEscape: '/' as %2F): plain slashes work, except where
// they form empty or dot segments ("a//b", "x/./y"), which the router
// cleans before matching.
func (n *Node) routes() http.Handler {
	mux := &routeMux{ServeMux: http.NewServeMux()}
	defer func() { n.routePatterns = mux.patterns }()
	pub := func(pattern string, h http.HandlerFunc) { mux.Handle(pattern, n.auth(n.cfg.APIToken, h)) }
	internal := func(pattern string, h http.HandlerFunc) { mux.Handle(pattern, n.auth(n.cfg.ClusterSecret, h)) }

	pub("POST /v1/rows", n.handleAppend)
	pub("GET /v1/rows/{key...}", n.handleGetRow)
	pub("GET /v1/rows", func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, &APIError{Status: http.StatusNotFound, Code: CodeNotFound, Field: "dispatch_key",
			Message: "dispatch_key: missing; GET /v1/rows/{dispatch_key}"})
	})
	pub("GET /v1/namespaces", n.handleListNamespaces)
	pub("GET /v1/namespaces/{ns}", n.handleGetNamespace)
	pub("PUT /v1/namespaces/{ns}", n.handlePutNamespace)
	pub("PUT /v1/namespaces/{ns}/task-queues/{tq}/target", n.handlePutTarget)
	pub("DELETE /v1/namespaces/{ns}/task-queues/{tq}/target", n.handleDeleteTarget)
	pub("GET /v1/namespaces/{ns}/dead-letters", n.handleDeadLetters)
	pub("POST /v1/namespaces/{ns}/dead-letters/redrive", n.handleRedrive)
	pub("PUT /v1/workflows/{wf}/hold", n.handleHold)
	pub("DELETE /v1/workflows/{wf}/hold", n.handleRelease)
	pub("GET /v1/cluster", n.handleCluster)
	pub("GET /v1/shards", n.handleShards)
	pub("GET /v1/openapi.yaml", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", api.ContentType)
		_, _ = io.WriteString(w, api.OpenAPIYAML())
	})

	internal("POST /internal/v1/rows", n.handleInternalAppend)
	internal("POST /internal/v1/handoff", n.handleInternalHandoff)
	internal("GET /internal/v1/rows/{key...}", n.handleInternalGetRow)
	internal("GET /internal/v1/namespaces/{ns}/dead-letters", n.handleInternalDeadLetters)
	internal("POST /internal/v1/namespaces/{ns}/dead-letters/redrive", n.handleInternalRedrive)

	mux.Handle("GET /metrics", promhttp.HandlerFor(n.reg, promhttp.HandlerOpts{Registry: n.reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !n.Ready() {
			writeError(w, &APIError{Status: http.StatusServiceUnavailable, Code: CodeUnavailable, Message: "not ready: starting, draining or not joined"})
			return
		}
		writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
	})
	return jsonMuxErrors(mux.ServeMux)
}

// routeMux is a ServeMux that remembers the patterns registered on it, so
// Routes can list them (the OpenAPI test in api/ compares them with
// api/openapi.yaml).
type routeMux struct {
	*http.ServeMux
	patterns []string
}

func (m *routeMux) Handle(pattern string, h http.Handler) {
	m.ServeMux.Handle(pattern, h)
	m.patterns = append(m.patterns, pattern)
}

func (m *routeMux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// Routes returns the patterns of every route the node serves, in
// net/http.ServeMux syntax ("GET /v1/rows/{key...}"), node-to-node routes
// included, sorted. Every public one must be described in api/openapi.yaml.
func (n *Node) Routes() []string {
	out := slices.Clone(n.routePatterns)
	slices.Sort(out)
	return out
}

// jsonMuxErrors turns the mux's own plain-text 404 and 405 answers into the
// API's JSON errors.
func jsonMuxErrors(mux *http.ServeMux) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, pattern := mux.Handler(r); pattern != "" {
			mux.ServeHTTP(w, r)
			return
		}
		mux.ServeHTTP(&muxErrorWriter{ResponseWriter: w, r: r}, r)
	})
}

type muxErrorWriter struct {
	http.ResponseWriter
	r       *http.Request
	skipped bool
}

func (m *muxErrorWriter) WriteHeader(status int) {
	switch status {
	case http.StatusNotFound:
		m.skipped = true
		writeError(m.ResponseWriter, &APIError{Status: status, Code: CodeNotFound, Message: "no such endpoint: " + m.r.URL.Path})
	case http.StatusMethodNotAllowed:
		m.skipped = true
		m.ResponseWriter.Header().Del("Content-Type")
		writeError(m.ResponseWriter, &APIError{Status: status, Code: CodeMethodNotAllowed,
			Message: fmt.Sprintf("method %s not allowed on %s (allowed: %s)", m.r.Method, m.r.URL.Path, m.ResponseWriter.Header().Get("Allow"))})
	default:
		m.ResponseWriter.WriteHeader(status)
	}
}

func (m *muxErrorWriter) Write(b []byte) (int, error) {
	if m.skipped {
		return len(b), nil
	}
	return m.ResponseWriter.Write(b)
}

// auth requires "Authorization: Bearer <token>" when token is set. The
// scheme name is case-insensitive (RFC 9110 §11.1), the token is not.
func (n *Node) auth(token string, h http.HandlerFunc) http.Handler {
	if token == "" {
		return h
	}
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, cred, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(strings.TrimLeft(cred, " ")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="fairshard"`)
			writeError(w, &APIError{Status: http.StatusUnauthorized, Code: CodeUnauthorized, Message: "missing or wrong bearer token"})
			return
		}
		h(w, r)
	})
}

// decodeBody strictly decodes a small JSON body (≤ 1 MiB) into v.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &APIError{Status: http.StatusBadRequest, Code: CodeInvalidJSON, Field: "body", Message: "body: " + err.Error()}
	}
	if dec.More() {
		return &APIError{Status: http.StatusBadRequest, Code: CodeInvalidJSON, Field: "body", Message: "body: unexpected data after the JSON value"}
	}
	return nil
}

func pathName(r *http.Request, param string) (string, error) {
	v := r.PathValue(param)
	if !ValidName(v) {
		field := map[string]string{"ns": "namespace", "tq": "task_queue"}[param]
		return "", fieldError(field, "%q must be 1-64 letters, digits, '-', '_' or '.'", v)
	}
	return v, nil
}

// ---- appends ----

func (n *Node) handleAppend(w http.ResponseWriter, r *http.Request) {
	code := http.StatusOK
	defer func() { n.m.appendRequests.WithLabelValues(strconv.Itoa(code)).Inc() }()
	if n.draining.Load() || !n.intake.enter() {
		code = http.StatusServiceUnavailable
		writeError(w, &APIError{Status: code, Code: CodeUnavailable, Message: "node is draining; append through another node"})
		return
	}
	defer n.intake.exit()
	rows, err := decodeAppend(w, r, time.Now().UTC())
	if err != nil {
		code = err.(*APIError).Status
		writeError(w, err)
		return
	}
	results, err := n.appendRouted(r.Context(), rows)
	if err != nil {
		code = http.StatusServiceUnavailable
		writeError(w, &APIError{Status: code, Code: CodeUnavailable, Message: "append failed; retrying the same batch is safe: " + err.Error()})
		return
	}
	for _, res := range results {
		n.m.appendRows.WithLabelValues(res.Status).Inc()
	}
	n.disp.Wake()
	writeJSON(w, http.StatusOK, map[string]any{"rows": results})
}

// appendRouted stores the rows this node owns locally and forwards the rest
// to their owners, one call per owner, concurrently. Rows of an owner that
// cannot be reached are stored here and answered "accepted" (handoff moves
// them later). It returns once every row is durable somewhere.
func (n *Node) appendRouted(ctx context.Context, rows []outbox.Row) ([]appendResult, error) {
	snap := n.ownership()
	results := make([]appendResult, len(rows))
	var local []int
	remote := map[string][]int{}
	addr := map[string]string{}
	for i := range rows {
		shard := shards.ShardOf(rows[i].DispatchKey, n.cfg.Shards)
		rows[i].Shard = shard
		results[i] = appendResult{DispatchKey: rows[i].DispatchKey, Shard: shard}
		owner, ok := snap.Owner(shard)
		if !ok || owner.Name == n.name || owner.APIAddr == "" {
			local = append(local, i)
			continue
		}
		remote[owner.Name] = append(remote[owner.Name], i)
		addr[owner.Name] = owner.APIAddr
	}
	var mu sync.Mutex
	var fallback []int // rows whose owner did not answer
	var wg sync.WaitGroup
	for owner, idx := range remote {
		wg.Go(func() {
			req := internalAppendReq{Rows: make([]RowView, len(idx))}
			for j, i := range idx {
				req.Rows[j] = viewOf(rows[i], "")
			}
			var resp internalAppendResp
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := n.peers.call(cctx, http.MethodPost, addr[owner], "/internal/v1/rows", req, &resp)
			cancel()
			if err == nil && len(resp.Outcomes) != len(idx) {
				err = fmt.Errorf("owner %s answered %d outcomes for %d rows", owner, len(resp.Outcomes), len(idx))
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				n.m.forwardErrors.Inc()
				n.log.Warn("forward to shard owner failed; holding rows here", "owner", owner, "rows", len(idx), "err", err)
				fallback = append(fallback, idx...)
				return
			}
			for j, i := range idx {
				results[i].Status, results[i].Node = resp.Outcomes[j], owner
			}
		})
	}
	if err := n.appendLocal(ctx, rows, local, results, false); err != nil {
		wg.Wait()
		return nil, err
	}
	wg.Wait()
	slices.Sort(fallback)
	if err := n.appendLocal(ctx, rows, fallback, results, true); err != nil {
		return nil, err
	}
	return results, nil
}

func (n *Node) appendLocal(ctx context.Context, rows []outbox.Row, idx []int, results []appendResult, held bool) error {
	if len(idx) == 0 {
		return nil
	}
	batch := make([]outbox.Row, len(idx))
	for j, i := range idx {
		batch[j] = rows[i]
	}
	outcomes, err := n.store.Append(ctx, batch)
	if err != nil {
		return fmt.Errorf("store %d rows on %s: %w", len(batch), n.name, err)
	}
	for j, i := range idx {
		st := string(outcomes[j])
		if held && outcomes[j] == outbox.AppendCreated {
			st = statusAccepted
		}
		results[i].Status, results[i].Node = st, n.name
	}
	return nil
}

// errLeaving answers node-to-node writes refused by a leaving node: the
// sender keeps the rows and hands them to the new owner later.
var errLeaving = &APIError{Status: http.StatusServiceUnavailable, Code: CodeUnavailable,
	Message: "node is leaving the cluster: it takes no more rows"}

func (n *Node) handleInternalAppend(w http.ResponseWriter, r *http.Request) {
	if !n.intake.enter() {
		writeError(w, errLeaving)
		return
	}
	defer n.intake.exit()
	var req internalAppendReq
	r.Body = http.MaxBytesReader(w, r.Body, 64<<20)
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeError(w, &APIError{Status: http.StatusBadRequest, Code: CodeInvalidJSON, Message: err.Error()})
		return
	}
	outcomes, err := n.store.Append(r.Context(), rowsOf(req.Rows))
	if err != nil {
		writeError(w, err)
		return
	}
	resp := internalAppendResp{Outcomes: make([]string, len(outcomes))}
	for i, o := range outcomes {
		resp.Outcomes[i] = string(o)
	}
	n.disp.Wake()
	writeJSON(w, http.StatusOK, resp)
}

// handleInternalHandoff is the receiving end of a transfer batch (a
// handoff or drain from another node: see handoff.go): the rows are merged
// into the store (outbox.Merge by row version) and the answer, sent once
// they are durable, counts what was created, updated and skipped. The body
// is a batch in the binary encoding (Content-Type transfer.ContentType, what
// nodes send) or JSON {"rows": [RowView…]} (older nodes). Senders bound a
// batch by --handoff-batch-bytes (≤ MaxHandoffBatchBytes) plus one row, so
// the body limit is MaxHandoffBodyBytes.
func (n *Node) handleInternalHandoff(w http.ResponseWriter, r *http.Request) {
	if !n.intake.enter() {
		writeError(w, errLeaving)
		return
	}
	defer n.intake.exit()
	r.Body = http.MaxBytesReader(w, r.Body, MaxHandoffBodyBytes)
	var rows []outbox.Row
	if r.Header.Get("Content-Type") == transfer.ContentType {
		body, err := io.ReadAll(r.Body)
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, tooLarge("body", "handoff batch exceeds %d bytes", MaxHandoffBodyBytes))
			return
		}
		if err == nil {
			rows, err = transfer.DecodeBatch(body, 0)
		}
		if err != nil {
			writeError(w, &APIError{Status: http.StatusBadRequest, Code: CodeInvalidField, Field: "body", Message: "body: " + err.Error()})
			return
		}
	} else {
		var req internalAppendReq
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeError(w, &APIError{Status: http.StatusBadRequest, Code: CodeInvalidJSON, Message: err.Error()})
			return
		}
		rows = rowsOf(req.Rows)
	}
	res, err := n.store.Merge(r.Context(), rows)
	if err != nil {
		writeError(w, err)
		return
	}
	n.m.handoffReceived.Add(float64(len(rows)))
	n.disp.Wake()
	writeJSON(w, http.StatusOK, res)
}

// ---- reads ----

func (n *Node) handleGetRow(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	if key == "" || len(key) > MaxKeyBytes {
		writeError(w, fieldError("dispatch_key", "must be 1-%d bytes", MaxKeyBytes))
		return
	}
	row, err := n.store.Get(r.Context(), key)
	if err == nil {
		writeJSON(w, http.StatusOK, viewOf(row, n.name))
		return
	}
	if !errors.Is(err, outbox.ErrNotFound) {
		writeError(w, err)
		return
	}
	// Ask the owner first, then every other member (a row may be held on
	// the node that accepted it while its owner was unreachable).
	snap := n.ownership()
	var order []string
	addrs := map[string]string{}
	if owner, ok := snap.Owner(shards.ShardOf(key, n.cfg.Shards)); ok && owner.Name != n.name {
		order = append(order, owner.Name)
		addrs[owner.Name] = owner.APIAddr
	}
	for _, m := range snap.Members {
		if _, seen := addrs[m.Name]; !seen && m.Name != n.name && m.APIAddr != "" {
			order = append(order, m.Name)
			addrs[m.Name] = m.APIAddr
		}
	}
	for _, name := range order {
		var v RowView
		// Bounded per peer, so one unreachable peer cannot stall the lookup.
		cctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		err := n.peers.call(cctx, http.MethodGet, addrs[name], "/internal/v1/rows/"+url.PathEscape(key), nil, &v)
		cancel()
		if err == nil {
			writeJSON(w, http.StatusOK, v)
			return
		}
	}
	writeError(w, &APIError{Status: http.StatusNotFound, Code: CodeNotFound, Message: fmt.Sprintf("no row with dispatch_key %q on any node", key)})
}

func (n *Node) handleInternalGetRow(w http.ResponseWriter, r *http.Request) {
	row, err := n.store.Get(r.Context(), r.PathValue("key"))
	if errors.Is(err, outbox.ErrNotFound) {
		writeError(w, &APIError{Status: http.StatusNotFound, Code: CodeNotFound, Message: "not here"})
		return
	}
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, viewOf(row, n.name))
}
