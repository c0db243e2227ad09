package client

import (
	"fmt"
	"net/http"
	"strings"
)

// Error codes of the API's JSON errors ({"error":{"code","field","message"}}),
// as listed in api/openapi.yaml (components/schemas/ErrorCode).
const (
	// CodeInvalidJSON: the body (or a row of it) is not the JSON the call
	// takes: bad syntax, a value of the wrong type or an unknown field.
	CodeInvalidJSON = "invalid_json"
	// CodeInvalidField: a field's value breaks a rule; Error.Field names it,
	// e.g. "rows[3].namespace".
	CodeInvalidField = "invalid_field"
	// CodeTooLarge: the body, the batch or a payload is over its limit
	// (HTTP 413).
	CodeTooLarge = "too_large"
	// CodeUnauthorized: the node runs with --api-token and the call did not
	// carry it (HTTP 401).
	CodeUnauthorized = "unauthorized"
	// CodeNotFound: no such row (GET /v1/rows/{key}) or no such endpoint.
	CodeNotFound = "not_found"
	// CodeMethodNotAllowed: the path exists but not with this method (405).
	CodeMethodNotAllowed = "method_not_allowed"
	// CodeLimitExceeded: the write would pass a documented cap of the
	// gossiped config (--max-namespaces, --max-targets, --max-holds, or its
	// total size); Error.Field names what is capped ("namespace", "target",
	// "hold", "config"). Nothing changed (HTTP 409); not retried.
	CodeLimitExceeded = "limit_exceeded"
	// CodeUnavailable: the node cannot take the call now (draining, store
	// failure); another node, or a retry, may (HTTP 503).
	CodeUnavailable = "unavailable"
	// CodeInsufficientCopies: an append some row of which could not be made
	// durable on the write-copies minimum of its replicas (a replica is
	// down); nothing is reported stored (HTTP 503 with Retry-After):
	// retried like any 503.
	CodeInsufficientCopies = "insufficient_copies"
	// CodeInternal: the node failed (HTTP 500).
	CodeInternal = "internal"
	// CodeUnsupportedMediaType: a POST, PUT or PATCH without Content-Type
	// application/json (HTTP 415); the client always sends it.
	CodeUnsupportedMediaType = "unsupported_media_type"
	// CodeCrossSite: a write a browser sent for a page of another site
	// (HTTP 403); not sent by this client.
	CodeCrossSite = "cross_site"
	// CodeMisdirected: a node without --api-token refused the Host the
	// request named (HTTP 421): reach it by a loopback name, one of its
	// addresses, or a name in its --allow-host.
	CodeMisdirected = "misdirected"
)

// Error is an API answer other than 2xx. Safe to share; never modified after
// it is returned.
type Error struct {
	// StatusCode is the HTTP status, e.g. 400.
	StatusCode int
	// Code is the API's error code (the Code* constants), or "" when the
	// answer was not the API's JSON error (e.g. a proxy's 502 page).
	Code string
	// Field names the offending input when there is one, e.g.
	// "rows[3].namespace", "max_in_flight", "body".
	Field string
	// Message is the node's explanation (it starts with Field when set), or
	// the start of a non-JSON answer's body.
	Message string
	// Method and Path are the request's (the path without the node's base
	// URL), Node the base URL of the node that answered.
	Method, Path, Node string
}

// Error reports the call, the status, the code and the message.
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fairshard: %s %s", e.Method, e.Path)
	if e.Node != "" {
		fmt.Fprintf(&b, " on %s", e.Node)
	}
	fmt.Fprintf(&b, ": HTTP %d", e.StatusCode)
	if e.Code != "" {
		fmt.Fprintf(&b, " %s", e.Code)
	}
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	return b.String()
}

// Is reports whether target is an *Error with the same Code (and, when
// target's Field is set, the same Field), so errors.Is(err, ErrNotFound)
// works on any not_found answer.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	if !ok || t.Code == "" {
		return false
	}
	return t.Code == e.Code && (t.Field == "" || t.Field == e.Field)
}

// Sentinels for errors.Is: each matches any *Error with its code.
var (
	ErrInvalidJSON      = &Error{Code: CodeInvalidJSON}
	ErrInvalidField     = &Error{Code: CodeInvalidField}
	ErrTooLarge         = &Error{Code: CodeTooLarge}
	ErrUnauthorized     = &Error{Code: CodeUnauthorized}
	ErrNotFound         = &Error{Code: CodeNotFound}
	ErrMethodNotAllowed = &Error{Code: CodeMethodNotAllowed}
	ErrLimitExceeded    = &Error{Code: CodeLimitExceeded}
	ErrUnavailable      = &Error{Code: CodeUnavailable}
	// ErrInsufficientCopies matches a refused append for want of replicas.
	ErrInsufficientCopies = &Error{Code: CodeInsufficientCopies}
	ErrInternal           = &Error{Code: CodeInternal}
)

// retryableStatus reports whether an answer with this status may succeed on
// another node or later: 503 (the node is draining or its store failed),
// 502 and 504 (a proxy in front of the node could not reach it), 429.
func retryableStatus(status int) bool {
	switch status {
	case http.StatusServiceUnavailable, http.StatusBadGateway, http.StatusGatewayTimeout, http.StatusTooManyRequests:
		return true
	}
	return false
}
