// Package httperr is the JSON error shape every HTTP route of a node
// answers with, public (/v1) and node-to-node (/internal/v1) alike:
// {"error": {"code", "field", "message"}}, the code one of api's Code*
// constants, the field naming the offending input ("rows[3].namespace")
// where there is one. It also holds the strict JSON body decoding both
// kinds of route share, so a bad body is refused the same way on each.
package httperr

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/fairshard/fairshard/api"
)

// Error is an error a handler answers with Status and a JSON body.
// Message names the offending field where there is one, e.g.
// "rows[3].namespace: must match [A-Za-z0-9._-]{1,64}".
type Error struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Field   string `json:"field,omitempty"`
	Message string `json:"message"`
}

// Error returns the message, which names the field when there is one.
func (e *Error) Error() string { return e.Message }

// Field is a 400 invalid_field naming field; the message is
// "field: " followed by the formatted reason.
func Field(field, format string, args ...any) *Error {
	return &Error{Status: http.StatusBadRequest, Code: api.CodeInvalidField, Field: field,
		Message: field + ": " + fmt.Sprintf(format, args...)}
}

// TooLarge is a 413 too_large naming field (the body, a batch, a payload).
func TooLarge(field, format string, args ...any) *Error {
	return &Error{Status: http.StatusRequestEntityTooLarge, Code: api.CodeTooLarge, Field: field,
		Message: field + ": " + fmt.Sprintf(format, args...)}
}

// NotFound is a 404 not_found with message.
func NotFound(message string) *Error {
	return &Error{Status: http.StatusNotFound, Code: api.CodeNotFound, Message: message}
}

// Unavailable is a 503 unavailable with message: the node cannot take
// the call now; another node, or a retry, may.
func Unavailable(message string) *Error {
	return &Error{Status: http.StatusServiceUnavailable, Code: api.CodeUnavailable, Message: message}
}

// WriteJSON answers status with v as JSON, strings not HTML-escaped (a
// JSON payload keeps its '<', '>' and '&'): the answer is
// application/json with nosniff, so no browser reads it as a page.
func WriteJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// Write answers err as the JSON error: an *Error (anywhere in err's
// chain) with its status, anything else as a 500 internal whose message
// is err's text.
func Write(w http.ResponseWriter, err error) {
	var e *Error
	if !errors.As(err, &e) {
		e = &Error{Status: http.StatusInternalServerError, Code: api.CodeInternal, Message: err.Error()}
	}
	WriteJSON(w, e.Status, map[string]*Error{"error": e})
}

// MaxBodyBytes bounds the small JSON bodies DecodeJSON reads: 1 MiB.
const MaxBodyBytes = 1 << 20

// DecodeJSON strictly decodes r's body (at most MaxBodyBytes) into v:
// unknown fields, trailing data and bad syntax are a 400 invalid_json
// naming "body".
func DecodeJSON(w http.ResponseWriter, r *http.Request, v any) error {
	r.Body = http.MaxBytesReader(w, r.Body, MaxBodyBytes)
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return &Error{Status: http.StatusBadRequest, Code: api.CodeInvalidJSON, Field: "body", Message: "body: " + err.Error()}
	}
	if dec.More() {
		return &Error{Status: http.StatusBadRequest, Code: api.CodeInvalidJSON, Field: "body", Message: "body: unexpected data after the JSON value"}
	}
	return nil
}
