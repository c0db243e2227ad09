package settings

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"
)

// Bounds of the runtime settings. The admin API refuses values outside
// them (httpapi, with the field named); the settings check them again on
// every value read from the gossiped config, which other nodes write
// (internal input is checked like public input): a value outside them (from
// a node of another version, or forged by a holder of the gossip key) is
// ignored as if absent, and the node's defaults apply.
const (
	// MaxQuota is the largest max_in_flight (rows).
	MaxQuota = 1_000_000
	// MaxTargetTimeout is the largest target timeout.
	MaxTargetTimeout = 10 * time.Minute
	// MaxTargetURLBytes keeps a target within the gossiped config's 1 KiB
	// value limit, JSON envelope included.
	MaxTargetURLBytes = 900
	// MaxRetryBase, MaxRetryCap, MaxRetryFactor and MaxRetryAttempts bound
	// a namespace's retry override.
	MaxRetryBase     = time.Hour
	MaxRetryCap      = 24 * time.Hour
	MaxRetryFactor   = 10
	MaxRetryAttempts = 1000
)

// validator is a decoded value that checks its own bounds.
type validator interface{ Validate() error }

// Validate checks a retry override's bounds (zero fields mean the node's
// default); the error names the field.
func (r RetrySettings) Validate() error {
	switch {
	case r.BaseMS < 0 || r.BaseMS > MaxRetryBase.Milliseconds():
		return fmt.Errorf("retry.base_ms %d is outside [0, %d]", r.BaseMS, MaxRetryBase.Milliseconds())
	case r.Factor != 0 && (r.Factor < 1 || r.Factor > MaxRetryFactor):
		return fmt.Errorf("retry.factor %v is not 0 or within [1, %d]", r.Factor, MaxRetryFactor)
	case r.CapMS < 0 || r.CapMS > MaxRetryCap.Milliseconds():
		return fmt.Errorf("retry.cap_ms %d is outside [0, %d]", r.CapMS, MaxRetryCap.Milliseconds())
	case r.CapMS > 0 && r.BaseMS > r.CapMS:
		return errors.New("retry.cap_ms is below retry.base_ms")
	case r.MaxAttempts > MaxRetryAttempts:
		return fmt.Errorf("retry.max_attempts %d exceeds %d", r.MaxAttempts, MaxRetryAttempts)
	}
	return nil
}

// Validate checks a target: an absolute http(s) URL template of at most
// MaxTargetURLBytes without control characters, and a timeout within
// [0, MaxTargetTimeout]; the error names the field.
func (t TargetSettings) Validate() error {
	if t.URL == "" || len(t.URL) > MaxTargetURLBytes {
		return fmt.Errorf("url is %d bytes, want 1 to %d", len(t.URL), MaxTargetURLBytes)
	}
	for _, c := range t.URL {
		if c < 0x20 || c == 0x7f {
			return errors.New("url contains a control character")
		}
	}
	u, err := url.Parse(strings.NewReplacer("{namespace}", "ns", "{task_queue}", "tq").Replace(t.URL))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("url is not an absolute http(s) URL")
	}
	if t.TimeoutMS < 0 || DurationMS(t.TimeoutMS) > MaxTargetTimeout {
		return fmt.Errorf("timeout_ms %d is outside [0, %d]", t.TimeoutMS, MaxTargetTimeout.Milliseconds())
	}
	return nil
}
