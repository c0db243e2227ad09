package httpapi

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/fairshard/fairshard/dispatch"
	"github.com/fairshard/fairshard/internal/httperr"
	"github.com/fairshard/fairshard/internal/settings"
	"github.com/fairshard/fairshard/kv"
	"github.com/fairshard/fairshard/webhook"
)

// Limits of a target's credentials. Beyond these, the whole stored target
// (URL, secrets, headers, as JSON) must fit one entry of the gossiped
// config, kv.MaxValueBytes (1 KiB).
const (
	// MaxSigningSecrets is the most signing secrets of one target: a
	// rotation needs two (new and old); a third lets a new rotation start
	// before the last one's old secret is dropped.
	MaxSigningSecrets = 3
	// MaxTargetHeaders is the most static headers of one target.
	MaxTargetHeaders = 16
	// MaxHeaderNameBytes bounds a static header's name (bytes).
	MaxHeaderNameBytes = 64
)

// targetRequest is the body of PUT .../target. signing_secret (one) and
// signing_secrets (several, newest first, for rotation) are two spellings
// of the same setting; a request gives at most one of them. The request
// replaces the whole target: secrets and headers it does not give are
// removed.
type targetRequest struct {
	URL            string            `json:"url"`
	TimeoutMS      int64             `json:"timeout_ms"`
	SigningSecret  *string           `json:"signing_secret"`
	SigningSecrets []string          `json:"signing_secrets"`
	Headers        map[string]string `json:"headers"`
}

// targetView is the answer of PUT .../target: the target with its
// credentials redacted (secrets by fingerprint, headers by name).
type targetView struct {
	Namespace string `json:"namespace"`
	TaskQueue string `json:"task_queue"`
	settings.RedactedTarget
}

// checkCredentials validates the request's signing secrets and static
// headers into t. Errors name the field (signing_secret,
// signing_secrets[i], headers, headers.<Name>) and never quote a secret or
// a header value.
func (req *targetRequest) checkCredentials(t *settings.TargetSettings) error {
	secrets := req.SigningSecrets
	field := func(i int) string { return fmt.Sprintf("signing_secrets[%d]", i) }
	if req.SigningSecret != nil {
		if req.SigningSecrets != nil {
			return httperr.Field("signing_secrets", "give signing_secret or signing_secrets, not both")
		}
		secrets = []string{*req.SigningSecret}
		field = func(int) string { return "signing_secret" }
	}
	if len(secrets) > MaxSigningSecrets {
		return httperr.Field("signing_secrets", "has %d secrets, the limit is %d (a rotation needs two)", len(secrets), MaxSigningSecrets)
	}
	seen := map[string]int{}
	for i, s := range secrets {
		sec, err := webhook.ParseSecret(s)
		if err != nil {
			return httperr.Field(field(i), "is not a signing secret: it must be %q followed by the standard base64 of %d–%d random bytes (%v)",
				webhook.SecretPrefix, webhook.MinSecretBytes, webhook.MaxSecretBytes, err)
		}
		if j, dup := seen[sec.Fingerprint()]; dup {
			return httperr.Field(field(i), "is the same secret as signing_secrets[%d]", j)
		}
		seen[sec.Fingerprint()] = i
	}
	if len(secrets) > 0 {
		t.SigningSecrets = secrets
	}

	if len(req.Headers) > MaxTargetHeaders {
		return httperr.Field("headers", "has %d headers, the limit is %d", len(req.Headers), MaxTargetHeaders)
	}
	for _, name := range slices.Sorted(maps.Keys(req.Headers)) { // the same error for the same request
		v := req.Headers[name]
		if !validHeaderName(name) {
			return httperr.Field("headers", "header name %.64q must be 1-%d characters of an HTTP token (letters, digits and !#$%%&'*+-.^_`|~)", name, MaxHeaderNameBytes)
		}
		canon := http.CanonicalHeaderKey(name)
		f := "headers." + canon
		if dispatch.ReservedHeader(canon) {
			return httperr.Field(f, "is reserved: hop-by-hop and framing headers, Content-Type, User-Agent, Idempotency-Key and every Fairshard-* and Webhook-* header are set by the node")
		}
		if _, dup := t.Headers[canon]; dup {
			return httperr.Field(f, "is given twice (header names are case-insensitive)")
		}
		if msg := headerValueProblem(v); msg != "" {
			return httperr.Field(f, "value %s", msg)
		}
		if t.Headers == nil {
			t.Headers = map[string]string{}
		}
		t.Headers[canon] = v
	}

	// The whole target is one entry of the gossiped config.
	b, err := json.Marshal(t)
	if err != nil {
		return err
	}
	if len(b) > kv.MaxValueBytes {
		f := "url"
		switch {
		case len(t.Headers) > 0:
			f = "headers"
		case len(t.SigningSecrets) > 0:
			f = "signing_secrets"
		}
		return httperr.Field(f, "makes the stored target %d bytes; URL, signing secrets and headers together must fit the gossiped config's %d bytes per entry", len(b), kv.MaxValueBytes)
	}
	return nil
}

// validHeaderName reports whether name is an HTTP field name (RFC 9110
// §5.1: a token) of 1–MaxHeaderNameBytes bytes.
func validHeaderName(name string) bool {
	if name == "" || len(name) > MaxHeaderNameBytes {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case c < 0x80 && containsByte("!#$%&'*+-.^_`|~", c):
		default:
			return false
		}
	}
	return true
}

func containsByte(s string, c byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == c {
			return true
		}
	}
	return false
}

// headerValueProblem says what makes v unfit for a static header value,
// "" when nothing does: it must be 1 or more visible ASCII characters
// with inner spaces only (RFC 9110 §5.5 without obs-text; tabs and edge
// whitespace would not arrive as sent). It never quotes v.
func headerValueProblem(v string) string {
	if v == "" {
		return "is empty"
	}
	if v[0] == ' ' || v[len(v)-1] == ' ' {
		return "has leading or trailing spaces, which would not reach the target"
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c > 0x7e {
			return fmt.Sprintf("has a byte 0x%02x at %d: only visible ASCII and inner spaces travel intact", c, i)
		}
	}
	return ""
}
