package peer

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strings"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/httperr"
	"github.com/fairshard/fairshard/lease"
)

// Local is what a node answers its peers from: its own copies of rows and
// its own counts, never a fan-out. Every method validates what it is given
// that the server does not (keys, query parameters, the cancel reason)
// and refuses it with an *httperr.Error naming the field; an error
// wrapping ErrNotFound is answered 404, which the asking Client reads back
// as ErrNotFound. Package httpapi implements it from the same local reads
// as its /v1 routes.
type Local interface {
	// Row is this node's copy of the row of key (RouteRow).
	Row(ctx context.Context, key string) (api.Row, error)
	// DeadLetters is this node's part of a dead-letter page of ns; query
	// is DeadLetterQuery.Values as sent (RouteDeadLetters).
	DeadLetters(ctx context.Context, ns string, query url.Values) (DeadLettersResponse, error)
	// Redrive redrives the dead letters of ns (keys, or all) of the shards
	// this node is primary of and returns how many (RouteRedrive).
	Redrive(ctx context.Context, ns string, keys []string) (int, error)
	// Purge purges them likewise and returns how many (RoutePurge).
	Purge(ctx context.Context, ns string, keys []string) (int, error)
	// Rows is this node's page of ns's row listing; query is the public
	// listing's query string (RouteRows).
	Rows(ctx context.Context, ns string, query url.Values) (api.RowPage, error)
	// Cancel cancels req's row if this node holds it (RouteCancel).
	Cancel(ctx context.Context, req CancelRequest) (api.CancelResult, error)
	// Stats is this node's counts and delivery figures (RouteStats).
	Stats(ctx context.Context) (NodeStats, error)
}

// Leases is the capacity-lease service a node's peers call in the exact
// quota mode (package lease's Coordinator, through the node's wiring).
type Leases interface {
	// HandleLease answers one batched lease call from another node
	// (lease.Coordinator.Handle); a *lease.FieldError is a bad request.
	HandleLease(req lease.Request) (lease.Response, error)
	// HandleHandoff keeps a coordinator's records shipped to this node as
	// the successor of their namespaces (lease.Coordinator.Inherit); it
	// returns how many namespaces it kept.
	HandleHandoff(h lease.Handoff) int
	// CoordinatorStatus is this node's coordinator state of ns, if any.
	CoordinatorStatus(ns string) (lease.NamespaceStatus, bool)
}

// ServerConfig wires a Server.
type ServerConfig struct {
	// Local answers the row, dead-letter, listing, cancel and stats
	// routes. Required.
	Local Local
	// Leases answers the lease routes; nil (a node in the proportional
	// quota mode) answers them 503, and every lease status 404.
	Leases Leases
}

// NewServer returns the handler of every route of Routes, each answering
// from cfg: the request decoded and checked here (path values, strict
// JSON bodies of at most httperr.MaxBodyBytes, lease messages by package
// lease's decoders), the work done by cfg.Local or cfg.Leases, the answer
// written as JSON and every refusal as httperr's JSON error. The caller
// mounts it under each pattern of Routes behind package nodeauth's
// middleware; a request for another pattern is a 404.
func NewServer(cfg ServerConfig) http.Handler {
	s := &server{local: cfg.Local, leases: cfg.Leases}
	mux := http.NewServeMux()
	mux.HandleFunc(RouteRow, s.row)
	mux.HandleFunc(RouteDeadLetters, s.deadLetters)
	mux.HandleFunc(RouteRedrive, keysRoute(cfg.Local.Redrive, func(n int) any { return RedriveResponse{Redriven: n} }))
	mux.HandleFunc(RoutePurge, keysRoute(cfg.Local.Purge, func(n int) any { return PurgeResponse{Purged: n} }))
	mux.HandleFunc(RouteRows, s.rows)
	mux.HandleFunc(RouteCancel, s.cancel)
	mux.HandleFunc(RouteStats, s.stats)
	mux.HandleFunc(RouteLease, s.withLeases(s.lease))
	mux.HandleFunc(RouteLeaseHandoff, s.withLeases(s.leaseHandoff))
	mux.HandleFunc(RouteLeaseStatus, s.leaseStatus)
	return mux
}

type server struct {
	local  Local
	leases Leases
}

// answer writes v as a 200, or err: one wrapping ErrNotFound as a 404
// "not here", anything else as httperr.Write does.
func answer(w http.ResponseWriter, v any, err error) {
	switch {
	case errors.Is(err, ErrNotFound):
		httperr.Write(w, httperr.NotFound("not here"))
	case err != nil:
		httperr.Write(w, err)
	default:
		httperr.WriteJSON(w, http.StatusOK, v)
	}
}

// namespace is the {ns} of r, checked by the public API's rule
// (lease.ValidNamespace).
func namespace(r *http.Request) (string, error) {
	ns := r.PathValue("ns")
	if !lease.ValidNamespace(ns) {
		return "", httperr.Field("namespace", "%q must be 1-64 letters, digits, '-', '_' or '.'", ns)
	}
	return ns, nil
}

func (s *server) row(w http.ResponseWriter, r *http.Request) {
	v, err := s.local.Row(r.Context(), r.PathValue("key"))
	answer(w, v, err)
}

func (s *server) deadLetters(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	v, err := s.local.DeadLetters(r.Context(), ns, r.URL.Query())
	answer(w, v, err)
}

// keysRoute is the handler of a redrive or a purge: the namespace and the
// keys (an empty body is every dead letter of it) passed to do, its count
// answered as answerOf builds it.
func keysRoute(do func(ctx context.Context, ns string, keys []string) (int, error), answerOf func(int) any) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ns, err := namespace(r)
		if err != nil {
			httperr.Write(w, err)
			return
		}
		var req DeadLetterKeys
		if r.ContentLength != 0 {
			if err := httperr.DecodeJSON(w, r, &req); err != nil {
				httperr.Write(w, err)
				return
			}
		}
		n, err := do(r.Context(), ns, req.Keys)
		answer(w, answerOf(n), err)
	}
}

func (s *server) rows(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	v, err := s.local.Rows(r.Context(), ns, r.URL.Query())
	answer(w, v, err)
}

func (s *server) cancel(w http.ResponseWriter, r *http.Request) {
	var req CancelRequest
	if err := httperr.DecodeJSON(w, r, &req); err != nil {
		httperr.Write(w, err)
		return
	}
	v, err := s.local.Cancel(r.Context(), req)
	answer(w, v, err)
}

func (s *server) stats(w http.ResponseWriter, r *http.Request) {
	v, err := s.local.Stats(r.Context())
	answer(w, v, err)
}

// withLeases answers h's route 503 on a node serving no leases.
func (s *server) withLeases(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.leases == nil {
			httperr.Write(w, httperr.Unavailable("this node serves no leases"))
			return
		}
		h(w, r)
	}
}

// lease is one node's batched lease call. A malformed body is a 400
// naming the field (lease.FieldError) and changes nothing.
func (s *server) lease(w http.ResponseWriter, r *http.Request) {
	req, err := lease.DecodeRequest(http.MaxBytesReader(w, r.Body, lease.MaxRequestBytes+1))
	if err != nil {
		httperr.Write(w, leaseError(err))
		return
	}
	resp, err := s.leases.HandleLease(req)
	if err != nil {
		httperr.Write(w, leaseError(err))
		return
	}
	body, err := lease.EncodeResponse(resp)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(body)
}

// leaseHandoff keeps a coordinator's records for the namespaces this node
// would coordinate should it fail (lease/handoff.go). A malformed body is
// a 400 naming the field and changes nothing; the answer is {"kept": n}.
func (s *server) leaseHandoff(w http.ResponseWriter, r *http.Request) {
	h, err := lease.DecodeHandoff(http.MaxBytesReader(w, r.Body, lease.MaxHandoffBytes+1))
	if err != nil {
		httperr.Write(w, leaseError(err))
		return
	}
	httperr.WriteJSON(w, http.StatusOK, map[string]int{"kept": s.leases.HandleHandoff(h)})
}

// leaseStatus is this node's coordinator state of ns (404 when it does
// not coordinate ns).
func (s *server) leaseStatus(w http.ResponseWriter, r *http.Request) {
	ns, err := namespace(r)
	if err != nil {
		httperr.Write(w, err)
		return
	}
	if s.leases != nil {
		if st, ok := s.leases.CoordinatorStatus(ns); ok {
			httperr.WriteJSON(w, http.StatusOK, st)
			return
		}
	}
	httperr.Write(w, &httperr.Error{Status: http.StatusNotFound, Code: api.CodeNotFound, Field: "namespace",
		Message: "namespace: this node holds no lease state for " + ns})
}

// leaseError is a lease message the node refused: a *lease.FieldError is
// a 400 naming the field (413 for an oversized body), anything else as is.
func leaseError(err error) error {
	var fe *lease.FieldError
	switch {
	case errors.As(err, &fe) && fe.Field == "body" && strings.HasPrefix(fe.Reason, "exceeds"):
		return httperr.TooLarge("body", "%s", fe.Reason)
	case errors.As(err, &fe):
		return httperr.Field(fe.Field, "%s", fe.Reason)
	default:
		return err
	}
}
