package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/kv"
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
	return &APIError{Status: http.StatusBadRequest, Code: api.CodeInvalidField, Field: field,
		Message: field + ": " + fmt.Sprintf(format, args...)}
}

func tooLarge(field, format string, args ...any) *APIError {
	return &APIError{Status: http.StatusRequestEntityTooLarge, Code: api.CodeTooLarge, Field: field,
		Message: field + ": " + fmt.Sprintf(format, args...)}
}

// limitExceeded is a write refused at a documented cap (409): it names
// the thing capped in Field and the cap in Message.
func limitExceeded(field, format string, args ...any) *APIError {
	return &APIError{Status: http.StatusConflict, Code: api.CodeLimitExceeded, Field: field,
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
		ae = &APIError{Status: http.StatusBadRequest, Code: api.CodeInvalidField, Message: err.Error()}
	case errors.As(err, &le):
		// The whole config is at a cap of the kv store (entries or bytes),
		// which bounds the state every push/pull sends.
		ae = limitExceeded("config", "%v", le)
	}
	if ae == nil {
		ae = &APIError{Status: http.StatusInternalServerError, Code: api.CodeInternal, Message: err.Error()}
	}
	writeJSON(w, ae.Status, map[string]*APIError{"error": ae})
}
