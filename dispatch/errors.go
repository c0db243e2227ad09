package dispatch

import "errors"

// Sentinel errors of this package; callers test them with errors.Is.
var (
	// ErrInvalidConfig is returned (wrapped, naming the field and its
	// bound) by New when the Config is incomplete or out of bounds.
	ErrInvalidConfig = errors.New("dispatch: invalid config")
	// ErrStopped is returned by Run when Run was called before: a
	// Dispatcher runs once.
	ErrStopped = errors.New("dispatch: dispatcher stopped")
)
