// Command fairshard is the fairshard node binary: a clustered, multi-tenant,
// durable outbox dispatcher. It only wires: flags and environment into
// node.Config, signals into a graceful stop, and the subcommands below.
//
// The subcommands are listed in commands() (fairshard --help prints them):
// serve (the default), version, check, compact, demo, load, target, secrets,
// probe,
// help.
// Every one answers --help with its usage and exit 0.
//
// Build it as a binary named fairshard: go build -o fairshard ./cmd/node
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/fairshard/fairshard/buildinfo"
	"github.com/fairshard/fairshard/node"
)

// version and revision are set at build time with -ldflags "-X
// main.version=… -X main.revision=…" (make build and the Dockerfile pass
// the commit, for builds the toolchain cannot stamp).
var (
	version  = "dev"
	revision string
)

func main() {
	os.Exit(run(os.Args[1:], os.Environ(), os.Stdout, os.Stderr))
}

// command is one subcommand of the binary.
type command struct {
	name string
	// args is the usage after the name, e.g. "[flags] DATA_DIR".
	args string
	// summary is the one line `fairshard --help` shows.
	summary string
	run     func(args, environ []string, stdout, stderr io.Writer) int
}

// commands lists the subcommands in the order `fairshard --help` shows
// them. Every one answers --help with its usage and exit 0 (tested).
func commands() []command {
	return []command{
		{"serve", "[flags]", "run a node (the default command)", serve},
		{"version", "", "print the version",
			func(args, _ []string, stdout, stderr io.Writer) int { return versionCmd(args, stdout, stderr) }},
		{"check", "[--shards N] [--digests] DATA_DIR", "verify a stopped node's data dir (indexes, counters, shard digests); exit 0 if consistent",
			func(args, _ []string, stdout, stderr io.Writer) int { return check(args, stdout, stderr) }},
		{"compact", "[--keep-original] DATA_DIR", "give a stopped node's freed disk space back: rewrite its data file compactly, verified before it replaces the original",
			func(args, _ []string, stdout, stderr io.Writer) int { return compact(args, stdout, stderr) }},
		{"demo", "[flags]", "run a local multi-node cluster with load, a live view and a summary",
			func(args, _ []string, stdout, stderr io.Writer) int { return demoCmd(args, stdout, stderr) }},
		{"load", "[flags]", "generate load against a running cluster and report",
			func(args, _ []string, stdout, stderr io.Writer) int { return load(args, stdout, stderr) }},
		{"target", "[flags]", "run a sample delivery target that answers 200 and prints a summary",
			func(args, _ []string, stdout, stderr io.Writer) int { return target(args, stdout, stderr) }},
		{"secrets", "[--dir DIR]", "print a fresh cluster secret and gossip key, or keep both in DIR (compose's init service)", secretsCmd},
		{"probe", "URL", "exit 0 if URL answers 2xx (the container health check)",
			func(args, _ []string, stdout, stderr io.Writer) int { return probe(args, stdout, stderr) }},
		{"help", "[COMMAND]", "print this help, or a command's",
			func(args, environ []string, stdout, stderr io.Writer) int { return help(args, environ, stdout, stderr) }},
	}
}

func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
}

func commandNames() string {
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	return strings.Join(names, ", ")
}

// run is main without os.Exit, for tests. It returns the exit code.
func run(args, environ []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help":
			return help(nil, environ, stdout, stderr)
		case "-version", "--version":
			return versionCmd(nil, stdout, stderr)
		}
	}
	name := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	c, ok := lookup(name)
	if !ok {
		fmt.Fprintf(stderr, "fairshard: unknown command %q (want %s); fairshard --help lists them\n", name, commandNames())
		return 2
	}
	return c.run(args, environ, stdout, stderr)
}

// help prints the list of commands, or a command's own help.
func help(args, environ []string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] != "-h" && args[0] != "--help" && args[0] != "-help" {
		c, ok := lookup(args[0])
		if !ok || c.name == "help" {
			fmt.Fprintf(stderr, "fairshard help: unknown command %q (want %s)\n", args[0], commandNames())
			return 2
		}
		return c.run([]string{"--help"}, environ, stdout, stderr)
	}
	fmt.Fprintf(stdout, "fairshard: a clustered, multi-tenant, durable outbox dispatcher (version %s).\n\n", version)
	fmt.Fprintf(stdout, "usage: fairshard [COMMAND] [flags]\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(stdout, "  %-8s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(stdout, "\nfairshard COMMAND --help shows a command's usage and flags; without a command, fairshard\nruns serve. Every serve flag is also an environment variable %s<FLAG_NAME>.\n", node.EnvPrefix)
	return 0
}

// usageFunc prints "usage: fairshard NAME ARGS", the summary and the flags.
func usageFunc(fs *flag.FlagSet, name string) func() {
	return func() {
		c, _ := lookup(name)
		fmt.Fprintf(fs.Output(), "usage: %s\n\n%s.\n", strings.TrimSpace("fairshard "+c.name+" "+c.args), upperFirst(c.summary))
		var any bool
		fs.VisitAll(func(*flag.Flag) { any = true })
		if any {
			fmt.Fprintf(fs.Output(), "\nflags:\n")
			fs.PrintDefaults()
		}
	}
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// parseFlags parses a subcommand's flags. --help (or -h) prints its usage to
// stdout: (0, false). A bad flag prints the error and the usage to stderr:
// (2, false). Otherwise (0, true).
func parseFlags(fs *flag.FlagSet, name string, args []string, stdout, stderr io.Writer) (int, bool) {
	fs.Usage = usageFunc(fs, name)
	fs.SetOutput(io.Discard)
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		fs.SetOutput(stdout)
		fs.Usage()
		return 0, false
	case err != nil:
		fs.SetOutput(stderr)
		fmt.Fprintf(stderr, "fairshard %s: %v\n", name, err)
		fs.Usage()
		return 2, false
	}
	fs.SetOutput(stderr)
	return 0, true
}

// versionCmd prints the version set at build time, the module version and
// the VCS revision the toolchain recorded (package buildinfo).
func versionCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fairshard version", flag.ContinueOnError)
	if code, ok := parseFlags(fs, "version", args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fairshard version: unexpected arguments %q\n", fs.Args())
		return 2
	}
	fmt.Fprintln(stdout, buildinfo.Read(version, revision).String())
	return 0
}

// parseServeFlags parses serve's flags and FAIRSHARD_* variables into a
// validated node.Config.
// --help returns flag.ErrHelp (serve prints the usage); nothing is printed
// here.
func parseServeFlags(args, environ []string, _ io.Writer) (node.Config, []string, error) {
	var cfg node.Config
	fs := serveFlags(&cfg)
	fs.SetOutput(io.Discard)
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

// serveFlags is serve's flag set over cfg, with its usage (flags, then
// the environment variables).
func serveFlags(cfg *node.Config) *flag.FlagSet {
	fs := flag.NewFlagSet("fairshard serve", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	usage := usageFunc(fs, "serve")
	fs.Usage = func() {
		usage()
		envUsage(fs)
	}
	return fs
}

func serve(args, environ []string, stdout, stderr io.Writer) int {
	cfg, unknown, err := parseServeFlags(args, environ, stderr)
	cfg.Version, cfg.Revision = version, revision
	if errors.Is(err, flag.ErrHelp) {
		fs := serveFlags(&node.Config{})
		fs.SetOutput(stdout)
		fs.Usage()
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
	for _, name := range node.SecretArgs(args) {
		log.Warn("a secret is given on the command line: ps and /proc/PID/cmdline show it to every local user (profiles show it redacted)",
			"flag", "--"+name, "fix", "use --"+name+"-file or "+node.EnvName(name))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// SIGHUP reloads --gossip-key-file (a key rotation step); caught from
	// here on, so it never ends the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
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
serving:
	for {
		select {
		case <-ctx.Done():
			break serving
		case <-hup:
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := n.ReloadGossipKeys(rctx); err != nil {
				log.Error("SIGHUP: gossip keys not reloaded; the node keeps its keys", "err", err)
			}
			cancel()
		case err := <-n.Failed():
			log.Error("stopping: the node cannot serve", "err", err)
			fmt.Fprintf(stderr, "fairshard: %v\n", err)
			_ = n.Close()
			return 1
		}
	}
	stop()
	log.Info("signal received: draining; in-flight deliveries get half the grace, every row held here is handed off before the node exits; a second signal exits at once",
		"grace", cfg.ShutdownGrace)
	hard := make(chan os.Signal, 1)
	signal.Notify(hard, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(hard)
	// The leave has no deadline (node.Shutdown): only a second signal cuts
	// it short, through sctx; what was not handed off stays on disk.
	sctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	stopped := make(chan struct{})
	defer close(stopped)
	go func() {
		select {
		case <-hard:
		case <-stopped:
			return
		}
		log.Warn("second signal: exiting now; rows not handed off stay on disk and move when the node returns")
		cancel()
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			log.Error("the stop did not end within 10 s of the second signal: exiting")
			os.Exit(1)
		}
	}()
	if err := n.Shutdown(sctx); err != nil {
		log.Error("graceful shutdown incomplete", "err", err)
		return 1
	}
	return 0
}
