// Command fairshard is the fairshard node binary: a clustered, multi-tenant,
// durable outbox dispatcher. It only wires: flags and environment into
// node.Config, signals into a graceful stop, and the subcommands below.
//
//	fairshard [serve] [flags]   run a node (the default)
//	fairshard version           print the version
//	fairshard check DATA_DIR    verify a data dir's store; exit 0 if consistent
//	fairshard demo [flags]      run a local 3-node demo cluster with load
//	fairshard load [flags]      generate load against a running cluster
//	fairshard target [flags]    run a sample delivery target that records deliveries
//	fairshard probe URL         exit 0 if URL answers 2xx (container healthcheck)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/fairshard/fairshard/node"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// run is main without os.Exit, for tests. It returns the exit code.
func run(args, environ []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(args, environ, stderr)
	case "version":
		fmt.Fprintf(stdout, "fairshard %s\n", version)
		return 0
	case "check":
		return check(args, stdout, stderr)
	case "demo":
		return demoCmd(args, stdout, stderr)
	case "load":
		return load(args, stdout, stderr)
	case "target":
		return target(args, stdout, stderr)
	case "probe":
		return probe(args, stderr)
	case "help", "-h", "--help":
		fmt.Fprintln(stdout, "usage: fairshard [serve|version|check DATA_DIR|demo|load|target|probe URL] [flags]; fairshard serve --help lists the flags")
		return 0
	default:
		fmt.Fprintf(stderr, "fairshard: unknown command %q (want serve, version, check, demo, load, target, probe or help)\n", cmd)
		return 2
	}
}

// parseServeFlags parses serve's flags and FAIRSHARD_* variables into a
// validated node.Config.
func parseServeFlags(args, environ []string, stderr io.Writer) (node.Config, []string, error) {
	fs := flag.NewFlagSet("fairshard serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg node.Config
	cfg.RegisterFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: fairshard serve [flags]\n\n")
		fs.PrintDefaults()
		envUsage(fs)
	}
	if err := fs.Parse(args); err != nil {
		return cfg, nil, err
	}
	if fs.NArg() > 0 {
		return cfg, nil, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	unknown, err := node.ApplyEnv(fs, environ)
	if err != nil {
		return cfg, unknown, err
	}
	if err := cfg.Validate(); err != nil {
		return cfg, unknown, err
	}
	return cfg, unknown, nil
}

func newLogger(cfg node.Config, w io.Writer) *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: lvl}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

func serve(args, environ []string, stderr io.Writer) int {
	cfg, unknown, err := parseServeFlags(args, environ, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "fairshard: invalid configuration:\n%v\n", err)
		return 2
	}
	log := newLogger(cfg, stderr)
	for _, name := range unknown {
		log.Warn("unknown environment variable ignored", "name", name)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	n, err := node.New(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "fairshard: %v\n", err)
		return 1
	}
	if err := n.Start(ctx); err != nil {
		fmt.Fprintf(stderr, "fairshard: start: %v\n", err)
		_ = n.Close()
		return 1
	}
	<-ctx.Done()
	stop() // a second signal now kills the process at once (default action)
	log.Info("signal received: draining; a second signal exits at once", "grace", cfg.ShutdownGrace)
	hard := make(chan os.Signal, 1)
	signal.Notify(hard, syscall.SIGINT, syscall.SIGTERM)
	drained := make(chan struct{})
	defer func() {
		signal.Stop(hard)
		close(drained)
	}()
	go func() {
		select {
		case <-hard:
		case <-drained: // stopped gracefully: nothing left to cut short
			return
		}
		log.Warn("second signal: exiting now; rows not handed off stay on disk")
		_ = n.Close()
		os.Exit(1)
	}()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace)
	defer cancel()
	if err := n.Shutdown(sctx); err != nil {
		log.Error("graceful shutdown incomplete", "err", err)
		return 1
	}
	return 0
}
