package nodeauth

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Transport returns an http.RoundTripper that signs every request it
// sends through base (nil: http.DefaultTransport) and returns an error
// wrapping ErrPeerUnproven instead of an answer the peer did not sign with
// the cluster secret (ErrRefused when the peer answered 401 to our
// signature). Before a request with a body it asks the host for a proof
// (GET PathChallenge) unless the host proved itself within ProofTTL. The
// answer's body is read whole (at most MaxBodyBytes) to check its digest;
// the response handed back holds it in memory. A nil *Auth returns base
// unchanged.
//
// Use it for every client of another node's /internal/ routes:
//
//	tr := http.DefaultTransport.(*http.Transport).Clone()
//	client := &http.Client{Transport: auth.Transport(tr), Timeout: 30 * time.Second}
func (a *Auth) Transport(base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	if a == nil {
		return base
	}
	return &transport{a: a, base: base}
}

// Client is &http.Client{Transport: a.Transport(base), Timeout: timeout}.
func (a *Auth) Client(base http.RoundTripper, timeout time.Duration) *http.Client {
	return &http.Client{Transport: a.Transport(base), Timeout: timeout}
}

type transport struct {
	a    *Auth
	base http.RoundTripper
}

// RoundTrip implements http.RoundTripper.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil && req.Body != http.NoBody {
		var err error
		body, err = io.ReadAll(req.Body)
		_ = req.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("nodeauth: read request body: %w", err)
		}
	}
	if len(body) > 0 && t.a.cfg.ProofTTL > 0 && !t.proven(req.URL.Scheme, req.URL.Host) {
		if err := t.prove(req); err != nil {
			return nil, err
		}
	}
	return t.send(req, body)
}

// proven reports whether host proved itself within ProofTTL.
func (t *transport) proven(scheme, host string) bool {
	t.a.proofMu.Lock()
	defer t.a.proofMu.Unlock()
	return t.a.cfg.Now().Before(t.a.proofs[scheme+"://"+host])
}

// prove asks the host of req for a signed answer to an empty signed
// challenge and records the proof.
func (t *transport) prove(req *http.Request) error {
	u := *req.URL
	u.Path, u.RawPath, u.RawQuery = PathChallenge, "", ""
	creq, err := http.NewRequestWithContext(req.Context(), http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	creq.Host = req.Host
	resp, err := t.send(creq, nil)
	if err != nil {
		return fmt.Errorf("nodeauth: %s did not prove it is a member, nothing sent: %w", req.URL.Host, err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		return fmt.Errorf("nodeauth: %s answered the challenge with HTTP %d, nothing sent: %w", req.URL.Host, resp.StatusCode, ErrPeerUnproven)
	}
	t.a.proofMu.Lock()
	if len(t.a.proofs) > 4096 {
		clear(t.a.proofs)
	}
	t.a.proofs[req.URL.Scheme+"://"+req.URL.Host] = t.a.cfg.Now().Add(t.a.cfg.ProofTTL)
	t.a.proofMu.Unlock()
	return nil
}

// send signs req (body as given) and verifies the answer.
func (t *transport) send(req *http.Request, body []byte) (*http.Response, error) {
	out := req.Clone(req.Context())
	if body != nil {
		out.Body = io.NopCloser(bytes.NewReader(body))
		out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
		out.ContentLength = int64(len(body))
	} else {
		out.Body, out.GetBody, out.ContentLength = nil, nil, 0
	}
	host := out.Host
	host = cmp.Or(host, out.URL.Host)
	h := header{ts: t.a.cfg.Now().UnixMilli(), nonce: newNonce(), digest: BodyDigest(body)}
	h.sig = base64.RawURLEncoding.EncodeToString(requestSig(t.a.reqKeys[0], out.Method, host, out.URL.RequestURI(), h.ts, h.nonce, h.digest))
	out.Header.Set(HeaderRequest, h.requestString())

	resp, err := t.base.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, t.a.cfg.MaxBodyBytes+1))
	_ = resp.Body.Close()
	if err != nil {
		return nil, fmt.Errorf("nodeauth: read answer of %s: %w", out.URL.Host, err)
	}
	if int64(len(data)) > t.a.cfg.MaxBodyBytes {
		return nil, fmt.Errorf("nodeauth: answer of %s exceeds %d bytes", out.URL.Host, t.a.cfg.MaxBodyBytes)
	}
	rh, perr := parseHeader(resp.Header.Get(HeaderResponse), false)
	if perr != nil {
		if resp.StatusCode == http.StatusUnauthorized {
			return nil, fmt.Errorf("%w: %s answered HTTP 401: %.200s", ErrRefused, out.URL.Host, data)
		}
		return nil, fmt.Errorf("%w: %s answered HTTP %d without a valid signature (%v)", ErrPeerUnproven, out.URL.Host, resp.StatusCode, perr)
	}
	if !t.a.inWindow(rh.ts) || !bytesEqualConst(rh.digest, BodyDigest(data)) ||
		!verify(rh.sig, t.a.rspKeys, func(k []byte) []byte { return responseSig(k, h.nonce, h.sig, resp.StatusCode, rh.ts, rh.digest) }) {
		return nil, fmt.Errorf("%w: %s answered HTTP %d with a signature that does not verify", ErrPeerUnproven, out.URL.Host, resp.StatusCode)
	}
	resp.Body = io.NopCloser(bytes.NewReader(data))
	resp.ContentLength = int64(len(data))
	return resp, nil
}

// IsAuthError reports whether err is the peer failing to prove itself or
// refusing our signature.
func IsAuthError(err error) bool {
	return errors.Is(err, ErrPeerUnproven) || errors.Is(err, ErrRefused)
}
