package main

import (
	"context"
	"io"
	"log/slog"
	"slices"

	"github.com/fairshard/fairshard/node"
)

// newLogger builds the process logger from --log-level and --log-format
// (text or json). Durations are written as strings ("1.5s"; slog's JSON
// handler would write nanoseconds), and a key is written once per object:
// when a key repeats (a logger's With and a call both set "node", say), the
// last value wins, in the first one's place.
func newLogger(cfg node.Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: lvl, ReplaceAttr: durationAsString}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(&dedupHandler{inner: h, frames: []logFrame{{}}})
}

func durationAsString(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		return slog.String(a.Key, a.Value.Duration().String())
	}
	return a
}

// builtinKeys are the keys slog's handlers write themselves at the top
// level; an attribute with one of these names is renamed "attr_<key>".
var builtinKeys = []string{slog.TimeKey, slog.LevelKey, slog.MessageKey, slog.SourceKey}

// dedupHandler removes repeated keys before the inner handler (which is
// given no attributes or groups of its own) writes a record. It keeps the
// attributes of With and the groups of WithGroup itself and merges them
// with each record's. Immutable once built; safe for concurrent use when
// the inner handler is.
type dedupHandler struct {
	inner slog.Handler
	// frames[0] holds top-level attributes, frames[i] (i > 0) those added
	// inside the i-th open group.
	frames []logFrame
}

type logFrame struct {
	group string
	attrs []slog.Attr
}

func (h *dedupHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.inner.Enabled(ctx, l)
}

func (h *dedupHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	frames := slices.Clone(h.frames)
	last := &frames[len(frames)-1]
	last.attrs = append(slices.Clip(last.attrs), attrs...)
	return &dedupHandler{inner: h.inner, frames: frames}
}

func (h *dedupHandler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return &dedupHandler{inner: h.inner, frames: append(slices.Clip(h.frames), logFrame{group: name})}
}

func (h *dedupHandler) Handle(ctx context.Context, r slog.Record) error {
	// Innermost group first: its attributes, then the record's.
	cur := slices.Clone(h.frames[len(h.frames)-1].attrs)
	r.Attrs(func(a slog.Attr) bool {
		cur = append(cur, a)
		return true
	})
	for i := len(h.frames) - 1; i > 0; i-- {
		outer := slices.Clone(h.frames[i-1].attrs)
		cur = append(outer, slog.Attr{Key: h.frames[i].group, Value: slog.GroupValue(cur...)})
	}
	cur = dedup(cur)
	for i, a := range cur {
		if slices.Contains(builtinKeys, a.Key) {
			cur[i].Key = "attr_" + a.Key
		}
	}
	out := slog.NewRecord(r.Time, r.Level, r.Message, r.PC)
	out.AddAttrs(dedup(cur)...) // again: a renamed key may meet an "attr_…" one
	return h.inner.Handle(ctx, out)
}

// dedup returns attrs with inline groups (empty key) flattened, empty
// attributes dropped, and each key once: a repeated key takes the last
// value in the first one's place; two groups of one key are merged.
func dedup(attrs []slog.Attr) []slog.Attr {
	var flat []slog.Attr
	for _, a := range attrs {
		a.Value = a.Value.Resolve()
		switch {
		case a.Key == "" && a.Value.Kind() == slog.KindGroup:
			flat = append(flat, dedup(a.Value.Group())...)
		case a.Key == "":
			// slog ignores an attribute without a key.
		default:
			flat = append(flat, a)
		}
	}
	out := make([]slog.Attr, 0, len(flat))
	at := map[string]int{}
	for _, a := range flat {
		i, seen := at[a.Key]
		switch {
		case !seen:
			at[a.Key] = len(out)
			out = append(out, a)
		case a.Value.Kind() == slog.KindGroup && out[i].Value.Kind() == slog.KindGroup:
			merged := append(slices.Clone(out[i].Value.Group()), a.Value.Group()...)
			out[i].Value = slog.GroupValue(dedup(merged)...)
		default:
			out[i] = a
		}
	}
	for i, a := range out {
		if a.Value.Kind() == slog.KindGroup {
			out[i].Value = slog.GroupValue(dedup(a.Value.Group())...)
		}
	}
	return out
}
