package dispatch

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/backpressure"
	"github.com/fairshard/fairshard/egress"
)

// Defaults of the Config tunables. A zero field in Config means "use the
// default"; the field docs repeat each value.
const (
	// DefaultPollInterval is the fallback sweep period when nothing wakes
	// the dispatcher (DESIGN "short interval").
	DefaultPollInterval = 20 * time.Millisecond
	// DefaultWakeDebounce is the shortest gap between the end of one sweep
	// and the start of a sweep triggered by Wake. It merges a burst of
	// appends and settles into one sweep.
	DefaultWakeDebounce = 2 * time.Millisecond
	// DefaultRefillDebounce is the shortest gap between the end of one
	// sweep and a sweep triggered only by answers freeing host slots: one
	// sweep refills the slots of many answers.
	DefaultRefillDebounce = 5 * time.Millisecond
	// DefaultBatchSize is the most rows (all namespaces together) one sweep
	// claims.
	DefaultBatchSize = 256
	// DefaultMaxInFlight is the most rows this process delivers at once,
	// all namespaces together; a sweep claims at most the difference.
	DefaultMaxInFlight = 4096
	// DefaultDeliveryTimeout bounds one HTTP delivery attempt.
	DefaultDeliveryTimeout = 10 * time.Second
	// DefaultVisibilitySlack is added to DeliveryTimeout to get the default
	// VisibilityTimeout.
	DefaultVisibilitySlack = 30 * time.Second
	// DefaultRearmInterval is how often the reaper looks for stale claims.
	DefaultRearmInterval = time.Second
	// DefaultSettleTimeout bounds one settle (Complete, Retry or Fail) call
	// to the store.
	DefaultSettleTimeout = 5 * time.Second
	// DefaultMaxConnsPerHost is the upper bound of a target host's
	// adaptive concurrency limit (rows in flight to one scheme://host:port
	// from this node). A fast host needs about rows/s × (answer time + the
	// wait for the next sweep) slots, since a freed slot is filled by the
	// next sweep; 512, twice the default batch, lets a sweep claim a full
	// batch for one host while the previous batch is still in flight
	// (docs/BENCHMARKS.md). The limit only gets there while the host keeps
	// up.
	DefaultMaxConnsPerHost = 512
	// DefaultLastErrorMax bounds a row's last_error (bytes).
	DefaultLastErrorMax = 512
	// DefaultBodyExcerptMax bounds the excerpt of a target's non-2xx
	// answer kept in last_error (bytes): enough for a status line's
	// reason, too short to carry what an internal service would leak
	// through the dead-letters API.
	DefaultBodyExcerptMax = 64

	// DefaultRetryBase is the first retry's backoff.
	DefaultRetryBase = 500 * time.Millisecond
	// DefaultRetryFactor multiplies the backoff per attempt.
	DefaultRetryFactor = 2.0
	// DefaultRetryCap is the largest backoff, and the largest wait a
	// Retry-After can ask for.
	DefaultRetryCap = 5 * time.Minute
	// DefaultMaxAttempts is how many delivery attempts a row gets before it
	// is failed (dead letter).
	DefaultMaxAttempts = 10
	// DefaultRetryJitter is the backoff's jitter fraction: ±20 %.
	DefaultRetryJitter = 0.2
)

// RetryPolicy shapes the backoff of retryable delivery failures and when a
// row gives up. The backoff before attempt n+1, after attempt n failed, is
//
//	d = min(Cap, Base × Factor^(n−1))
//
// then jittered: drawn uniformly from [d×(1−Jitter), d×(1+Jitter)] and
// capped at Cap again (and at least 1 ms: a retry is never immediate). A
// target may only lengthen that wait: a 429 or 503 answer's Retry-After
// (delta-seconds or an HTTP date) makes it max(backoff, Retry-After),
// capped at Cap; a zero, negative, past, fractional or unparsable
// Retry-After is ignored. A retryable failure of attempt n ≥ MaxAttempts
// fails the row instead (dead letter).
//
// A zero field means "use the default" (for Config.Retry: the package
// defaults; for a per-namespace override: the node's Config.Retry).
type RetryPolicy struct {
	// Base is the first backoff (after attempt 1). Defaults to 500 ms.
	Base time.Duration
	// Factor multiplies the backoff per attempt; ≥ 1. Defaults to 2.
	Factor float64
	// Cap is the largest backoff, Retry-After included; ≥ Base. Defaults
	// to 5 min.
	Cap time.Duration
	// MaxAttempts is the number of delivery attempts a row gets, counting
	// the first; ≥ 1. Defaults to 10.
	MaxAttempts uint32
	// Jitter is the fraction in (0, 1] by which a backoff is spread either
	// way (0.2 = ±20 %; 1 = "full jitter" over [0, 2d]). Defaults to 0.2; a
	// negative value disables jitter.
	Jitter float64
}

// DefaultRetryPolicy returns the package's default retry policy: 500 ms ×2
// up to 5 min, ±20 % jitter, 10 attempts.
func DefaultRetryPolicy() RetryPolicy {
	return RetryPolicy{
		Base:        DefaultRetryBase,
		Factor:      DefaultRetryFactor,
		Cap:         DefaultRetryCap,
		MaxAttempts: DefaultMaxAttempts,
		Jitter:      DefaultRetryJitter,
	}
}

// withDefaults fills zero fields from base.
func (p RetryPolicy) withDefaults(base RetryPolicy) RetryPolicy {
	p.Base = cmp.Or(p.Base, base.Base)
	p.Factor = cmp.Or(p.Factor, base.Factor)
	p.Cap = cmp.Or(p.Cap, base.Cap)
	p.MaxAttempts = cmp.Or(p.MaxAttempts, base.MaxAttempts)
	p.Jitter = cmp.Or(p.Jitter, base.Jitter)
	return p
}

// validate checks a filled policy and reports every bad field (joined).
// name maps a field ("Base", "Factor", "Cap", "MaxAttempts", "Jitter") to
// the name an error gives it (a flag for the node's policy, a prefixed
// field for an override).
func (p RetryPolicy) validate(name func(field string) string) error {
	var errs []error
	if p.Base <= 0 {
		errs = append(errs, invalid(name("Base"), "must be positive, got %v", p.Base))
	}
	if p.Factor < 1 {
		errs = append(errs, invalid(name("Factor"), "must be at least 1, got %v", p.Factor))
	}
	if p.Cap < p.Base {
		errs = append(errs, invalid(name("Cap"), "%v must be at least %s %v", p.Cap, name("Base"), p.Base))
	}
	if p.MaxAttempts < 1 {
		errs = append(errs, invalid(name("MaxAttempts"), "must be at least 1, got %d", p.MaxAttempts))
	}
	if p.Jitter > 1 {
		errs = append(errs, invalid(name("Jitter"), "must be at most 1 (a fraction), got %v", p.Jitter))
	}
	return errors.Join(errs...)
}

// Config wires a Dispatcher: its dependencies, hooks and tunables. Store,
// Planner and Targets are required; every other field is optional. A zero
// tunable means "use the default" (the field doc names it); New fills the
// defaults, then validates (Tunables.Validate), naming every bad field.
//
// Clock: Now must be the same clock as the Planner's (the planner stamps
// ClaimedAt with it, the reaper compares ClaimedAt with it).
type Config struct {
	// Store is the node's outbox store (required). The dispatcher claims
	// through Planner over this store, settles rows on it and re-arms
	// stale claims with RearmStale.
	Store Store
	// Claiming, when set, is called before each sweep reads its ceilings;
	// the sweep calls the returned done once its claims are committed
	// (lease.Service.Claiming: grants change only between sweeps).
	Claiming func() (done func())
	// AfterSweep, when set, is called with every sweep's outcome once it
	// has been reported (the node's lease service asks for capacity for a
	// namespace new here).
	AfterSweep func(backpressure.Sweep)
	// Fence, when set, fences the node's actions across a pause of the
	// process (a GC pause, a VM freeze, SIGSTOP: internal/pause.Watch):
	// no sweep claims while it does not allow its current generation, and
	// a claimed row's request is not sent unless the generation its sweep
	// started in is still allowed when the request gets its connection;
	// such a row goes back to pending unattempted (the shard may have
	// another primary by now, which delivers it). nil: no fence.
	Fence Fence
	// Writable, when set, says why the store cannot commit now (a failed
	// commit or fsync, until the store has reopened its file; nil: it
	// can). Meanwhile no sweep runs: its claims could only fail.
	Writable func() error
	// Planner plans and performs each sweep's fair claim (required);
	// *backpressure.Planner satisfies it. Do not give the same planner to a
	// second sweeping dispatcher (two concurrent sweeps can together exceed
	// a ceiling).
	Planner Planner
	// Targets resolves a route's delivery target (required). A route with
	// no target is left out of sweeps: its rows wait, they are not failed.
	Targets Targets

	// Held returns the workflow ids whose rows must stay pending (held
	// workflows). It is called once per sweep; the returned map must not be
	// modified afterwards. nil holds nothing.
	Held func() map[string]struct{}
	// Paused reports whether a namespace is paused: its routes are left out
	// of sweeps. nil pauses nothing.
	Paused func(namespace string) bool
	// RetryPolicyFor returns a per-namespace retry policy override; zero
	// fields of the override are taken from Retry. ok = false (or a nil
	// hook) uses Retry. An override that fails validation is logged and
	// Retry is used instead.
	RetryPolicyFor func(namespace string) (policy RetryPolicy, ok bool)
	// Now is the clock for row instants (claim, visible_after, finished_at,
	// the reaper's cut-offs). Defaults to time.Now. Loop timing (poll,
	// debounce, HTTP timeouts) always uses the real clock.
	Now func() time.Time
	// Logger receives structured logs; nil discards.
	Logger *slog.Logger
	// Registerer receives the dispatcher's metrics (see metrics.go); nil
	// keeps them unregistered.
	Registerer prometheus.Registerer
	// Transport sends the deliveries. nil builds one shared *http.Transport
	// (newTransport) reused across rows, honouring the
	// HTTP_PROXY/HTTPS_PROXY/NO_PROXY environment, its idle connections
	// closed when Run returns. An injected Transport is used as is and
	// never closed by the dispatcher; it must not queue requests for a
	// connection (a claimed row would wait inside the delivery timeout).
	Transport http.RoundTripper
	// Hosts is the per-target-host concurrency limits. Give the same
	// HostLimits to the planner (backpressure.PlannerConfig.Hosts) so it
	// claims only rows a host has slots for. nil builds one from Targets,
	// MaxConnsPerHost and InitialConnsPerHost (see Dispatcher.Hosts);
	// its limits are then measured and exported but a planner built
	// without them does not claim by them.
	Hosts *HostLimits

	// Tunables are the sweep, delivery and retry settings (their own
	// type so node configuration embeds them with their flags).
	Tunables

	// Egress is the targets' egress policy, enforced at dial time by the
	// transport New builds (ignored when Transport is set). nil is the
	// default policy: link-local and metadata addresses refused (package
	// egress).
	Egress *egress.Policy
	// NamespaceLabel maps a namespace to its metrics label value, so a
	// flood of namespaces cannot explode the series (nslabel.Limiter.Label).
	// nil: the namespace itself.
	NamespaceLabel func(namespace string) string
}

// Tunables are the dispatcher's settings: sweep pacing, batch and in-flight
// bounds, delivery timeouts, host limits and the retry policy. A zero field
// means "use the default" (the field doc names it); RegisterFlags exposes
// the operator-facing ones as the node's flags.
type Tunables struct {
	// PollInterval is the fallback sweep period (jittered by ±10 %) when
	// nothing wakes the dispatcher. Defaults to 20 ms.
	PollInterval time.Duration
	// WakeDebounce is the shortest gap between the end of a sweep and a
	// sweep triggered by Wake. Defaults to 2 ms; must be < PollInterval.
	WakeDebounce time.Duration
	// RefillDebounce is the shortest gap between the end of a sweep and a
	// sweep triggered only by answers freeing host slots the last sweep was
	// short of (a settle freeing namespace headroom wakes the loop like
	// Wake); the gap is also at least the last sweep's duration (a Wake meanwhile still sweeps after
	// WakeDebounce). Defaults to 5 ms (at most PollInterval/2, at
	// least WakeDebounce); must be in [WakeDebounce, PollInterval).
	RefillDebounce time.Duration
	// BatchSize is the most rows one sweep claims, all namespaces together.
	// Defaults to 256.
	BatchSize int
	// MaxInFlight is the most rows this process delivers at once; a sweep
	// claims at most MaxInFlight − in flight. Defaults to 4096.
	MaxInFlight int
	// DeliveryTimeout bounds one delivery attempt from the moment the
	// request is on the wire (it has a connection) to the response headers
	// and body excerpt. Getting the connection (DNS, TCP, TLS) is bounded
	// by the same duration, separately, so an attempt lasts at most twice
	// it. A Target's own Timeout may shorten it, never lengthen it.
	// Defaults to 10 s.
	DeliveryTimeout time.Duration
	// VisibilityTimeout is how long a claim may stay unsettled before the
	// reaper re-arms it to pending. Must be > DeliveryTimeout (river's rule
	// "RescueStuckJobsAfter cannot be less than JobTimeout"). Defaults to
	// DeliveryTimeout + 30 s.
	VisibilityTimeout time.Duration
	// RearmInterval is how often the reaper runs. Defaults to 1 s.
	RearmInterval time.Duration
	// SettleTimeout bounds one settle call to the store (Complete, Retry,
	// Fail). Settles are not cancelled by a hard stop, so a delivery that
	// finished is still recorded. Defaults to 5 s.
	SettleTimeout time.Duration
	// Retry is the node's retry policy. Zero fields default as documented
	// on RetryPolicy (500 ms ×2, cap 5 min, 10 attempts, ±20 % jitter).
	Retry RetryPolicy
	// MaxConnsPerHost is the upper bound of each target host's adaptive
	// concurrency limit (rows in flight from this node to one
	// scheme://host:port; see HostLimits). A namespace below its fair
	// share of a full host may still send, so a host can briefly see up
	// to twice its limit; the built Transport allows 2 × MaxConnsPerHost
	// connections per host so no request ever queues for one. Defaults to
	// 512.
	MaxConnsPerHost int
	// InitialConnsPerHost is a new host's limit before it has answered,
	// in [1, MaxConnsPerHost]. Defaults to min(20, MaxConnsPerHost).
	InitialConnsPerHost int
	// LastErrorMax bounds a row's last_error (bytes). Defaults to 512.
	LastErrorMax int
	// BodyExcerptMax bounds the excerpt of a non-2xx answer's body kept in
	// last_error (bytes, cut on a rune boundary, control characters
	// blanked). Defaults to DefaultBodyExcerptMax; negative keeps none.
	BodyExcerptMax int
}

// DefaultTunables returns every tunable at its default, the derived ones
// (VisibilityTimeout, RefillDebounce, InitialConnsPerHost) from the others.
func DefaultTunables() Tunables {
	var t Tunables
	t.fillDefaults()
	return t
}

// fillDefaults replaces zero tunables by their defaults; the derived ones
// follow the fields they derive from.
func (t *Tunables) fillDefaults() {
	t.PollInterval = cmp.Or(t.PollInterval, DefaultPollInterval)
	t.WakeDebounce = cmp.Or(t.WakeDebounce, DefaultWakeDebounce)
	t.RefillDebounce = cmp.Or(t.RefillDebounce, max(min(DefaultRefillDebounce, t.PollInterval/2), t.WakeDebounce))
	t.DeliveryTimeout = cmp.Or(t.DeliveryTimeout, DefaultDeliveryTimeout)
	t.VisibilityTimeout = cmp.Or(t.VisibilityTimeout, t.DeliveryTimeout+DefaultVisibilitySlack)
	t.RearmInterval = cmp.Or(t.RearmInterval, DefaultRearmInterval)
	t.SettleTimeout = cmp.Or(t.SettleTimeout, DefaultSettleTimeout)
	t.BatchSize = cmp.Or(t.BatchSize, DefaultBatchSize)
	t.MaxInFlight = cmp.Or(t.MaxInFlight, DefaultMaxInFlight)
	t.MaxConnsPerHost = cmp.Or(t.MaxConnsPerHost, DefaultMaxConnsPerHost)
	t.InitialConnsPerHost = cmp.Or(t.InitialConnsPerHost, min(DefaultInitialConnsPerHost, t.MaxConnsPerHost))
	t.LastErrorMax = cmp.Or(t.LastErrorMax, DefaultLastErrorMax)
	t.BodyExcerptMax = cmp.Or(t.BodyExcerptMax, DefaultBodyExcerptMax)
	t.Retry = t.Retry.withDefaults(DefaultRetryPolicy())
}

// Validate fills the zero tunables with their defaults, then checks every
// field. The errors (joined, each wrapping ErrInvalidConfig) name a field
// by its flag where it has one ("--poll-interval: must be positive, got
// -1ms"), else by its name ("MaxInFlight: ..."): the flags first, in the
// order RegisterFlags registers them (Retry.Jitter with the retry flags).
// The filled defaults stay in t, the derived ones too (VisibilityTimeout,
// RefillDebounce, InitialConnsPerHost): a second call checks the same
// values, so change a field a derived one follows before the first call.
// dispatch.New calls it; the node calls it at start-up on the values its
// flags gave.
func (t *Tunables) Validate() error {
	t.fillDefaults()
	var errs []error
	check := func(ok bool, name, format string, args ...any) {
		if !ok {
			errs = append(errs, invalid(name, format, args...))
		}
	}
	check(t.PollInterval > 0, "--poll-interval", "must be positive, got %v", t.PollInterval)
	check(t.BatchSize >= 1, "--batch-size", "must be at least 1 row, got %d", t.BatchSize)
	check(t.DeliveryTimeout > 0, "--delivery-timeout", "must be positive, got %v", t.DeliveryTimeout)
	check(t.VisibilityTimeout > t.DeliveryTimeout, "--visibility-timeout",
		"%v must exceed --delivery-timeout %v, or live deliveries get re-armed", t.VisibilityTimeout, t.DeliveryTimeout)
	if err := t.Retry.validate(retryFlag); err != nil {
		errs = append(errs, err)
	}
	check(t.MaxConnsPerHost >= 1, "--max-conns-per-host", "must be at least 1, got %d", t.MaxConnsPerHost)
	for _, p := range []struct {
		name string
		d    time.Duration
	}{{"WakeDebounce", t.WakeDebounce}, {"RefillDebounce", t.RefillDebounce}, {"RearmInterval", t.RearmInterval}, {"SettleTimeout", t.SettleTimeout}} {
		check(p.d > 0, p.name, "must be positive, got %v", p.d)
	}
	if t.PollInterval > 0 { // else reported above
		check(t.WakeDebounce < t.PollInterval, "--poll-interval", "%v must exceed WakeDebounce %v", t.PollInterval, t.WakeDebounce)
		if t.WakeDebounce < t.PollInterval { // else RefillDebounce, derived from both, is out of range too
			check(t.RefillDebounce >= t.WakeDebounce && t.RefillDebounce < t.PollInterval, "RefillDebounce",
				"%v must be in [WakeDebounce %v, --poll-interval %v)", t.RefillDebounce, t.WakeDebounce, t.PollInterval)
		}
	}
	check(t.MaxInFlight >= 1, "MaxInFlight", "must be at least 1 row, got %d", t.MaxInFlight)
	if t.MaxConnsPerHost >= 1 {
		check(t.InitialConnsPerHost >= 1 && t.InitialConnsPerHost <= t.MaxConnsPerHost, "InitialConnsPerHost",
			"must be in [1, --max-conns-per-host %d], got %d", t.MaxConnsPerHost, t.InitialConnsPerHost)
	}
	check(t.LastErrorMax >= 16, "LastErrorMax", "must be at least 16 bytes, got %d", t.LastErrorMax)
	return errors.Join(errs...)
}

// retryFlag names the node retry policy's fields by their flags.
func retryFlag(field string) string {
	switch field {
	case "Base":
		return "--retry-base"
	case "Factor":
		return "--retry-factor"
	case "Cap":
		return "--retry-cap"
	case "MaxAttempts":
		return "--max-attempts"
	}
	return "Retry." + field
}

// RegisterFlags registers the operator-facing tunables on fs as the node's
// flags (their names, defaults and help are the node's), writing into t.
// It first replaces all of t by DefaultTunables, then leaves the derived
// tunables at 0 (VisibilityTimeout, RefillDebounce, InitialConnsPerHost)
// for Validate to derive from the values the flags give.
func (t *Tunables) RegisterFlags(fs *flag.FlagSet) {
	*t = DefaultTunables()
	// The derived tunables stay 0: Validate derives them from the values
	// the flags give.
	t.VisibilityTimeout, t.RefillDebounce, t.InitialConnsPerHost = 0, 0, 0
	fs.DurationVar(&t.PollInterval, "poll-interval", t.PollInterval, "dispatcher sweep interval")
	fs.IntVar(&t.BatchSize, "batch-size", t.BatchSize, "most rows claimed per sweep")
	fs.DurationVar(&t.DeliveryTimeout, "delivery-timeout", t.DeliveryTimeout, "timeout of one delivery attempt")
	fs.DurationVar(&t.VisibilityTimeout, "visibility-timeout", 0, "claim lease before the reaper re-arms a row (default: delivery timeout + 30s)")
	fs.DurationVar(&t.Retry.Base, "retry-base", t.Retry.Base, "first retry backoff")
	fs.Float64Var(&t.Retry.Factor, "retry-factor", t.Retry.Factor, "backoff multiplier per attempt")
	fs.DurationVar(&t.Retry.Cap, "retry-cap", t.Retry.Cap, "largest retry backoff")
	fs.Var((*attemptsFlag)(&t.Retry.MaxAttempts), "max-attempts", "delivery `attempts` before a row is dead-lettered")
	fs.IntVar(&t.MaxConnsPerHost, "max-conns-per-host", t.MaxConnsPerHost, "upper bound of each target host's adaptive concurrency limit (rows this node delivers at once to one scheme://host:port)")
}

// attemptsFlag is a uint32 flag.Value (flag has none of that width).
type attemptsFlag uint32

func (a *attemptsFlag) String() string { return strconv.FormatUint(uint64(*a), 10) }

func (a *attemptsFlag) Set(s string) error {
	n, err := strconv.ParseUint(s, 0, 32)
	if err != nil {
		return errors.New("not a count of attempts (0 to 4294967295)")
	}
	*a = attemptsFlag(n)
	return nil
}

// fieldError is one bad configuration field: its name (a flag, or a field
// where there is no flag) and what is wrong. It matches ErrInvalidConfig.
type fieldError struct{ name, msg string }

func (e *fieldError) Error() string { return e.name + ": " + e.msg }

// Is makes errors.Is(err, ErrInvalidConfig) hold.
func (e *fieldError) Is(target error) bool { return target == ErrInvalidConfig }

// invalid returns the fieldError of name.
func invalid(name, format string, args ...any) error {
	return &fieldError{name: name, msg: fmt.Sprintf(format, args...)}
}

// fillDefaults replaces zero tunables and unset hooks by their defaults.
func (c *Config) fillDefaults() {
	c.Tunables.fillDefaults()
	if c.NamespaceLabel == nil {
		c.NamespaceLabel = func(ns string) string { return ns }
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// validate fills the defaults and checks the Config: the required
// dependencies, then the tunables (Tunables.Validate).
func (c *Config) validate() error {
	c.fillDefaults()
	switch {
	case c.Store == nil:
		return fmt.Errorf("%w: Config.Store is required", ErrInvalidConfig)
	case c.Planner == nil:
		return fmt.Errorf("%w: Config.Planner is required", ErrInvalidConfig)
	case c.Targets == nil:
		return fmt.Errorf("%w: Config.Targets is required", ErrInvalidConfig)
	}
	return c.Tunables.Validate()
}
