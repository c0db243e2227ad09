package node

import (
	"encoding/json"

	"errors"
	"fmt"
	"github.com/fairshard/fairshard/cluster"
	"net/http"
)

// Error codes of the public API's JSON errors ({"error":{"code","message"}}).
const (
	CodeInvalidJSON      = "invalid_json"
	CodeInvalidField     = "invalid_field"
	CodeTooLarge         = "too_large"
	CodeUnauthorized     = "unauthorized"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeUnavailable      = "unavailable"
	CodeInternal         = "internal"
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

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// writeError writes err as the API's JSON error. Errors that are not
// *APIError become a 500 whose message is err's text.
func writeError(w http.ResponseWriter, err error) {
	var ae *APIError
	if !errors.As(err, &ae) && errors.Is(err, cluster.ErrInvalidConfigEntry) {
		// A value the gossiped config refuses (size, encoding) is the
		// caller's input, not a server fault.
		ae = &APIError{Status: http.StatusBadRequest, Code: CodeInvalidField, Message: err.Error()}
	}
	if ae == nil {
		ae = &APIError{Status: http.StatusInternalServerError, Code: CodeInternal, Message: err.Error()}
	}
	writeJSON(w, ae.Status, map[string]*APIError{"error": ae})
}
