package node

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
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
func registerBuildInfo(reg prometheus.Registerer, version string) error {
	bi := buildinfo.Read(version)
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "fairshard_build_info",
		Help: "Always 1; the labels say what the binary was built from: release version, module version, VCS revision, whether the tree was modified, Go version.",
		ConstLabels: prometheus.Labels{
			"version": cmpOr(bi.Version, "dev"), "module_version": bi.ModuleVersion,
			"revision": bi.Revision, "modified": strconv.FormatBool(bi.Modified), "go_version": bi.GoVersion,
		},
	})
	g.Set(1)
	if err := reg.Register(g); err != nil {
		return fmt.Errorf("register fairshard_build_info: %w", err)
	}
	return nil
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// pprofHandler serves net/http/pprof under /debug/pprof/, requiring
// "Authorization: Bearer <token>" when token is set.
func pprofHandler(token string) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	if token == "" {
		return mux
	}
	want := []byte(token)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		scheme, cred, _ := strings.Cut(r.Header.Get("Authorization"), " ")
		if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(strings.TrimLeft(cred, " ")), want) != 1 {
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
	n.pprofLn = ln
	// Profiles take up to their ?seconds=; the write timeout leaves room.
	n.pprofSrv = &http.Server{Handler: pprofHandler(n.cfg.APIToken), ReadHeaderTimeout: 10 * time.Second}
	n.log.Info("profiling endpoint listening", "pprof_addr", ln.Addr().String())
	return nil
}

func (n *Node) runPprof(context.Context) error {
	if err := n.pprofSrv.Serve(n.pprofLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("pprof server: %w", err)
	}
	return nil
}

func (n *Node) stopPprof(ctx context.Context) error {
	if n.pprofSrv == nil {
		return nil
	}
	if err := n.pprofSrv.Shutdown(ctx); err != nil {
		return n.pprofSrv.Close()
	}
	return nil
}

// PprofAddr returns the bound address of the profiling listener, "" when
// --pprof-addr is not set or the node has not started.
func (n *Node) PprofAddr() string {
	if n.pprofLn == nil {
		return ""
	}
	return n.pprofLn.Addr().String()
}
