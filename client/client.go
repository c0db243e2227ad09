package client

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure a Client. Zero fields take the defaults named on them.
type Options struct {
	// Nodes are base URLs of cluster nodes, e.g. "http://10.0.0.1:8080"
	// (scheme http or https; a path prefix is kept, for a node behind a
	// proxy). At least one is required; calls are spread over them.
	Nodes []string
	// Token is sent as "Authorization: Bearer <token>" when set (the nodes'
	// --api-token).
	Token string
	// HTTPClient sends the requests. Defaults to a client of its own with
	// up to 64 idle connections per node; its Timeout, if any, also bounds
	// each attempt.
	HTTPClient *http.Client
	// Timeout bounds one attempt (connect, send, answer and body). Defaults
	// to 30 s. The context passed to each call bounds the whole call.
	Timeout time.Duration
	// Retry shapes retries of idempotent calls; see RetryConfig.
	Retry RetryConfig
	// UserAgent is sent as User-Agent. Defaults to "fairshard-go-client".
	UserAgent string
	// OnAttempt, if set, is called after every attempt of every call, from
	// the calling goroutine (so it must be safe for concurrent use when the
	// Client is shared). See also WithAttemptHook for one call's attempts.
	OnAttempt func(Attempt)
}

// RetryConfig shapes the retries of idempotent calls. Zero fields take the
// defaults named on them.
type RetryConfig struct {
	// MaxAttempts is the most attempts of one call, the first included.
	// Defaults to 4; 1 disables retries.
	MaxAttempts int
	// BaseDelay is the wait before the first retry. Defaults to 100 ms.
	// The wait doubles with each retry, up to MaxDelay, and is jittered: a
	// wait d is drawn uniformly from [d/2, d).
	BaseDelay time.Duration
	// MaxDelay caps the backoff. Defaults to 2 s.
	MaxDelay time.Duration
	// MaxRetryAfter caps how far a node's Retry-After header may lengthen a
	// wait (it never shortens one). Defaults to 30 s; negative ignores
	// Retry-After.
	MaxRetryAfter time.Duration
}

// Defaults of Options and RetryConfig.
const (
	DefaultTimeout       = 30 * time.Second
	DefaultMaxAttempts   = 4
	DefaultBaseDelay     = 100 * time.Millisecond
	DefaultMaxDelay      = 2 * time.Second
	DefaultMaxRetryAfter = 30 * time.Second
	defaultUserAgent     = "fairshard-go-client"
	// nodeCooldownBase and nodeCooldownMax bound how long a failing node is
	// set aside: base × 2^(consecutive failures − 1), capped.
	nodeCooldownBase = 500 * time.Millisecond
	nodeCooldownMax  = 30 * time.Second
)

func (r RetryConfig) withDefaults() RetryConfig {
	if r.MaxAttempts <= 0 {
		r.MaxAttempts = DefaultMaxAttempts
	}
	if r.BaseDelay <= 0 {
		r.BaseDelay = DefaultBaseDelay
	}
	if r.MaxDelay <= 0 {
		r.MaxDelay = DefaultMaxDelay
	}
	r.MaxDelay = max(r.MaxDelay, r.BaseDelay)
	r.MaxRetryAfter = cmp.Or(r.MaxRetryAfter, DefaultMaxRetryAfter)
	return r
}

// Attempt describes one HTTP attempt of a call, for OnAttempt hooks
// (logging, metrics, or knowing which rows were sent more than once).
type Attempt struct {
	// Method and Path of the request (Path without the node's base URL,
	// query included).
	Method, Path string
	// Node is the base URL the attempt went to.
	Node string
	// N is the attempt's number within its call, from 1.
	N int
	// StatusCode is the HTTP status answered, 0 when none was (connection
	// error, timeout).
	StatusCode int
	// Err is the attempt's error: nil on a 2xx answer, an *Error for other
	// answers, else the transport error.
	Err error
	// Duration is how long the attempt took.
	Duration time.Duration
	// WillRetry says whether the call goes on with another attempt.
	WillRetry bool
}

type attemptHookKey struct{}

// WithAttemptHook returns a context under which every attempt of a call is
// also reported to fn (after Options.OnAttempt). fn runs on the calling
// goroutine.
func WithAttemptHook(ctx context.Context, fn func(Attempt)) context.Context {
	return context.WithValue(ctx, attemptHookKey{}, fn)
}

// Client calls a fairshard cluster's API. Build with New; safe for
// concurrent use.
type Client struct {
	opts  Options
	retry RetryConfig
	http  *http.Client
	// ownHTTP is set when the client built its own http.Client (Close
	// closes its idle connections).
	ownHTTP bool
	nodes   []*endpoint
	next    atomic.Uint64
}

// endpoint is one node and its health as this client saw it.
type endpoint struct {
	base string // base URL without a trailing slash

	mu        sync.Mutex
	fails     int       // consecutive failures
	downUntil time.Time // set aside until then
}

// New validates opts and returns a Client. It contacts no node.
func New(opts Options) (*Client, error) {
	if len(opts.Nodes) == 0 {
		return nil, errors.New("fairshard client: Options.Nodes is empty; give at least one node URL such as http://127.0.0.1:8080")
	}
	nodes := make([]*endpoint, 0, len(opts.Nodes))
	for _, raw := range opts.Nodes {
		base, err := parseBase(raw)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, &endpoint{base: base})
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	opts.UserAgent = cmp.Or(opts.UserAgent, defaultUserAgent)
	c := &Client{opts: opts, retry: opts.Retry.withDefaults(), http: opts.HTTPClient, nodes: nodes}
	if c.http == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = 64
		c.http = &http.Client{Transport: tr}
		c.ownHTTP = true
	}
	return c, nil
}

func parseBase(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil {
		return "", fmt.Errorf("fairshard client: node URL %q: %w", raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("fairshard client: node URL %q: want an absolute http(s) URL such as http://127.0.0.1:8080", raw)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", fmt.Errorf("fairshard client: node URL %q: must not carry a query, a fragment or credentials", raw)
	}
	return strings.TrimRight(u.Scheme+"://"+u.Host+u.EscapedPath(), "/"), nil
}

// WithNodes returns a Client that calls only the given nodes, sharing this
// one's options and HTTP client (so closing either closes the shared idle
// connections). Use it to ask one node for its own view (namespace counts
// are per node) or to follow a cluster whose members changed.
func (c *Client) WithNodes(nodes ...string) (*Client, error) {
	opts := c.opts
	opts.Nodes = nodes
	opts.HTTPClient = c.http
	n, err := New(opts)
	if err != nil {
		return nil, err
	}
	n.ownHTTP = c.ownHTTP
	return n, nil
}

// Nodes returns the base URLs the client calls, as normalised by New.
func (c *Client) Nodes() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.base
	}
	return out
}

// Close releases the client's idle connections. The client stays usable
// (new calls open new connections). Safe to call more than once.
func (c *Client) Close() {
	if c.ownHTTP {
		c.http.CloseIdleConnections()
	}
}

// pick returns the next node round robin, skipping nodes in cool-down;
// when every node is cooling down, the one whose cool-down ends first.
func (c *Client) pick(now time.Time) *endpoint {
	start := c.next.Add(1) - 1
	var best *endpoint
	var bestUntil time.Time
	for i := range len(c.nodes) {
		n := c.nodes[(start+uint64(i))%uint64(len(c.nodes))]
		n.mu.Lock()
		until := n.downUntil
		n.mu.Unlock()
		if !now.Before(until) {
			return n
		}
		if best == nil || until.Before(bestUntil) {
			best, bestUntil = n, until
		}
	}
	return best
}

func (n *endpoint) failed(now time.Time, retryAfter time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.fails++
	d := min(nodeCooldownBase<<min(n.fails-1, 16), nodeCooldownMax)
	n.downUntil = now.Add(max(d, retryAfter))
}

func (n *endpoint) succeeded() {
	n.mu.Lock()
	n.fails, n.downUntil = 0, time.Time{}
	n.mu.Unlock()
}

// idempotency says when a call may be sent again.
type idempotency int

const (
	// idempotent calls are retried on connection errors, timeouts and
	// retryable statuses.
	idempotent idempotency = iota
	// notIdempotent calls are retried only when the connection was refused
	// (the request cannot have reached a node).
	notIdempotent
)

// call is one API call.
type call struct {
	method string
	path   string // escaped path plus query, from /v1/…
	body   []byte // JSON; nil sends no body
	retry  idempotency
	out    any // decoded from a 2xx JSON answer; nil discards the body
}

// do runs c with retries and failover and decodes the answer into c.out.
func (c *Client) do(ctx context.Context, cl call) error {
	hook, _ := ctx.Value(attemptHookKey{}).(func(Attempt))
	var lastErr error
	for n := 1; ; n++ {
		if err := ctx.Err(); err != nil {
			if lastErr != nil {
				return fmt.Errorf("fairshard: %s %s: %w (after %d attempts; last: %w)", cl.method, cl.path, err, n-1, lastErr)
			}
			return fmt.Errorf("fairshard: %s %s: %w", cl.method, cl.path, err)
		}
		node := c.pick(time.Now())
		start := time.Now()
		status, retryAfter, err := c.attempt(ctx, node, cl)
		lastErr = err
		retry := err != nil && n < c.retry.MaxAttempts && ctx.Err() == nil && retryable(cl.retry, status, err)
		if err == nil {
			node.succeeded()
		} else if status == 0 || retryableStatus(status) {
			if ctx.Err() == nil { // the caller giving up is not the node's fault
				node.failed(time.Now(), c.retryAfterCapped(retryAfter))
			}
		}
		a := Attempt{Method: cl.method, Path: cl.path, Node: node.base, N: n, StatusCode: status, Err: err,
			Duration: time.Since(start), WillRetry: retry}
		if c.opts.OnAttempt != nil {
			c.opts.OnAttempt(a)
		}
		if hook != nil {
			hook(a)
		}
		if err == nil {
			return nil
		}
		if !retry {
			if n > 1 {
				return fmt.Errorf("fairshard: %s %s: gave up after %d attempts: %w", cl.method, cl.path, n, err)
			}
			return err
		}
		wait := max(c.backoff(n), c.retryAfterCapped(retryAfter))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
		case <-t.C:
		}
	}
}

// backoff is the jittered wait before retry number n (after attempt n):
// d = BaseDelay × 2^(n−1) capped at MaxDelay, drawn from [d/2, d).
func (c *Client) backoff(n int) time.Duration {
	d := c.retry.BaseDelay << min(n-1, 30)
	if d <= 0 || d > c.retry.MaxDelay {
		d = c.retry.MaxDelay
	}
	half := d / 2
	return half + rand.N(d-half+1)
}

func (c *Client) retryAfterCapped(d time.Duration) time.Duration {
	if c.retry.MaxRetryAfter < 0 || d <= 0 {
		return 0
	}
	return min(d, c.retry.MaxRetryAfter)
}

// retryable reports whether an attempt's failure may be retried for a call
// of this idempotency.
func retryable(idem idempotency, status int, err error) bool {
	if idem == notIdempotent {
		return status == 0 && connRefused(err)
	}
	if status != 0 {
		return retryableStatus(status)
	}
	var ae *Error
	var de *decodeError
	return !errors.As(err, &ae) && !errors.As(err, &de)
}

// connRefused reports whether err is a failure to connect: the request was
// never sent.
func connRefused(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// decodeError is a 2xx answer whose body is not the JSON the call expects;
// it is not retried (the node answered, wrongly).
type decodeError struct{ err error }

func (e *decodeError) Error() string { return "decode answer: " + e.err.Error() }
func (e *decodeError) Unwrap() error { return e.err }

// attempt sends one request to node. It returns the HTTP status (0 when
// none was received), the answer's Retry-After (0 when absent or unusable)
// and the error: nil for a 2xx answer decoded into cl.out.
func (c *Client) attempt(ctx context.Context, node *endpoint, cl call) (int, time.Duration, error) {
	actx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	defer cancel()
	var body io.Reader
	if cl.body != nil {
		body = bytes.NewReader(cl.body)
	}
	req, err := http.NewRequestWithContext(actx, cl.method, node.base+cl.path, body)
	if err != nil {
		return 0, 0, fmt.Errorf("fairshard: %s %s: %w", cl.method, cl.path, err)
	}
	// Every write carries application/json, body or not: the node
	// refuses a POST, PUT or PATCH without it (415).
	if cl.body != nil || (cl.method != http.MethodGet && cl.method != http.MethodHead) {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	req.Header.Set("User-Agent", c.opts.UserAgent)
	if c.opts.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.Token)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, 0, fmt.Errorf("fairshard: %s %s on %s: %w", cl.method, cl.path, node.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		data, rerr := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		e := &Error{StatusCode: resp.StatusCode, Method: cl.method, Path: cl.path, Node: node.base}
		var env struct {
			Error *struct {
				Code    string `json:"code"`
				Field   string `json:"field"`
				Message string `json:"message"`
			} `json:"error"`
		}
		if json.Unmarshal(data, &env) == nil && env.Error != nil {
			e.Code, e.Field, e.Message = env.Error.Code, env.Error.Field, env.Error.Message
		} else {
			e.Message = strings.TrimSpace(string(data[:min(len(data), 300)]))
			if rerr != nil && e.Message == "" {
				e.Message = rerr.Error()
			}
		}
		return resp.StatusCode, parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()), e
	}
	if cl.out == nil {
		_, err := io.Copy(io.Discard, resp.Body)
		if err != nil {
			return 0, 0, fmt.Errorf("fairshard: %s %s on %s: read answer: %w", cl.method, cl.path, node.base, err)
		}
		return resp.StatusCode, 0, nil
	}
	if err := json.NewDecoder(resp.Body).Decode(cl.out); err != nil {
		var se *json.SyntaxError
		var te *json.UnmarshalTypeError
		if errors.As(err, &se) || errors.As(err, &te) {
			return resp.StatusCode, 0, fmt.Errorf("fairshard: %s %s on %s: %w", cl.method, cl.path, node.base, &decodeError{err})
		}
		// The body was cut off (connection reset, timeout): no answer was
		// received, as far as retries go.
		return 0, 0, fmt.Errorf("fairshard: %s %s on %s: read answer: %w", cl.method, cl.path, node.base, err)
	}
	return resp.StatusCode, 0, nil
}

// maxRetryAfterSeconds bounds a parsed Retry-After (about 68 years) so the
// Duration cannot overflow; RetryConfig.MaxRetryAfter caps it far lower.
const maxRetryAfterSeconds = 1 << 31

// parseRetryAfter reads a Retry-After value (RFC 9110 §10.2.3):
// delta-seconds or an HTTP date. Zero, negative, fractional, past or
// unparsable values give 0 (no lengthening); huge ones are clamped.
func parseRetryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if v[0] >= '0' && v[0] <= '9' {
		secs, err := strconv.ParseUint(v, 10, 64)
		var ne *strconv.NumError
		if errors.As(err, &ne) && ne.Err == strconv.ErrRange {
			secs, err = maxRetryAfterSeconds, nil // huge: as long as allowed
		}
		if err != nil {
			return 0
		}
		return time.Duration(min(secs, maxRetryAfterSeconds)) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil || !t.After(now) {
		return 0
	}
	return t.Sub(now)
}

// marshal encodes v as a call body.
func marshal(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("fairshard: encode request: %w", err)
	}
	return b, nil
}
