package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/fairshard/fairshard/demo"
)

// demo runs a local multi-node cluster with load and a live view; see
// package demo. Exit 0 when no row was lost.
func demoCmd(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fairshard demo", flag.ContinueOnError)
	nodes := fs.Int("nodes", 3, "initial cluster size (a node is added part-way and one stopped later)")
	duration := fs.Duration("duration", 36*time.Second, "how long the load runs")
	rate := fs.Float64("rate", 1500, "offered load, rows/s")
	keep := fs.Bool("keep", false, "leave the cluster running after the summary and print its URLs")
	if code, ok := parseFlags(fs, "demo", args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fairshard demo: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *nodes < 2 || *nodes > 50 {
		fmt.Fprintln(stderr, "fairshard demo: --nodes must be between 2 and 50")
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	_, err := demo.Run(ctx, demo.Options{Nodes: *nodes, Duration: *duration, Rate: *rate, Keep: *keep, Out: stdout, TTY: isTerminal(stdout)})
	if err != nil && !(*keep && ctx.Err() != nil) {
		fmt.Fprintf(stderr, "fairshard demo: %v\n", err)
		return 1
	}
	return 0
}

// isTerminal reports whether w is a character device (an interactive
// terminal), so the demo redraws in place; pipes and files get plain lines.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
