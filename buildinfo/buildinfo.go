// Package buildinfo reads what the Go toolchain recorded in the binary
// (runtime/debug.ReadBuildInfo: module version, VCS revision and time,
// whether the tree was modified, Go version) for `fairshard version`,
// --version and the fairshard_build_info metric. It imports only the
// standard library.
package buildinfo

import (
	"fmt"
	"runtime/debug"
	"strings"
)

// Info is what one binary was built from. Empty strings mean "not
// recorded" (a test binary, or a build outside a VCS checkout or with
// -buildvcs=false).
type Info struct {
	// Version is the release version given at link time (-ldflags
	// "-X main.version=…"; "dev" when none was).
	Version string
	// Module is the main module's path; ModuleVersion its version as the
	// toolchain recorded it ("(devel)" for a build from a checkout, a
	// tagged or pseudo version for `go install …@version`).
	Module, ModuleVersion string
	// Revision is the VCS revision (commit hash) and Time its commit time
	// (RFC 3339); Modified says the tree had uncommitted changes. Without
	// the toolchain's VCS stamp (-buildvcs=false, a build context without
	// .git) Revision is the one given at link time ("-X
	// main.revision=…": make build, the Dockerfile), Time and Modified
	// unknown.
	Revision, Time string
	Modified       bool
	// GoVersion is the toolchain that built the binary.
	GoVersion string
}

// Read returns the binary's build information, with version and revision
// as given at link time; the toolchain's VCS stamp, when there is one,
// takes precedence over revision.
func Read(version, revision string) Info {
	info := Info{Version: version, Revision: revision}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return info
	}
	info.Module, info.ModuleVersion, info.GoVersion = bi.Main.Path, bi.Main.Version, bi.GoVersion
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value
		case "vcs.time":
			info.Time = s.Value
		case "vcs.modified":
			info.Modified = s.Value == "true"
		}
	}
	return info
}

// String renders the information on one line, e.g. "fairshard 1.4.0
// (module github.com/fairshard/fairshard (devel), revision 7b87125…+dirty
// at 2026-12-01T01:00:00Z, go1.26.8)".
func (i Info) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "fairshard %s (module %s %s, revision ", or(i.Version, "dev"), or(i.Module, "unknown"), or(i.ModuleVersion, "unknown"))
	if i.Revision == "" {
		b.WriteString("unknown")
	} else {
		b.WriteString(i.Revision)
		if i.Modified {
			b.WriteString("+dirty")
		}
		if i.Time != "" {
			b.WriteString(" at " + i.Time)
		}
	}
	fmt.Fprintf(&b, ", %s)", or(i.GoVersion, "unknown Go"))
	return b.String()
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
