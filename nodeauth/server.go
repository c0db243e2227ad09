package nodeauth

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"path"
	"strings"
)

// Guarded reports whether Middleware authenticates a request for urlPath:
// it or its cleaned form is under Prefix (so "/v1/../internal/x" counts).
func Guarded(urlPath string) bool {
	return strings.HasPrefix(urlPath, Prefix) || strings.HasPrefix(path.Clean("/"+urlPath)+"/", Prefix)
}

// Middleware authenticates every request under Prefix before next sees it
// and signs next's answers to them; other paths pass through untouched. A
// refused request is answered 401 (413 for a body over MaxBodyBytes, 503
// when the replay cache is full) with the API's JSON error shape
// {"error":{"code","message"}}; next is not called. GET PathChallenge is
// answered here: 204, signed. A nil *Auth returns next.
func (a *Auth) Middleware(next http.Handler) http.Handler {
	if a == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !Guarded(r.URL.Path) {
			next.ServeHTTP(w, r)
			return
		}
		h, err := parseHeader(r.Header.Get(HeaderRequest), true)
		if err != nil {
			refuse(w, http.StatusUnauthorized, "node-to-node call without a valid "+HeaderRequest+" signature: "+err.Error())
			return
		}
		if !a.inWindow(h.ts) {
			refuse(w, http.StatusUnauthorized, "node-to-node call signed at a time outside the replay window (check the clocks)")
			return
		}
		ok := verify(h.sig, a.reqKeys, func(k []byte) []byte {
			return requestSig(k, r.Method, r.Host, r.RequestURI, h.ts, h.nonce, h.digest)
		})
		if !ok {
			refuse(w, http.StatusUnauthorized, "node-to-node call signed with another cluster secret (or altered on the way)")
			return
		}
		fresh, err := a.remember(h.nonce, h.ts)
		switch {
		case errors.Is(err, errNonceCacheFull):
			refuse(w, http.StatusServiceUnavailable, "too many node-to-node calls within the replay window; retry later")
			return
		case !fresh:
			refuse(w, http.StatusUnauthorized, "node-to-node call replayed (its nonce was already used)")
			return
		}
		// A body declared over the limit is refused before any of it is read.
		if r.ContentLength > a.cfg.MaxBodyBytes {
			refuseCode(w, http.StatusRequestEntityTooLarge, "too_large", "body: exceeds the node-to-node limit")
			return
		}
		// The body is read whole (authenticated callers only) and checked
		// against the signed digest before the handler sees any of it.
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, a.cfg.MaxBodyBytes))
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				refuseCode(w, http.StatusRequestEntityTooLarge, "too_large", "body: exceeds the node-to-node limit")
				return
			}
			refuseCode(w, http.StatusBadRequest, "invalid_json", "body: "+err.Error())
			return
		}
		if !bytesEqualConst(BodyDigest(body), h.digest) {
			refuse(w, http.StatusUnauthorized, "node-to-node call body does not match its signed digest")
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))

		rec := &recorder{header: http.Header{}, status: http.StatusOK}
		if r.Method == http.MethodGet && r.URL.Path == PathChallenge {
			rec.status = http.StatusNoContent
		} else {
			next.ServeHTTP(rec, r)
		}
		ts := a.cfg.Now().UnixMilli()
		digest := BodyDigest(rec.body.Bytes())
		sig := responseSig(a.rspKeys[0], h.nonce, h.sig, rec.status, ts, digest)
		for k, v := range rec.header {
			w.Header()[k] = v
		}
		w.Header().Set(HeaderResponse, header{ts: ts, digest: digest, sig: base64.RawURLEncoding.EncodeToString(sig)}.responseString())
		w.WriteHeader(rec.status)
		_, _ = w.Write(rec.body.Bytes())
	})
}

// recorder buffers an answer so it can be signed whole.
type recorder struct {
	header      http.Header
	status      int
	wroteHeader bool
	body        bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if !r.wroteHeader {
		r.status, r.wroteHeader = status, true
	}
}

func (r *recorder) Write(b []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(b)
}

func refuse(w http.ResponseWriter, status int, msg string) {
	code := "unauthorized"
	if status == http.StatusServiceUnavailable {
		code = "unavailable"
	}
	refuseCode(w, status, code, msg)
}

func refuseCode(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", `Fairshard-Node-Auth realm="fairshard-internal"`)
	}
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]string{"code": code, "message": msg}})
}
