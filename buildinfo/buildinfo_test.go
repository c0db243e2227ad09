package buildinfo

import (
	"runtime"
	"strings"
	"testing"
)

func TestRead(t *testing.T) {
	// A test binary carries no VCS stamp: the link-time revision stands.
	i := Read("1.2.3", "abc123")
	if i.Version != "1.2.3" || i.Revision != "abc123" || i.GoVersion != runtime.Version() || i.Module == "" {
		t.Fatalf("Read = %+v, want the version and revision given, this Go and a module path", i)
	}
}

func TestString(t *testing.T) {
	cases := map[string]Info{
		"fairshard 1.0 (module m v1.0.0, revision abc+dirty at 2026-12-01T00:00:00Z, go1.26.8)": {Version: "1.0", Module: "m", ModuleVersion: "v1.0.0", Revision: "abc", Time: "2026-12-01T00:00:00Z", Modified: true, GoVersion: "go1.26.8"},
		"fairshard dev (module unknown unknown, revision unknown, unknown Go)":                  {},
	}
	for want, i := range cases {
		if got := i.String(); got != want {
			t.Errorf("String() = %q, want %q", got, want)
		}
	}
	if s := Read("x", "").String(); !strings.HasPrefix(s, "fairshard x (module ") {
		t.Errorf("Read(x).String() = %q", s)
	}
}
