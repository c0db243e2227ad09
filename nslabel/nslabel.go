// Package nslabel bounds the namespace label of metrics: a flood of
// namespaces (tenants create them by appending) must not mean a flood of
// series. A Limiter gives the first N distinct namespaces it is asked about
// their own label value, for the life of the process; every later one is
// reported under Other. Every namespace-labelled metric of a node uses the
// same Limiter, so a namespace has its own series in all of them or in
// none.
package nslabel

import "sync"

// Other is the label value shared by namespaces past the bound (a
// namespace literally named "_other" is reported under it too).
const Other = "_other"

// Limiter maps namespaces to label values. Safe for concurrent use; the
// zero value is unusable, use New.
type Limiter struct {
	max int
	mu  sync.RWMutex
	own map[string]struct{}
}

// New returns a Limiter giving at most max namespaces their own label (0:
// none, every namespace is Other).
func New(max int) *Limiter {
	return &Limiter{max: max, own: make(map[string]struct{}, min(max, 1024))}
}

// Label returns ns while ns is among the first max namespaces seen, else
// Other. A nil Limiter returns ns (unbounded).
func (l *Limiter) Label(ns string) string {
	if l == nil {
		return ns
	}
	l.mu.RLock()
	_, ok := l.own[ns]
	l.mu.RUnlock()
	if ok {
		return ns
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.own[ns]; ok {
		return ns
	}
	if len(l.own) < l.max && ns != Other {
		l.own[ns] = struct{}{}
		return ns
	}
	return Other
}

// Len is the number of namespaces with their own label.
func (l *Limiter) Len() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return len(l.own)
}
