package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/fairshard/fairshard/kv"
)

// Error codes of the public API's JSON errors ({"error":{"code","message"}}).
const (
	CodeInvalidJSON      = "invalid_json"
	CodeInvalidField     = "invalid_field"
	CodeTooLarge         = "too_large"
	CodeUnauthorized     = "unauthorized"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeLimitExceeded    = "limit_exceeded"
	CodeUnavailable      = "unavailable"
	// CodeInsufficientCopies: an append some row of which could not be
	// made durable on the write-copies minimum of replicas (503, with
	// Retry-After; nothing is reported stored, the batch may be retried).
	CodeInsufficientCopies = "insufficient_copies"
	CodeInternal           = "internal"
	// CodeUnsupportedMediaType: a write on /v1 without Content-Type
	// application/json (415, field Content-Type): what a web page sends
	// cross-site without a preflight.
	CodeUnsupportedMediaType = "unsupported_media_type"
	// CodeCrossSite: a write a browser sent for a page of another site
	// (403, field Origin or Sec-Fetch-Site); --allow-origin admits one.
	CodeCrossSite = "cross_site"
	// CodeMisdirected: without an API token, a request whose Host is not
	// a loopback name, the node's own address or --allow-host (421, field
	// Host): what DNS rebinding sends.
	CodeMisdirected = "misdirected"
)

// APIError is an error the HTTP layer turns into a JSON body and a status.
// Message names the offending field where there is one, e.g.
// "rows[3].namespace: must match [A-Za-z0-9._-]{1,64}".
type APIError struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

// Error returns the message, which names the field when there is one.
func (e *APIError) Error() string { return e.Message }

func fieldError(field, format string, args ...any) *APIError {
	return &APIError{Status: http.StatusBadRequest, Code: CodeInvalidField, Field: field,
		Message: field + ": " + fmt.Sprintf(format, args...)}
}

func tooLarge(field, format string, args ...any) *APIError {
	return &APIError{Status: http.StatusRequestEntityTooLarge, Code: CodeTooLarge, Field: field,
		Message: field + ": " + fmt.Sprintf(format, args...)}
}

// limitExceeded is a write refused at a documented cap (409): it names
// the thing capped in Field and the cap in Message.
func limitExceeded(field, format string, args ...any) *APIError {
	return &APIError{Status: http.StatusConflict, Code: CodeLimitExceeded, Field: field,
		Message: field + ": " + fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes err as the API's JSON error. Errors that are not
// *APIError become a 500 whose message is err's text.
func writeError(w http.ResponseWriter, err error) {
	var ae *APIError
	var le *kv.LimitError
	switch {
	case errors.As(err, &ae):
	case errors.Is(err, kv.ErrInvalidEntry):
		// A value the gossiped config refuses (size, encoding) is the
		// caller's input, not a server fault.
		ae = &APIError{Status: http.StatusBadRequest, Code: CodeInvalidField, Message: err.Error()}
	case errors.As(err, &le):
		// The whole config is at a cap of the kv store (entries or bytes),
		// which bounds the state every push/pull sends.
		ae = limitExceeded("config", "%v", le)
	}
	if ae == nil {
		ae = &APIError{Status: http.StatusInternalServerError, Code: CodeInternal, Message: err.Error()}
	}
	writeJSON(w, ae.Status, map[string]*APIError{"error": ae})
}
