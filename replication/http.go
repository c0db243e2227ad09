package replication

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/fairshard/fairshard/outbox"
	"github.com/fairshard/fairshard/transfer"
)

// The node-to-node routes, all POST, under PathPrefix. Row batches travel
// in transfer's binary encoding (transfer.ContentType); the rest is JSON.
// Errors are the API's JSON errors {"error":{"code","message"}}; a
// forwarded write refused for want of copies is 503 with code
// "insufficient_copies", one sent to a non-replica 409 "not_replica", and a
// node that takes no rows (leaving) answers 503 "unavailable".
const (
	// PathPrefix starts every replication route.
	PathPrefix = "/internal/v1/replication/"
	// MaxBodyBytes bounds a request body (a batch is bounded by the
	// sender's Limits.MaxBytes, at most MaxBatchBytes, plus one row).
	MaxBodyBytes = 64 << 20
	// forwardBody bounds a forwarded append (the public append is ≤ 10 MiB).
	forwardBody = 16 << 20
)

// Error codes of the replication routes' JSON errors.
const (
	CodeInsufficientCopies = "insufficient_copies"
	CodeNotReplica         = "not_replica"
	codeUnavailable        = "unavailable"
	codeInvalid            = "invalid_field"
	codeInternal           = "internal"
	codeTooLarge           = "too_large"
)

// Server is the receiving side of the Peers calls: *Replicator.
type Server interface {
	AcceptForward(ctx context.Context, rows []outbox.Row) ([]Outcome, error)
	AcceptAppend(ctx context.Context, rows []outbox.Row) ([]outbox.AppendOutcome, error)
	AcceptMerge(ctx context.Context, rows []outbox.Row) (outbox.MergeResult, error)
	States(ctx context.Context, shards []uint32) (StatesReply, error)
	ReadShardsCopy(ctx context.Context, reads []outbox.ShardRead, maxRows, maxBytes int) ([]outbox.ShardPage, error)
	Keys(ctx context.Context, shard uint32, after []byte, maxKeys int) (KeyPage, error)
	RowsByKey(ctx context.Context, keys []string, maxBytes int) ([]outbox.Row, int, error)
	MissingOf(ctx context.Context, kvs []KeyVersion) (MissingReply, error)
}

var _ Server = (*Replicator)(nil)

// RowCheck validates a batch a peer sent before anything of it is stored,
// by the public API's rules (names, sizes, times, attempts; for copies
// also status and version). forwarded is true for a forwarded append (the
// rows become new pending rows: status and version are not read; times
// are already stamped by this node's clock), false for copies merged or
// inserted by version. It answers the call itself (a 4xx naming the row
// and field) and returns false when the batch is refused.
type RowCheck func(w http.ResponseWriter, rows []outbox.Row, forwarded bool) bool

// Handler serves the replication routes for r (mount it at PathPrefix,
// behind the node's authentication: package nodeauth). Routes that store
// rows (forward, append, merge) go through gate (nil: none): a closed gate
// answers 503; their batches go through check first (nil: none).
func Handler(r Server, gate Gate, check RowCheck) http.Handler {
	mux := http.NewServeMux()
	register(mux, r, gate, check)
	return mux
}

// Routes returns the patterns Handler serves, in net/http.ServeMux syntax
// ("POST /internal/v1/replication/merge"), in the order it registers
// them: what a mounting API lists and authenticates.
func Routes() []string {
	var rec patternRecorder
	register(&rec, nil, nil, nil)
	return rec
}

// handleFuncer is where register puts the routes: a ServeMux, or a
// patternRecorder.
type handleFuncer interface {
	HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request))
}

// patternRecorder keeps the patterns registered on it.
type patternRecorder []string

func (p *patternRecorder) HandleFunc(pattern string, _ func(http.ResponseWriter, *http.Request)) {
	*p = append(*p, pattern)
}

// register adds the replication routes for r to mux.
func register(mux handleFuncer, r Server, gate Gate, check RowCheck) {
	if check == nil {
		check = func(http.ResponseWriter, []outbox.Row, bool) bool { return true }
	}
	mux.HandleFunc("POST "+PathPrefix+"forward", storing(gate, serveForward(r, check)))
	mux.HandleFunc("POST "+PathPrefix+"append", storing(gate, serveAppend(r, check)))
	mux.HandleFunc("POST "+PathPrefix+"merge", storing(gate, serveMerge(r, check)))
	mux.HandleFunc("POST "+PathPrefix+"states", serveStates(r))
	mux.HandleFunc("POST "+PathPrefix+"read", serveRead(r))
	mux.HandleFunc("POST "+PathPrefix+"keys", serveKeys(r))
	mux.HandleFunc("POST "+PathPrefix+"rows", serveRows(r))
	mux.HandleFunc("POST "+PathPrefix+"missing", serveMissing(r))
}

// storing wraps a route that stores rows: while gate (nil: none) is
// closed the call is answered 503 "unavailable" and h does not run.
func storing(gate Gate, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		if gate != nil {
			if !gate.Enter() {
				writeErr(w, http.StatusServiceUnavailable, codeUnavailable, "node is leaving the cluster: it takes no more rows")
				return
			}
			defer gate.Exit()
		}
		h(w, req)
	}
}

// serveForward serves a forwarded append (Peers.Forward): the rows'
// relative times are stamped by this node's clock before check, and a
// refused write answers 503 "insufficient_copies" (retry after a second),
// 409 "not_replica" (try the next replica) or 503 "unavailable".
func serveForward(r Server, check RowCheck) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		rows, ok := readBatch(w, req, forwardBody)
		if !ok {
			return
		}
		// Forwarded times are relative (Forward): stamp them by this
		// node's clock, as AcceptForward does, before the check.
		now := time.Now().UTC()
		for i := range rows {
			delay := max(rows[i].VisibleAfter.Sub(rows[i].CreatedAt), 0)
			rows[i].CreatedAt, rows[i].VisibleAfter = now, now.Add(delay)
		}
		if !check(w, rows, true) {
			return
		}
		out, err := r.AcceptForward(req.Context(), rows)
		switch {
		case errors.Is(err, ErrInsufficientCopies):
			w.Header().Set("Retry-After", "1")
			writeErr(w, http.StatusServiceUnavailable, CodeInsufficientCopies, err.Error())
		case errors.Is(err, ErrNotReplica):
			writeErr(w, http.StatusConflict, CodeNotReplica, err.Error())
		case err != nil:
			writeErr(w, http.StatusServiceUnavailable, codeUnavailable, err.Error())
		default:
			writeJSONBody(w, map[string]any{"outcomes": out})
		}
	}
}

// serveAppend serves a coordinator's append to a backup (Peers.Append):
// the checked rows are inserted or ignored by dispatch_key.
func serveAppend(r Server, check RowCheck) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		rows, ok := readBatch(w, req, MaxBodyBytes)
		if !ok || !check(w, rows, false) {
			return
		}
		out, err := r.AcceptAppend(req.Context(), rows)
		if err != nil {
			writeStoreErr(w, err)
			return
		}
		writeJSONBody(w, map[string]any{"outcomes": out})
	}
}

// serveMerge serves copies sent to be merged by version (Peers.Merge:
// shipping, repair, sync pushes, duplicates of a write).
func serveMerge(r Server, check RowCheck) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		rows, ok := readBatch(w, req, MaxBodyBytes)
		if !ok || !check(w, rows, false) {
			return
		}
		res, err := r.AcceptMerge(req.Context(), rows)
		if err != nil {
			writeStoreErr(w, err)
			return
		}
		writeJSONBody(w, res)
	}
}

// serveStates serves Peers.States: this node's digest and sync state of
// the shards asked about.
func serveStates(r Server) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		var in statesReq
		if !readJSON(w, req, &in) {
			return
		}
		rep, err := r.States(req.Context(), in.Shards)
		if err != nil {
			writeStoreErr(w, err)
			return
		}
		writeJSONBody(w, rep)
	}
}

// serveRead serves Peers.ReadShards (a bulk sync's pages): at most
// maxReadsPerCall shards a call, the answer at most half a body's bound.
func serveRead(r Server) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		var in readReq
		if !readJSON(w, req, &in) {
			return
		}
		if len(in.Reads) > maxReadsPerCall {
			writeErr(w, http.StatusBadRequest, codeInvalid, fmt.Sprintf("reads: %d, at most %d", len(in.Reads), maxReadsPerCall))
			return
		}
		reads := make([]outbox.ShardRead, len(in.Reads))
		for i, rd := range in.Reads {
			reads[i] = outbox.ShardRead{Shard: rd.Shard, After: rd.After}
		}
		pages, err := r.ReadShardsCopy(req.Context(), reads, in.MaxRows, min(in.MaxBytes, MaxBodyBytes/2))
		if err != nil {
			writeStoreErr(w, err)
			return
		}
		w.Header().Set("Content-Type", transfer.ContentType)
		_, _ = w.Write(encodePages(pages))
	}
}

// serveKeys serves Peers.Keys: a page of a shard's key/version list (a
// diff's).
func serveKeys(r Server) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		var in keysReq
		if !readJSON(w, req, &in) {
			return
		}
		page, err := r.Keys(req.Context(), in.Shard, in.After, in.MaxKeys)
		if err != nil {
			writeStoreErr(w, err)
			return
		}
		writeJSONBody(w, page)
	}
}

// serveRows serves Peers.Rows: the rows of the keys asked for, framed as
// uvarint keys examined ‖ the batch.
func serveRows(r Server) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		var in rowsReq
		if !readJSON(w, req, &in) {
			return
		}
		rows, examined, err := r.RowsByKey(req.Context(), in.Keys, in.MaxBytes)
		if err != nil {
			writeStoreErr(w, err)
			return
		}
		w.Header().Set("Content-Type", transfer.ContentType)
		b := binary.AppendUvarint(nil, uint64(examined))
		_, _ = w.Write(transfer.EncodeBatch(b, rows))
	}
}

// serveMissing serves Peers.Missing: which of the key/versions asked
// about this node lacks or holds older.
func serveMissing(r Server) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		var in missingReq
		if !readJSON(w, req, &in) {
			return
		}
		rep, err := r.MissingOf(req.Context(), in.Keys)
		if err != nil {
			writeStoreErr(w, err)
			return
		}
		writeJSONBody(w, rep)
	}
}

type statesReq struct {
	Shards []uint32 `json:"shards"`
}

type readReq struct {
	Reads []struct {
		Shard uint32 `json:"shard"`
		After []byte `json:"after,omitempty"`
	} `json:"reads"`
	MaxRows  int `json:"max_rows"`
	MaxBytes int `json:"max_bytes"`
}

// maxReadsPerCall bounds the shards of one read call.
const maxReadsPerCall = 4096

type keysReq struct {
	Shard   uint32 `json:"shard"`
	After   []byte `json:"after,omitempty"`
	MaxKeys int    `json:"max_keys"`
}

type rowsReq struct {
	Keys     []string `json:"keys"`
	MaxBytes int      `json:"max_bytes"`
}

type missingReq struct {
	Keys []KeyVersion `json:"keys"`
}

// encodePages frames shard pages: uvarint page count, per page uvarint
// len(next) ‖ next ‖ done byte ‖ uvarint row count, then every page's rows
// in one transfer.EncodeBatch.
func encodePages(pages []outbox.ShardPage) []byte {
	var rows []outbox.Row
	n := 16
	for _, p := range pages {
		rows = append(rows, p.Rows...)
		n += 24 + len(p.Next)
	}
	b := make([]byte, 0, n+transfer.EncodedSize(rows))
	b = binary.AppendUvarint(b, uint64(len(pages)))
	for _, p := range pages {
		b = binary.AppendUvarint(b, uint64(len(p.Next)))
		b = append(b, p.Next...)
		done := byte(0)
		if p.Done {
			done = 1
		}
		b = append(b, done)
		b = binary.AppendUvarint(b, uint64(len(p.Rows)))
	}
	return transfer.EncodeBatch(b, rows)
}

func decodePages(b []byte) ([]outbox.ShardPage, error) {
	bad := errors.New("malformed shard pages")
	n, k := binary.Uvarint(b)
	if k <= 0 || n > uint64(len(b)) {
		return nil, bad
	}
	b = b[k:]
	pages := make([]outbox.ShardPage, n)
	counts := make([]uint64, n)
	total := uint64(0)
	for i := range pages {
		ln, k := binary.Uvarint(b)
		if k <= 0 || ln > uint64(len(b)-k) {
			return nil, bad
		}
		b = b[k:]
		pages[i].Next = append([]byte(nil), b[:ln]...)
		b = b[ln:]
		if len(b) == 0 || b[0] > 1 {
			return nil, bad
		}
		pages[i].Done = b[0] == 1
		b = b[1:]
		c, k := binary.Uvarint(b)
		if k <= 0 {
			return nil, bad
		}
		b = b[k:]
		counts[i] = c
		total += c
	}
	rows, err := transfer.DecodeBatch(b, 0)
	if err != nil {
		return nil, err
	}
	if uint64(len(rows)) != total {
		return nil, fmt.Errorf("%w: %d rows for pages counting %d", bad, len(rows), total)
	}
	for i := range pages {
		pages[i].Rows, rows = rows[:counts[i]:counts[i]], rows[counts[i]:]
	}
	return pages, nil
}

func readBatch(w http.ResponseWriter, req *http.Request, limit int64) ([]outbox.Row, bool) {
	if ct := req.Header.Get("Content-Type"); ct != transfer.ContentType {
		writeErr(w, http.StatusUnsupportedMediaType, codeInvalid, fmt.Sprintf("body: content type %q, want %s", ct, transfer.ContentType))
		return nil, false
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, limit))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		writeErr(w, http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("body: batch exceeds %d bytes", limit))
		return nil, false
	case err != nil:
		writeErr(w, http.StatusBadRequest, codeInvalid, "body: "+err.Error())
		return nil, false
	}
	rows, err := transfer.DecodeBatch(body, 0)
	if err != nil {
		writeErr(w, http.StatusBadRequest, codeInvalid, "body: "+err.Error())
		return nil, false
	}
	return rows, true
}

func readJSON(w http.ResponseWriter, req *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, req.Body, MaxBodyBytes))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeErr(w, http.StatusBadRequest, "invalid_json", "body: "+err.Error())
		return false
	}
	return true
}

func writeJSONBody(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}

// writeStoreErr answers a store error: invalid rows are the sender's
// fault (400), anything else 503 (the sender retries).
func writeStoreErr(w http.ResponseWriter, err error) {
	if errors.Is(err, outbox.ErrInvalidRow) || errors.Is(err, outbox.ErrInvalidToken) {
		writeErr(w, http.StatusBadRequest, codeInvalid, err.Error())
		return
	}
	writeErr(w, http.StatusServiceUnavailable, codeUnavailable, err.Error())
}

// HTTPPeers implements Peers over the node-to-node API: HTTP/1.1 calls to
// Handler on the member's API address, through the transport wrapper
// given to NewHTTPPeers (the node's: nodeauth signs every call and checks
// every answer). The zero value is not usable: build with NewHTTPPeers.
type HTTPPeers struct {
	client *http.Client
	pool   *http.Transport
}

// NewHTTPPeers returns an HTTPPeers with its own connection pool (256 idle
// connections per member). wrap, when not nil, wraps the pool's transport
// (authentication: e.g. (*nodeauth.Auth).Transport, which is a no-op on a
// nil *Auth); nil sends calls as they are.
func NewHTTPPeers(wrap func(http.RoundTripper) http.RoundTripper) *HTTPPeers {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 256
	tr.MaxIdleConns = 1024
	var rt http.RoundTripper = tr
	if wrap != nil {
		rt = wrap(tr)
	}
	return &HTTPPeers{client: &http.Client{Transport: rt}, pool: tr}
}

// Close drops idle connections.
func (p *HTTPPeers) Close() { p.pool.CloseIdleConnections() }

// PeerError is a member's error answer.
type PeerError struct {
	Status  int
	Code    string
	Message string
}

func (e *PeerError) Error() string {
	return fmt.Sprintf("HTTP %d %s: %s", e.Status, e.Code, e.Message)
}

// Unwrap maps the answer's code to this package's errors.
func (e *PeerError) Unwrap() error {
	switch e.Code {
	case CodeInsufficientCopies:
		return ErrInsufficientCopies
	case CodeNotReplica:
		return ErrNotReplica
	case codeUnavailable:
		if e.Status == http.StatusServiceUnavailable {
			return ErrRefused
		}
	}
	return nil
}

func (p *HTTPPeers) post(ctx context.Context, addr, route, contentType string, body []byte) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+addr+PathPrefix+route, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", route, addr, err)
	}
	req.Header.Set("Content-Type", contentType)
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", route, addr, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxBodyBytes+1<<20))
	if err != nil {
		return nil, fmt.Errorf("%s %s: read answer: %w", route, addr, err)
	}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Error struct{ Code, Message string } `json:"error"`
		}
		_ = json.Unmarshal(data, &e)
		if e.Error.Message == "" {
			e.Error.Message = fmt.Sprintf("%.200s", data)
		}
		return nil, fmt.Errorf("%s %s: %w", route, addr, &PeerError{Status: resp.StatusCode, Code: e.Error.Code, Message: e.Error.Message})
	}
	return data, nil
}

func (p *HTTPPeers) postJSON(ctx context.Context, addr, route string, in, out any) error {
	body, err := json.Marshal(in)
	if err != nil {
		return err
	}
	data, err := p.post(ctx, addr, route, "application/json", body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", route, addr, err)
	}
	return nil
}

func (p *HTTPPeers) postBatch(ctx context.Context, addr, route string, rows []outbox.Row, out any) error {
	body := transfer.EncodeBatch(make([]byte, 0, transfer.EncodedSize(rows)), rows)
	data, err := p.post(ctx, addr, route, transfer.ContentType, body)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode answer: %w", route, addr, err)
	}
	return nil
}

// epoch is the base instant of forwarded rows' relative times.
var epoch = time.Unix(0, 0).UTC()

// Forward implements Peers: the rows travel with CreatedAt at the Unix
// epoch and VisibleAfter at the epoch plus the row's delay.
func (p *HTTPPeers) Forward(ctx context.Context, addr string, rows []outbox.Row) ([]Outcome, error) {
	rel := make([]outbox.Row, len(rows))
	for i := range rows {
		rel[i] = rows[i]
		rel[i].VisibleAfter = epoch.Add(max(rows[i].VisibleAfter.Sub(rows[i].CreatedAt), 0))
		rel[i].CreatedAt = epoch
		rel[i].Status = outbox.StatusPending // a new row (the coordinator's Append decides)
	}
	var out struct {
		Outcomes []Outcome `json:"outcomes"`
	}
	err := p.postBatch(ctx, addr, "forward", rel, &out)
	return out.Outcomes, err
}

// Append implements Peers.
func (p *HTTPPeers) Append(ctx context.Context, addr string, rows []outbox.Row) ([]outbox.AppendOutcome, error) {
	var out struct {
		Outcomes []outbox.AppendOutcome `json:"outcomes"`
	}
	err := p.postBatch(ctx, addr, "append", rows, &out)
	return out.Outcomes, err
}

// Merge implements Peers.
func (p *HTTPPeers) Merge(ctx context.Context, addr string, rows []outbox.Row) (outbox.MergeResult, error) {
	var out outbox.MergeResult
	err := p.postBatch(ctx, addr, "merge", rows, &out)
	return out, err
}

// States implements Peers.
func (p *HTTPPeers) States(ctx context.Context, addr string, shards []uint32) (StatesReply, error) {
	var out StatesReply
	err := p.postJSON(ctx, addr, "states", statesReq{Shards: shards}, &out)
	return out, err
}

// ReadShards implements Peers.
func (p *HTTPPeers) ReadShards(ctx context.Context, addr string, reads []outbox.ShardRead, maxRows, maxBytes int) ([]outbox.ShardPage, error) {
	var in readReq
	in.MaxRows, in.MaxBytes = maxRows, maxBytes
	for _, rd := range reads {
		in.Reads = append(in.Reads, struct {
			Shard uint32 `json:"shard"`
			After []byte `json:"after,omitempty"`
		}{rd.Shard, rd.After})
	}
	body, err := json.Marshal(in)
	if err != nil {
		return nil, err
	}
	data, err := p.post(ctx, addr, "read", "application/json", body)
	if err != nil {
		return nil, err
	}
	pages, err := decodePages(data)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", addr, err)
	}
	if len(pages) > len(reads) {
		return nil, fmt.Errorf("read %s: %d pages for %d reads", addr, len(pages), len(reads))
	}
	return pages, nil
}

// Keys implements Peers.
func (p *HTTPPeers) Keys(ctx context.Context, addr string, shard uint32, after []byte, maxKeys int) (KeyPage, error) {
	var out KeyPage
	err := p.postJSON(ctx, addr, "keys", keysReq{Shard: shard, After: after, MaxKeys: maxKeys}, &out)
	return out, err
}

// Rows implements Peers.
func (p *HTTPPeers) Rows(ctx context.Context, addr string, keys []string, maxBytes int) ([]outbox.Row, int, error) {
	body, err := json.Marshal(rowsReq{Keys: keys, MaxBytes: maxBytes})
	if err != nil {
		return nil, 0, err
	}
	data, err := p.post(ctx, addr, "rows", "application/json", body)
	if err != nil {
		return nil, 0, err
	}
	n, k := binary.Uvarint(data)
	if k <= 0 {
		return nil, 0, fmt.Errorf("rows %s: malformed answer", addr)
	}
	rows, err := transfer.DecodeBatch(data[k:], 0)
	if err != nil {
		return nil, 0, fmt.Errorf("rows %s: %w", addr, err)
	}
	return rows, int(n), nil
}

// Missing implements Peers.
func (p *HTTPPeers) Missing(ctx context.Context, addr string, kvs []KeyVersion) (MissingReply, error) {
	var out MissingReply
	err := p.postJSON(ctx, addr, "missing", missingReq{Keys: kvs}, &out)
	return out, err
}
