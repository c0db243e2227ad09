package httperr

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestWrite: an *Error anywhere in the chain is answered with its status
// and fields, anything else as a 500 internal; every answer is JSON with
// nosniff, its strings not HTML-escaped.
func TestWrite(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
		body   string
	}{
		{fmt.Errorf("row k: %w", Field("rows[3].namespace", "must be <64 bytes")), 400,
			`{"error":{"code":"invalid_field","field":"rows[3].namespace","message":"rows[3].namespace: must be <64 bytes"}}`},
		{NotFound("not here"), 404, `{"error":{"code":"not_found","message":"not here"}}`},
		{errors.New("disk & co"), 500, `{"error":{"code":"internal","message":"disk & co"}}`},
	} {
		rec := httptest.NewRecorder()
		Write(rec, c.err)
		if rec.Code != c.status || strings.TrimSpace(rec.Body.String()) != c.body ||
			rec.Header().Get("Content-Type") != "application/json" || rec.Header().Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("Write(%v) = %d %s %v, want %d %s as JSON with nosniff", c.err, rec.Code, rec.Body, rec.Header(), c.status, c.body)
		}
	}
}

// TestDecodeJSON: unknown fields, trailing data and bad syntax are a 400
// invalid_json naming the body; a good body decodes.
func TestDecodeJSON(t *testing.T) {
	type in struct{ A int }
	for body, ok := range map[string]bool{`{"A":1}`: true, `{"A":1,"B":2}`: false, `{"A":1} {}`: false, `{"A":`: false} {
		var v in
		err := DecodeJSON(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/", strings.NewReader(body)), &v)
		var e *Error
		switch {
		case ok && (err != nil || v.A != 1):
			t.Errorf("%s: %v %+v, want A=1", body, err, v)
		case !ok && (!errors.As(err, &e) || e.Status != 400 || e.Code != "invalid_json" || e.Field != "body"):
			t.Errorf("%s: %v, want a 400 invalid_json naming body", body, err)
		}
	}
}
