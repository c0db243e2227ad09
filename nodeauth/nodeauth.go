// Package nodeauth authenticates node-to-node HTTP calls both ways with a
// shared cluster secret, without ever sending the secret.
//
// The caller signs every request: HMAC-SHA256, under a key derived from
// the secret, over the method, the Host, the request target (path and
// query as sent), a timestamp (unix ms), a random 16-byte nonce and the
// SHA-256 of the body. The callee (Middleware) refuses a request whose
// signature does not verify, whose timestamp is more than Window away
// from its clock, whose nonce it has already seen within the window
// (replay), or whose body does not match the signed digest; it answers
// 401 and never calls the handler.
//
// The callee signs every answer to a request it authenticated: HMAC-SHA256
// under a second derived key over the request's nonce and signature, the
// status, a timestamp and the SHA-256 of the answer's body. The caller
// (Transport) returns an error instead of a response that is unsigned or
// signed with another secret, so an address that does not hold the
// secret cannot answer for a member. Before a request with a body (rows,
// redrive keys) the caller also asks the host to prove itself with an
// empty signed challenge (ProofTTL caches a proof per host), so rows are
// only sent to an address that proved it is a member.
//
// Request and answer keys differ (HMAC(secret, label)), so an answer's
// signature can never be replayed as a request's. Several secrets may be
// given: the first signs, any verifies (rotation: add the new secret
// second everywhere, then first, then drop the old one).
//
// Wiring: the server wraps its whole handler with Middleware (it guards
// only paths under Prefix, so routes added there later are covered
// without change); every client of another node's Prefix routes uses
// Transport(base) as its http.Client's Transport (or Client). A nil *Auth
// is valid and does nothing (the insecure mode): Middleware returns the
// handler, Transport returns base.
package nodeauth

import (
	"cmp"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Headers and paths of the protocol.
const (
	// HeaderRequest carries a request's signature:
	// "v1;t=<unix ms>;n=<nonce, base64url>;b=<body sha256, hex>;s=<sig, base64url>".
	HeaderRequest = "Fairshard-Node-Auth"
	// HeaderResponse carries an answer's signature:
	// "v1;t=<unix ms>;b=<body sha256, hex>;s=<sig, base64url>".
	HeaderResponse = "Fairshard-Node-Auth-Response"
	// Prefix is the path prefix Middleware guards.
	Prefix = "/internal/"
	// PathChallenge is answered by Middleware itself (204, signed): the
	// proof a caller asks for before sending a body.
	PathChallenge = "/internal/nodeauth/v1/challenge"
)

// Defaults of Config.
const (
	// DefaultWindow is how far a signed timestamp may be from the
	// receiver's clock, either way; nonces are remembered this long.
	DefaultWindow = 30 * time.Second
	// DefaultProofTTL is how long a host's proof is trusted before a body
	// is sent to it again.
	DefaultProofTTL = 10 * time.Second
	// DefaultMaxBodyBytes bounds a request body the middleware reads to
	// check its digest (and an answer body the transport reads).
	DefaultMaxBodyBytes = 64 << 20
	// DefaultMaxNonces bounds the replay cache (authenticated requests
	// within one window); past it, requests are refused 503 until old
	// nonces expire.
	DefaultMaxNonces = 1 << 20
	// MinSecretBytes is the shortest secret accepted.
	MinSecretBytes = 16
)

// Errors returned (wrapped) by the transport.
var (
	// ErrPeerUnproven: the answer was unsigned or its signature did not
	// verify: the address does not hold the cluster secret.
	ErrPeerUnproven = errors.New("nodeauth: peer did not prove it holds the cluster secret")
	// ErrRefused: the peer answered 401 to our signed request (another
	// secret, a clock more than the window apart, or a replay).
	ErrRefused = errors.New("nodeauth: peer refused our signature")
)

// Config configures an Auth.
type Config struct {
	// Secrets are the cluster secrets, each at least MinSecretBytes: the
	// first signs, any verifies. Required.
	Secrets [][]byte
	// Window defaults to DefaultWindow.
	Window time.Duration
	// ProofTTL defaults to DefaultProofTTL; negative: never ask for a
	// proof before a body (answers are still verified).
	ProofTTL time.Duration
	// MaxBodyBytes defaults to DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxNonces defaults to DefaultMaxNonces.
	MaxNonces int
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
}

// Auth signs and verifies node-to-node calls. Safe for concurrent use.
type Auth struct {
	cfg     Config
	reqKeys [][]byte // per secret: the request key
	rspKeys [][]byte // per secret: the answer key

	mu     sync.Mutex
	nonces map[string]time.Time // seen nonce → expiry
	sweep  time.Time            // next sweep of expired nonces

	proofMu sync.Mutex
	proofs  map[string]time.Time // host → proven until
}

// New returns an Auth for cfg; an error names a bad field.
func New(cfg Config) (*Auth, error) {
	if len(cfg.Secrets) == 0 {
		return nil, errors.New("nodeauth: no secret")
	}
	for i, s := range cfg.Secrets {
		if len(s) < MinSecretBytes {
			return nil, fmt.Errorf("nodeauth: secret %d is %d bytes, at least %d are required", i+1, len(s), MinSecretBytes)
		}
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	cfg.ProofTTL = cmp.Or(cfg.ProofTTL, DefaultProofTTL)
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxNonces <= 0 {
		cfg.MaxNonces = DefaultMaxNonces
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	a := &Auth{cfg: cfg, nonces: map[string]time.Time{}, proofs: map[string]time.Time{}}
	for _, s := range cfg.Secrets {
		a.reqKeys = append(a.reqKeys, derive(s, "fairshard nodeauth v1 request"))
		a.rspKeys = append(a.rspKeys, derive(s, "fairshard nodeauth v1 response"))
	}
	return a, nil
}

func derive(secret []byte, label string) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(label))
	return m.Sum(nil)
}

func mac(key []byte, parts ...string) []byte {
	m := hmac.New(sha256.New, key)
	for _, p := range parts {
		// Length-prefixed, so no two part lists collide.
		m.Write([]byte(strconv.Itoa(len(p))))
		m.Write([]byte{':'})
		m.Write([]byte(p))
	}
	return m.Sum(nil)
}

// BodyDigest is the hex SHA-256 of body.
func BodyDigest(body []byte) string {
	s := sha256.Sum256(body)
	return hex.EncodeToString(s[:])
}

func newNonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return base64.RawURLEncoding.EncodeToString(b)
}

// requestSig signs a request's fields with key.
func requestSig(key []byte, method, host, target string, ts int64, nonce, digest string) []byte {
	return mac(key, "request", method, host, target, strconv.FormatInt(ts, 10), nonce, digest)
}

// responseSig signs an answer, bound to the request it answers.
func responseSig(key []byte, reqNonce, reqSig string, status int, ts int64, digest string) []byte {
	return mac(key, "response", reqNonce, reqSig, strconv.Itoa(status), strconv.FormatInt(ts, 10), digest)
}

// header is a parsed signature header.
type header struct {
	ts     int64
	nonce  string
	digest string
	sig    string
}

func (h header) requestString() string {
	return fmt.Sprintf("v1;t=%d;n=%s;b=%s;s=%s", h.ts, h.nonce, h.digest, h.sig)
}

func (h header) responseString() string {
	return fmt.Sprintf("v1;t=%d;b=%s;s=%s", h.ts, h.digest, h.sig)
}

// parseHeader reads "v1;k=v;..." (at most 512 bytes).
func parseHeader(v string, wantNonce bool) (header, error) {
	var h header
	if len(v) > 512 {
		return h, errors.New("signature header too long")
	}
	parts := strings.Split(v, ";")
	if len(parts) == 0 || parts[0] != "v1" {
		return h, errors.New("signature header is not v1")
	}
	seen := map[string]bool{}
	for _, p := range parts[1:] {
		k, val, ok := strings.Cut(p, "=")
		if !ok || seen[k] {
			return h, fmt.Errorf("signature header field %q malformed or repeated", k)
		}
		seen[k] = true
		switch k {
		case "t":
			t, err := strconv.ParseInt(val, 10, 64)
			if err != nil {
				return h, errors.New("signature header: t is not an integer")
			}
			h.ts = t
		case "n":
			h.nonce = val
		case "b":
			h.digest = val
		case "s":
			h.sig = val
		default:
			return h, fmt.Errorf("signature header: unknown field %q", k)
		}
	}
	if !seen["t"] || !seen["b"] || !seen["s"] || (wantNonce && (!seen["n"] || len(h.nonce) < 16)) {
		return h, errors.New("signature header: missing field")
	}
	if len(h.digest) != 64 {
		return h, errors.New("signature header: b is not a hex SHA-256")
	}
	return h, nil
}

// verify reports whether sig (base64url) equals one of the keys' MACs.
func verify(sig string, keys [][]byte, sign func(key []byte) []byte) bool {
	got, err := base64.RawURLEncoding.DecodeString(sig)
	if err != nil {
		return false
	}
	ok := false
	for _, k := range keys {
		if hmac.Equal(got, sign(k)) {
			ok = true
		}
	}
	return ok
}

// inWindow reports whether ts (unix ms) is within the window of now.
func (a *Auth) inWindow(ts int64) bool {
	d := a.cfg.Now().Sub(time.UnixMilli(ts))
	return d <= a.cfg.Window && d >= -a.cfg.Window
}

// errNonceCacheFull: too many authenticated requests within one window.
var errNonceCacheFull = errors.New("replay cache full")

// remember records nonce as used; false if it was already seen within
// the window (a replay).
func (a *Auth) remember(nonce string, ts int64) (bool, error) {
	now := a.cfg.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	if now.After(a.sweep) || len(a.nonces) >= a.cfg.MaxNonces {
		for n, exp := range a.nonces {
			if now.After(exp) {
				delete(a.nonces, n)
			}
		}
		a.sweep = now.Add(a.cfg.Window / 4)
	}
	if _, seen := a.nonces[nonce]; seen {
		return false, nil
	}
	if len(a.nonces) >= a.cfg.MaxNonces {
		return false, errNonceCacheFull
	}
	// Kept until the timestamp leaves the window on the late side.
	a.nonces[nonce] = time.UnixMilli(ts).Add(a.cfg.Window + time.Second)
	return true, nil
}

// bytesEqualConst compares two digests in constant time.
func bytesEqualConst(a, b string) bool { return hmac.Equal([]byte(a), []byte(b)) }
