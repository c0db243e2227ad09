package client

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/fairshard/fairshard/api"
)

// Error codes of the API's JSON errors: package api's, under the names
// this package has always used.
const (
	CodeInvalidJSON          = api.CodeInvalidJSON
	CodeInvalidField         = api.CodeInvalidField
	CodeTooLarge             = api.CodeTooLarge
	CodeUnauthorized         = api.CodeUnauthorized
	CodeNotFound             = api.CodeNotFound
	CodeMethodNotAllowed     = api.CodeMethodNotAllowed
	CodeLimitExceeded        = api.CodeLimitExceeded
	CodeUnavailable          = api.CodeUnavailable
	CodeInsufficientCopies   = api.CodeInsufficientCopies
	CodeInternal             = api.CodeInternal
	CodeUnsupportedMediaType = api.CodeUnsupportedMediaType
	CodeCrossSite            = api.CodeCrossSite
	CodeMisdirected          = api.CodeMisdirected
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
