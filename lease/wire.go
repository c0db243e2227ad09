package lease

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Wire limits. A Request carries at most MaxEntries namespaces; a client
// with more for one coordinator sends several (Client.Calls does). The byte
// limits hold MaxEntries entries with 64-byte names and 10-digit numbers
// with room to spare (TestWireLimitsFitTheLargestMessages).
const (
	// MaxEntries bounds the namespaces of one Request (and so the leases
	// and not_coordinator names of its Response).
	MaxEntries = 16384
	// MaxRequestBytes bounds an encoded Request (bytes).
	MaxRequestBytes = 4 << 20
	// MaxResponseBytes bounds an encoded Response (bytes).
	MaxResponseBytes = 4 << 20
	// MaxLeaseMS bounds a lease's expiry_ms (10 minutes).
	MaxLeaseMS = 10 * 60 * 1000
)

// Request is one node's batched lease refresh to one coordinator: every
// namespace the node wants capacity of, or holds a grant of, that this
// coordinator coordinates. One call per node pair per refresh interval,
// whatever the number of namespaces.
type Request struct {
	// Node is the sender's node name (ValidNodeName).
	Node string `json:"node"`
	// Epoch is the sender's ownership epoch: the view it picked the
	// coordinator from. A coordinator whose own epoch is older refuses the
	// whole request (its view may be stale; see Coordinator). 0 means
	// unknown and is never refused.
	Epoch uint64 `json:"epoch"`
	// Asks has one entry per namespace, each namespace at most once.
	Asks []Ask `json:"namespaces"`
	// Seq orders the sender's requests: larger is later (Client starts it
	// at its creation's Unix time in ns and adds one per request built).
	// A coordinator ignores the report of a request older than the last
	// it applied from that node: a request held up in transit (its caller
	// gave up on it and asked again) would otherwise replace the newer
	// report its grant was computed from. 0 means unordered.
	Seq uint64 `json:"seq,omitempty"`
}

// Ask is one namespace's report in a Request (Doorman's wants and has).
type Ask struct {
	// Namespace (ValidNamespace).
	Namespace string `json:"namespace"`
	// Wants is how many rows of the namespace the node could run at once:
	// claimed + visible pending, at most the quota (rows).
	Wants uint32 `json:"wants"`
	// Has is how many rows of the quota the node holds: the larger of its
	// claimed rows and the grant it acts on now, if unexpired (rows). The
	// grant counts because a lower grant on its way back has not been
	// applied yet; see Client.Calls.
	Has uint32 `json:"has"`
}

// Response is the coordinator's answer to a Request: every asked namespace
// appears exactly once, either in Leases or in NotCoordinator.
type Response struct {
	// Epoch is the coordinator's ownership epoch (0: unknown).
	Epoch uint64 `json:"epoch"`
	// Leases are the grants, in the order asked.
	Leases []Lease `json:"leases"`
	// NotCoordinator lists asked namespaces this node does not coordinate
	// under its view (or all of them, if the sender's epoch is newer). The
	// sender keeps its grants for them until they expire.
	NotCoordinator []string `json:"not_coordinator,omitempty"`
}

// Lease is one namespace's grant in a Response (Doorman's gets).
type Lease struct {
	// Namespace (ValidNamespace), one the Request asked about.
	Namespace string `json:"namespace"`
	// Grant is the node's ceiling for the namespace (rows).
	Grant uint32 `json:"grant"`
	// ExpiryMS is when the grant expires, in ms after the sender sent the
	// Request (relative, so clocks need not agree; counted from the send
	// time, the sender's grant always expires before the coordinator stops
	// counting it). In [1, MaxLeaseMS].
	ExpiryMS uint32 `json:"expiry_ms"`
	// RefreshMS is how often the sender should refresh (ms), in
	// [1, ExpiryMS].
	RefreshMS uint32 `json:"refresh_ms"`
	// Learning says the coordinator is learning after a failover: it only
	// confirms what nodes hold.
	Learning bool `json:"learning,omitempty"`
}

// Expiry returns the lease length as a duration.
func (l Lease) Expiry() time.Duration { return time.Duration(l.ExpiryMS) * time.Millisecond }

// Refresh returns the refresh interval as a duration.
func (l Lease) Refresh() time.Duration { return time.Duration(l.RefreshMS) * time.Millisecond }

// FieldError is a malformed message: Field names the offending field as a
// JSON path ("namespaces[3].namespace", "body"), Reason says what is wrong.
// The node answers it with a 400 naming the field.
type FieldError struct {
	Field  string // JSON path of the offending field
	Reason string // what is wrong with it
}

// Error implements error.
func (e *FieldError) Error() string { return "lease: " + e.Field + ": " + e.Reason }

func fieldErr(field, format string, args ...any) *FieldError {
	return &FieldError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// Validate checks a Request: a valid node name, at most MaxEntries asks,
// each with a valid namespace, none twice. It returns a *FieldError naming
// the first bad field.
func (r Request) Validate() error {
	if !ValidNodeName(r.Node) {
		return fieldErr("node", "want 1 to %d bytes of UTF-8 without control characters", MaxNodeNameBytes)
	}
	if len(r.Asks) > MaxEntries {
		return fieldErr("namespaces", "%d namespaces exceed the limit of %d per request", len(r.Asks), MaxEntries)
	}
	seen := make(map[string]int, len(r.Asks))
	for i, a := range r.Asks {
		if !ValidNamespace(a.Namespace) {
			return fieldErr(fmt.Sprintf("namespaces[%d].namespace", i), "want 1 to %d bytes of letters, digits, '-', '_' and '.'", MaxNamespaceBytes)
		}
		if j, dup := seen[a.Namespace]; dup {
			return fieldErr(fmt.Sprintf("namespaces[%d].namespace", i), "%q is also namespaces[%d]", a.Namespace, j)
		}
		seen[a.Namespace] = i
	}
	return nil
}

// Validate checks a Response against the Request it answers: every asked
// namespace answered exactly once (in Leases or NotCoordinator), nothing
// else, and every lease's expiry_ms in [1, MaxLeaseMS] and refresh_ms in
// [1, expiry_ms]. It returns a *FieldError naming the first bad field.
func (r Response) Validate(req Request) error {
	if n := len(r.Leases) + len(r.NotCoordinator); n != len(req.Asks) {
		return fieldErr("leases", "%d answers for %d asked namespaces", n, len(req.Asks))
	}
	asked := make(map[string]bool, len(req.Asks)) // namespace → answered yet
	for _, a := range req.Asks {
		asked[a.Namespace] = false
	}
	answer := func(field, ns string) error {
		answered, ok := asked[ns]
		switch {
		case !ValidNamespace(ns):
			return fieldErr(field, "want 1 to %d bytes of letters, digits, '-', '_' and '.'", MaxNamespaceBytes)
		case !ok:
			return fieldErr(field, "%q was not asked for", ns)
		case answered:
			return fieldErr(field, "%q is answered twice", ns)
		}
		asked[ns] = true
		return nil
	}
	for i, l := range r.Leases {
		if err := answer(fmt.Sprintf("leases[%d].namespace", i), l.Namespace); err != nil {
			return err
		}
		if l.ExpiryMS == 0 || l.ExpiryMS > MaxLeaseMS {
			return fieldErr(fmt.Sprintf("leases[%d].expiry_ms", i), "%d is outside [1, %d]", l.ExpiryMS, MaxLeaseMS)
		}
		if l.RefreshMS == 0 || l.RefreshMS > l.ExpiryMS {
			return fieldErr(fmt.Sprintf("leases[%d].refresh_ms", i), "%d is outside [1, expiry_ms %d]", l.RefreshMS, l.ExpiryMS)
		}
	}
	for i, ns := range r.NotCoordinator {
		if err := answer(fmt.Sprintf("not_coordinator[%d]", i), ns); err != nil {
			return err
		}
	}
	return nil
}

// EncodeRequest returns the JSON encoding of a valid Request, or the
// validation error (a node never sends what a coordinator would refuse).
func EncodeRequest(r Request) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	if r.Asks == nil {
		r.Asks = []Ask{} // "namespaces": [] rather than null
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("lease: encode request of %s: %w", r.Node, err)
	}
	return b, nil
}

// DecodeRequest reads one JSON Request of at most MaxRequestBytes from r,
// rejecting unknown fields and trailing data, and validates it. Errors are
// *FieldError (a malformed or oversized body is field "body"), or the
// reader's error wrapped.
func DecodeRequest(r io.Reader) (Request, error) {
	data, err := readLimited(r, MaxRequestBytes)
	if err != nil {
		return Request{}, err
	}
	var req Request
	if err := strictUnmarshal(data, &req); err != nil {
		return Request{}, diagnose(data, err, "namespaces", func(raw []byte) error { return strictUnmarshal(raw, new(Ask)) })
	}
	if err := req.Validate(); err != nil {
		return Request{}, err
	}
	return req, nil
}

// EncodeResponse returns the JSON encoding of r. The coordinator builds
// responses itself, so it does not validate them; the client does.
func EncodeResponse(r Response) ([]byte, error) {
	if r.Leases == nil {
		r.Leases = []Lease{}
	}
	b, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("lease: encode response: %w", err)
	}
	return b, nil
}

// DecodeResponse reads one JSON Response of at most MaxResponseBytes from
// r, rejecting unknown fields and trailing data, and validates it against
// the Request it answers. Errors as DecodeRequest.
func DecodeResponse(r io.Reader, req Request) (Response, error) {
	data, err := readLimited(r, MaxResponseBytes)
	if err != nil {
		return Response{}, err
	}
	var resp Response
	if err := strictUnmarshal(data, &resp); err != nil {
		return Response{}, diagnose(data, err, "leases", func(raw []byte) error { return strictUnmarshal(raw, new(Lease)) })
	}
	if err := resp.Validate(req); err != nil {
		return Response{}, err
	}
	return resp, nil
}

func readLimited(r io.Reader, limit int64) ([]byte, error) {
	data, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("lease: read body: %w", err)
	}
	if int64(len(data)) > limit {
		return nil, fieldErr("body", "exceeds %d bytes", limit)
	}
	return data, nil
}

// strictUnmarshal decodes exactly one JSON value, rejecting unknown fields
// and trailing data.
func strictUnmarshal(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("unexpected data after the JSON value")
	}
	return nil
}

// unknownFieldPrefix starts encoding/json's DisallowUnknownFields error (it
// has no error type of its own; node/appendreq.go reads it the same way).
const unknownFieldPrefix = "json: unknown field "

// diagnose turns a failed one-pass decode into a *FieldError naming the
// field. The fast path decodes a whole message at once; only when that
// fails does this decode the list (field list) entry by entry to find the
// index of the bad one.
func diagnose(data []byte, err error, list string, entry func(raw []byte) error) error {
	var top map[string]json.RawMessage
	if json.Unmarshal(data, &top) == nil {
		var raws []json.RawMessage
		if json.Unmarshal(top[list], &raws) == nil {
			for i, raw := range raws {
				if eerr := entry(raw); eerr != nil {
					return jsonFieldError(fmt.Sprintf("%s[%d]", list, i), eerr)
				}
			}
		}
	}
	return jsonFieldError("", err)
}

// jsonFieldError names the field a decoding error is about: prefix.name for
// a value of the wrong type or an unknown field, else prefix (or "body").
func jsonFieldError(prefix string, err error) *FieldError {
	join := func(name string) string {
		if prefix == "" {
			return name
		}
		return prefix + "." + name
	}
	field := prefix
	field = cmp.Or(field, "body")
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &te) && te.Field != "":
		field = join(te.Field)
		return fieldErr(field, "want %s, got JSON %s", te.Type, te.Value)
	case strings.HasPrefix(err.Error(), unknownFieldPrefix):
		if name, uerr := strconv.Unquote(strings.TrimPrefix(err.Error(), unknownFieldPrefix)); uerr == nil {
			return fieldErr(join(name), "unknown field")
		}
	}
	return fieldErr(field, "invalid JSON: %v", err)
}
