package webhook

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The specification's header names (canonical Go form of webhook-id,
// webhook-timestamp and webhook-signature; HTTP field names are case
// insensitive).
const (
	HeaderID        = "Webhook-Id"
	HeaderTimestamp = "Webhook-Timestamp"
	HeaderSignature = "Webhook-Signature"
)

const (
	// SecretPrefix starts every written secret.
	SecretPrefix = "whsec_"
	// MinSecretBytes and MaxSecretBytes bound a secret's key (bytes,
	// after base64 decoding): the specification recommends 24–64.
	MinSecretBytes = 24
	MaxSecretBytes = 64
	// DefaultTolerance is how far a webhook-timestamp may be from the
	// verifier's clock, either way (the specification's 5 minutes,
	// against replays).
	DefaultTolerance = 5 * time.Minute
	// signatureVersion tags a symmetric (HMAC-SHA256) signature.
	signatureVersion = "v1"
)

// Errors of ParseSecret and Verify; test with errors.Is.
var (
	// ErrSecret: a secret is not "whsec_" + the padded standard base64
	// of 24–64 bytes.
	ErrSecret = errors.New("webhook: invalid signing secret")
	// ErrMissingHeaders: webhook-id, webhook-timestamp or
	// webhook-signature is absent or empty.
	ErrMissingHeaders = errors.New("webhook: missing webhook-id, webhook-timestamp or webhook-signature")
	// ErrTimestamp: webhook-timestamp is not an integer, or is further
	// from now than the tolerance.
	ErrTimestamp = errors.New("webhook: webhook-timestamp unreadable or outside the tolerance")
	// ErrNoMatch: no v1 signature of the request matches any secret.
	ErrNoMatch = errors.New("webhook: no matching signature")
)

// Secret is one signing secret's key. Its String and Format never show the
// key: a Secret printed or logged by mistake shows its fingerprint only.
type Secret struct {
	key []byte
}

// ParseSecret reads a written secret: "whsec_" followed by the padded
// standard base64 (RFC 4648 §4) of a 24–64 byte key, and nothing else:
// no edge or inner whitespace, no line breaks, no missing padding, no
// non-zero padding bits. That is a subset of what the Standard Webhooks
// reference library loads, so a secret accepted here loads on every
// receiver, and each key has one spelling (one fingerprint, one string).
// The error wraps ErrSecret and never quotes the secret.
func ParseSecret(s string) (Secret, error) {
	return parseSecret(s, true)
}

// ParseStoredSecret reads a secret stored before ParseSecret became
// strict: it also takes unpadded base64 and ignores edge whitespace and
// line breaks. Use it only to sign with secrets already stored (the
// gossiped config), never to accept new ones.
func ParseStoredSecret(s string) (Secret, error) {
	return parseSecret(s, false)
}

func parseSecret(s string, strict bool) (Secret, error) {
	if !strict {
		s = strings.TrimSpace(s)
	}
	rest, ok := strings.CutPrefix(s, SecretPrefix)
	if !ok {
		return Secret{}, fmt.Errorf("%w: it must start with %q", ErrSecret, SecretPrefix)
	}
	var key []byte
	var err error
	if strict {
		// encoding/base64 skips CR and LF even in Strict mode: refuse
		// every byte outside the alphabet first.
		if i := strings.IndexFunc(rest, func(c rune) bool { return !strings.ContainsRune(stdAlphabet, c) }); i >= 0 {
			return Secret{}, fmt.Errorf("%w: byte %d after %q is not standard base64 (no whitespace or line breaks)", ErrSecret, i, SecretPrefix)
		}
		if len(rest)%4 != 0 {
			return Secret{}, fmt.Errorf("%w: the part after %q is %d characters, not a multiple of 4: standard base64 is padded with '='", ErrSecret, SecretPrefix, len(rest))
		}
		key, err = base64.StdEncoding.Strict().DecodeString(rest)
	} else {
		key, err = base64.StdEncoding.DecodeString(rest)
		if err != nil {
			key, err = base64.RawStdEncoding.DecodeString(rest)
		}
	}
	switch {
	case err != nil:
		return Secret{}, fmt.Errorf("%w: the part after %q is not padded standard base64", ErrSecret, SecretPrefix)
	case len(key) < MinSecretBytes || len(key) > MaxSecretBytes:
		return Secret{}, fmt.Errorf("%w: its key is %d bytes, it must be %d–%d", ErrSecret, len(key), MinSecretBytes, MaxSecretBytes)
	}
	return Secret{key: key}, nil
}

// stdAlphabet is standard base64's alphabet with its padding.
const stdAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/="

// ParseSecrets parses each of ss (ParseSecret); the error names the
// 0-based index of the first bad one.
func ParseSecrets(ss []string) ([]Secret, error) {
	return parseSecrets(ss, ParseSecret)
}

// ParseStoredSecrets is ParseSecrets with ParseStoredSecret: for secrets
// already stored, which may predate the strict form.
func ParseStoredSecrets(ss []string) ([]Secret, error) {
	return parseSecrets(ss, ParseStoredSecret)
}

func parseSecrets(ss []string, parse func(string) (Secret, error)) ([]Secret, error) {
	out := make([]Secret, 0, len(ss))
	for i, s := range ss {
		sec, err := parse(s)
		if err != nil {
			return nil, fmt.Errorf("secret %d: %w", i, err)
		}
		out = append(out, sec)
	}
	return out, nil
}

// NewSecret returns a fresh random secret of 32 bytes, written
// ("whsec_" + base64), for a user to give to both sides.
func NewSecret() string {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // crypto/rand.Read never fails (Go ≥ 1.24)
	return SecretPrefix + base64.StdEncoding.EncodeToString(key)
}

// Fingerprint identifies the secret without revealing it: the first 4
// bytes of SHA-256 of its key, in hex (8 characters), the form
// /v1/cluster uses for gossip keys.
func (s Secret) Fingerprint() string {
	sum := sha256.Sum256(s.key)
	return hex.EncodeToString(sum[:4])
}

// String shows the fingerprint, never the key.
func (s Secret) String() string { return "whsec_<redacted " + s.Fingerprint() + ">" }

// GoString is String, so %#v does not show the key either.
func (s Secret) GoString() string { return s.String() }

// sign is the v1 signature of one message with one secret, base64.
func (s Secret) sign(id string, ts int64, body []byte) string {
	m := hmac.New(sha256.New, s.key)
	m.Write([]byte(id))
	m.Write([]byte{'.'})
	m.Write(strconv.AppendInt(nil, ts, 10))
	m.Write([]byte{'.'})
	m.Write(body)
	return base64.StdEncoding.EncodeToString(m.Sum(nil))
}

// Signature is the webhook-signature value of one message: "v1,<sig>"
// for each secret, in order, space-separated ("" without secrets). ts is
// the webhook-timestamp (Unix seconds).
func Signature(id string, ts int64, body []byte, secrets ...Secret) string {
	var b strings.Builder
	for i, s := range secrets {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(signatureVersion)
		b.WriteByte(',')
		b.WriteString(s.sign(id, ts, body))
	}
	return b.String()
}

// Sign sets the three headers on h for a message id with body, sent at
// now (truncated to the second), signed with every secret. Without
// secrets it sets nothing.
func Sign(h http.Header, id string, now time.Time, body []byte, secrets ...Secret) {
	if len(secrets) == 0 {
		return
	}
	ts := now.Unix()
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, strconv.FormatInt(ts, 10))
	h.Set(HeaderSignature, Signature(id, ts, body, secrets...))
}

// Verify checks a received request's headers and body against the
// secrets the receiver knows: the timestamp must be within tolerance of
// now (0: DefaultTolerance; negative: not checked), and at least one v1
// signature must match one secret (compared in constant time). It returns
// nil, or an error wrapping ErrMissingHeaders, ErrTimestamp or ErrNoMatch.
func Verify(h http.Header, body []byte, now time.Time, tolerance time.Duration, secrets ...Secret) error {
	id, tsv, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || tsv == "" || sigs == "" {
		return ErrMissingHeaders
	}
	ts, err := strconv.ParseInt(tsv, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: %q is not integer seconds", ErrTimestamp, tsv)
	}
	tolerance = cmp.Or(tolerance, DefaultTolerance)
	if tolerance > 0 {
		if d := now.Sub(time.Unix(ts, 0)); d > tolerance || d < -tolerance {
			return fmt.Errorf("%w: %d is %v from now, the tolerance is %v", ErrTimestamp, ts, d.Round(time.Second), tolerance)
		}
	}
	for _, s := range secrets {
		want := []byte(s.sign(id, ts, body))
		for sig := range strings.FieldsSeq(sigs) {
			version, value, ok := strings.Cut(sig, ",")
			if ok && version == signatureVersion && hmac.Equal([]byte(value), want) {
				return nil
			}
		}
	}
	return ErrNoMatch
}
