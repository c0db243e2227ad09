package httpapi

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/internal/httperr"
	"github.com/fairshard/fairshard/kv"
)

// limitExceeded is a write refused at a documented cap (409): it names
// the thing capped in Field and the cap in Message.
func limitExceeded(field, format string, args ...any) *httperr.Error {
	return &httperr.Error{Status: http.StatusConflict, Code: api.CodeLimitExceeded, Field: field,
		Message: field + ": " + fmt.Sprintf(format, args...)}
}

// writeError writes err as the API's JSON error: the kv store's refusals
// become a 400 or 409; anything else is answered by httperr.Write.
func writeError(w http.ResponseWriter, err error) {
	var ae *httperr.Error
	var le *kv.LimitError
	switch {
	case errors.As(err, &ae):
	case errors.Is(err, kv.ErrInvalidEntry):
		// A value the gossiped config refuses (size, encoding) is the
		// caller's input, not a server fault.
		ae = &httperr.Error{Status: http.StatusBadRequest, Code: api.CodeInvalidField, Message: err.Error()}
	case errors.As(err, &le):
		// The whole config is at a cap of the kv store (entries or bytes),
		// which bounds the state every push/pull sends.
		ae = limitExceeded("config", "%v", le)
	}
	if ae == nil {
		httperr.Write(w, err)
		return
	}
	httperr.Write(w, ae)
}
