package node

import (
	"cmp"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fairshard/fairshard/buildinfo"
)

// Operating a node: the build_info metric and the optional profiling
// listener.

// registerBuildInfo registers fairshard_build_info: a gauge at 1 whose
// labels say what the binary was built from (buildinfo.Read).
func registerBuildInfo(reg prometheus.Registerer, version, revision string) error {
	bi := buildinfo.Read(version, revision)
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fairshard_build_info",
		Help: "Always 1; the labels say what the binary was built from: release version, module version, VCS revision, whether the tree was modified, Go version.",
		ConstLabels: prometheus.Labels{
			"version": cmp.Or(bi.Version, "dev"), "module_version": bi.ModuleVersion,
			"revision": bi.Revision, "modified": strconv.FormatBool(bi.Modified), "go_version": bi.GoVersion,
		},
	})
	g.Set(1)
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("register fairshard_build_info: %w", err)
	}
	return nil
}

// SecretFlags are the flags of `fairshard serve` whose value is a secret.
// /debug/pprof/cmdline never shows their values (ScrubArgs), and serve
// warns when one is given on the command line: ps and /proc/PID/cmdline
// show process arguments to every local user, so secrets belong in the
// FAIRSHARD_* variables or the *-file flags.
var SecretFlags = []string{"api-token", "cluster-secret", "gossip-key"}

// Redacted replaces a secret value in ScrubArgs' output.
const Redacted = "REDACTED"

// SecretArgs returns the SecretFlags given in args (command-line
// arguments, program name excluded), in order, once each.
func SecretArgs(args []string) []string {
	var out []string
	scanArgs(args, func(name string, _ int, _ bool) {
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	})
	return out
}

// ScrubArgs returns a copy of args (os.Args, program name first) with the
// value of every SecretFlags flag replaced by Redacted, in both the
// "--flag value" and "--flag=value" forms.
func ScrubArgs(args []string) []string {
	out := slices.Clone(args)
	if len(out) == 0 {
		return out
	}
	scanArgs(out[1:], func(_ string, i int, inline bool) {
		i++ // out[0] is the program
		if inline {
			k, _, _ := strings.Cut(out[i], "=")
			out[i] = k + "=" + Redacted
		} else if i+1 < len(out) {
			out[i+1] = Redacted
		}
	})
	return out
}

// scanArgs calls f for each secret flag in args: its name, its index and
// whether its value is inline ("--flag=value").
func scanArgs(args []string, f func(name string, i int, inline bool)) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if !strings.HasPrefix(a, "-") || a == "-" || a == "--" {
			continue
		}
		name, _, inline := strings.Cut(strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-"), "=")
		if !slices.Contains(SecretFlags, name) {
			continue
		}
		f(name, i, inline)
		if !inline {
			i++ // the value
		}
	}
}

// cmdline is pprof.Cmdline with the secret values redacted.
func cmdline(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, strings.Join(ScrubArgs(os.Args), "\x00"))
}

// pprofHandler serves net/http/pprof under /debug/pprof/, requiring
// "Authorization: Bearer <token>" (Validate makes sure there is a
// token; an empty one refuses everything). /debug/pprof/cmdline shows
// the arguments scrubbed of secrets.
func pprofHandler(token string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, cred, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if len(want) == 0 || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(strings.TrimLeft(cred, " ")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="fairshard"`)
			http.Error(w, "missing or wrong bearer token (--api-token)", http.StatusUnauthorized)
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// startPprof binds --pprof-addr; the listener is served by runPprof.
func (n *Node) startPprof(context.Context) error {
	ln, err := net.Listen("tcp", n.cfg.PprofAddr)
	if err != nil {
		return fmt.Errorf("listen on --pprof-addr %s: %w", n.cfg.PprofAddr, err)
	}
	n.serving.pprofLn = ln
	// Profiles take up to their ?seconds=; the write timeout leaves room.
	n.serving.pprofSrv = &http.Server{Handler: pprofHandler(n.cfg.APIToken), ReadHeaderTimeout: 10 * time.Second}
	if n.cfg.PprofInsecure && !loopbackAddr(ln.Addr()) {
		n.log.Warn("profiling endpoint listening beyond loopback (--pprof-insecure): whoever holds the API token and reaches it can read profiles", "pprof_addr", ln.Addr().String())
	} else {
		n.log.Info("profiling endpoint listening", "pprof_addr", ln.Addr().String())
	}
	return nil
}

func (n *Node) runPprof(context.Context) error {
	if err := n.serving.pprofSrv.Serve(n.serving.pprofLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("pprof server: %w", err)
	}
	return nil
}

func (n *Node) stopPprof(ctx context.Context) error {
	if n.serving.pprofSrv == nil {
		return nil
	}
	if err := n.serving.pprofSrv.Shutdown(ctx); err != nil {
		return n.serving.pprofSrv.Close()
	}
	return nil
}

// PprofAddr returns the bound address of the profiling listener, "" when
// --pprof-addr is not set or the node has not started.
func (n *Node) PprofAddr() string {
	if n.serving.pprofLn == nil {
		return ""
	}
	return n.serving.pprofLn.Addr().String()
}

// loopbackAddr reports whether a listener's address is a loopback IP.
func loopbackAddr(a net.Addr) bool {
	t, ok := a.(*net.TCPAddr)
	return ok && t.IP.IsLoopback()
}
