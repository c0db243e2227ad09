package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/fairshard/fairshard/boltstore"
	"github.com/fairshard/fairshard/cluster"
	"github.com/fairshard/fairshard/loadgen"
	"github.com/fairshard/fairshard/node"
	"github.com/fairshard/fairshard/webhook"
)

// check runs the store's consistency check on DATA_DIR: bbolt's page check
// plus every index, counter and per-shard digest (row count and sum of
// outbox.DigestOf, which replicas compare) against a full recount. Like a
// node start, it clears in-transfer marks a crashed handoff left and
// upgrades a format 1 file (the next start would do the same); it changes
// nothing else. With --digests it prints every shard's digest (shard, rows,
// sum in hex), one per line, to compare two nodes' copies by hand. Exit 0:
// consistent; 1: inconsistent, corrupt or locked; 2: usage.
func check(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fairshard check", flag.ContinueOnError)
	shardCount := fs.Uint("shards", 1024, "the cluster's shard count (must match the data file)")
	printDigests := fs.Bool("digests", false, "print every shard's digest (shard rows sum) after the check")
	if code, ok := parseFlags(fs, "check", args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "fairshard check: want exactly one DATA_DIR")
		fs.Usage()
		return 2
	}
	if *shardCount == 0 || *shardCount > uint(cluster.MaxShardCount) {
		fmt.Fprintf(stderr, "fairshard check: --shards must be between 1 and %d\n", cluster.MaxShardCount)
		return 2
	}
	path := filepath.Join(fs.Arg(0), node.DataFileName)
	if _, err := os.Stat(path); err != nil {
		fmt.Fprintf(stderr, "fairshard check: %v\n", err)
		return 1
	}
	s, err := boltstore.Open(path, boltstore.Options{ShardCount: uint32(*shardCount), LockTimeout: time.Second})
	if err != nil {
		if errors.Is(err, boltstore.ErrLocked) {
			fmt.Fprintf(stderr, "fairshard check: %s is in use by another process (stop the node first): %v\n", fs.Arg(0), err)
		} else {
			fmt.Fprintf(stderr, "fairshard check: %v\n", err)
		}
		return 1
	}
	defer s.Close()
	if err := s.Check(context.Background()); err != nil {
		fmt.Fprintf(stderr, "fairshard check: %s is inconsistent: %v\n", path, err)
		return 1
	}
	digests, err := s.ShardDigests(context.Background())
	if err != nil {
		fmt.Fprintf(stderr, "fairshard check: read the shard digests of %s: %v\n", path, err)
		return 1
	}
	rows := int64(0)
	for _, d := range digests {
		rows += d.Rows
	}
	fmt.Fprintf(stdout, "%s: ok (%d rows in %d shards; indexes, counters and shard digests agree with the rows)\n", path, rows, len(digests))
	if *printDigests {
		for _, d := range digests {
			fmt.Fprintf(stdout, "shard %d rows %d sum %016x\n", d.Shard, d.Rows, d.Sum)
		}
	}
	return 0
}

// compact rewrites a stopped node's data file with only its live pages
// (boltstore.Compact, built on bbolt's compaction) and replaces the file
// once the copy is verified (every key and value, then the store check).
// bbolt reuses freed pages but never shrinks a file, so a node that once
// held a large backlog keeps that file size until compacted. Exit 0:
// compacted; 1: locked, corrupt, no space or the copy failed verification
// (the original is then unchanged); 2: usage.
func compact(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fairshard compact", flag.ContinueOnError)
	keep := fs.Bool("keep-original", false, "keep the original file beside the compacted one as "+node.DataFileName+".orig")
	if code, ok := parseFlags(fs, "compact", args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "fairshard compact: want exactly one DATA_DIR")
		fs.Usage()
		return 2
	}
	path := filepath.Join(fs.Arg(0), node.DataFileName)
	res, err := boltstore.Compact(context.Background(), path, boltstore.CompactOptions{LockTimeout: time.Second, KeepOriginal: *keep})
	if err != nil {
		if errors.Is(err, boltstore.ErrLocked) {
			fmt.Fprintf(stderr, "fairshard compact: %s is in use by another process (stop the node first): %v\n", fs.Arg(0), err)
		} else {
			fmt.Fprintf(stderr, "fairshard compact: %v\n", err)
		}
		return 1
	}
	fmt.Fprintf(stdout, "%s: compacted from %d to %d bytes (%d rows, verified) in %s\n", path, res.Before, res.After, res.Rows, res.Took.Round(time.Millisecond))
	if *keep {
		fmt.Fprintf(stdout, "the original is kept as %s.orig\n", path)
	}
	return 0
}

// probe GETs a URL and exits 0 on a 2xx answer: the container healthcheck
// (the image has no curl).
func probe(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fairshard probe", flag.ContinueOnError)
	if code, ok := parseFlags(fs, "probe", args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "usage: fairshard probe URL")
		return 2
	}
	c := &http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get(fs.Arg(0))
	if err != nil {
		fmt.Fprintf(stderr, "probe: %v\n", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		fmt.Fprintf(stderr, "probe: %s answered %d\n", fs.Arg(0), resp.StatusCode)
		return 1
	}
	return 0
}

// target runs a sample delivery target (loadgen.Receiver) and logs what it
// receives every 5 s.
func target(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("fairshard target", flag.ContinueOnError)
	addr := fs.String("addr", ":9000", "listen address")
	delay := fs.Duration("delay", 20*time.Millisecond, "how long each delivery is held (target latency)")
	var secretArgs []string
	fs.Func("signing-secret", "verify every delivery's Standard Webhooks signature with this secret (whsec_…; repeat or comma-separate for a rotation); failures are answered 401 and counted", func(v string) error {
		secretArgs = append(secretArgs, strings.Split(v, ",")...)
		return nil
	})
	if code, ok := parseFlags(fs, "target", args, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fairshard target: unexpected arguments %q\n", fs.Args())
		return 2
	}
	secrets, err := webhook.ParseSecrets(secretArgs)
	if err != nil {
		fmt.Fprintf(stderr, "fairshard target: --signing-secret: %v\n", err)
		return 2
	}
	recv := loadgen.NewReceiver(*delay)
	recv.SetSigningSecrets(secrets)
	srv := &http.Server{Addr: *addr, Handler: recv, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	go func() {
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				_ = srv.Close()
				return
			case <-t.C:
				b, _ := json.Marshal(recv.Namespaces())
				sig := ""
				if len(secrets) > 0 {
					sig = fmt.Sprintf(" signatures_verified=%d signature_failures=%d", recv.Verified(), recv.SignatureFailures())
				}
				fmt.Fprintf(stdout, "delivered=%d distinct=%d%s namespaces=%s\n", recv.Delivered(), recv.Distinct(), sig, b)
			}
		}
	}()
	verifying := "not verifying signatures"
	if len(secrets) > 0 {
		fps := make([]string, len(secrets))
		for i, s := range secrets {
			fps[i] = s.Fingerprint()
		}
		verifying = "verifying signatures with secrets " + strings.Join(fps, ",")
	}
	fmt.Fprintf(stdout, "fairshard target listening on %s (delay %v, %s)\n", *addr, *delay, verifying)
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		fmt.Fprintf(stderr, "target: %v\n", err)
		return 1
	}
	return 0
}

// load generates load against a running cluster and prints a report.
func load(args []string, stdout, stderr io.Writer) int {
	lc, code, ok := parseLoadFlags(args, stdout, stderr)
	if !ok {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	var recv *loadgen.Receiver
	if lc.recvAddr != "" {
		recv = loadgen.NewReceiver(lc.recvDelay)
		srv := &http.Server{Addr: lc.recvAddr, Handler: recv, ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.ListenAndServe() }()
		defer srv.Close()
	}
	g, err := loadgen.NewGenerator(lc.gen)
	if err != nil {
		fmt.Fprintf(stderr, "fairshard load: %v\n", err)
		return 2
	}
	done := make(chan struct{})
	go printLoadProgress(stdout, g, recv, done)
	start := time.Now()
	rep, _ := g.Run(ctx)
	if recv != nil {
		deadline := time.Now().Add(lc.wait)
		for int64(recv.Distinct()) < rep.Appended && time.Now().Before(deadline) && ctx.Err() == nil {
			time.Sleep(100 * time.Millisecond)
		}
	}
	close(done)
	printLoadReport(stdout, g, rep)
	if recv != nil {
		printDeliveryReport(stdout, recv, start)
	}
	if rep.Appended == 0 {
		return 1
	}
	return 0
}

// loadConfig is a parsed `fairshard load` command line: the generator's
// configuration and the built-in delivery target's settings.
type loadConfig struct {
	gen       loadgen.Config
	recvAddr  string        // built-in target's address; "" runs none
	recvDelay time.Duration // built-in target's per-delivery latency
	wait      time.Duration // how long to wait for deliveries after appending
}

// parseLoadFlags parses load's command line. The token comes from
// --api-token-file when set, else --api-token; either --rows or
// --duration must be non-zero. On a usage error it prints it and returns
// ok false with the exit code (2; 0 for -h).
func parseLoadFlags(args []string, stdout, stderr io.Writer) (lc loadConfig, code int, ok bool) {
	fs := flag.NewFlagSet("fairshard load", flag.ContinueOnError)
	nodes := fs.String("nodes", "http://127.0.0.1:8080", "comma-separated node base URLs")
	token := fs.String("api-token", os.Getenv("FAIRSHARD_API_TOKEN"), "bearer token (default: $FAIRSHARD_API_TOKEN)")
	tokenFile := fs.String("api-token-file", os.Getenv("FAIRSHARD_API_TOKEN_FILE"), "file holding the bearer token, instead of --api-token (default: $FAIRSHARD_API_TOKEN_FILE)")
	nsFlag := fs.String("namespaces", "default:1", "namespaces as name:weight[:taskqueues],…")
	rate := fs.Float64("rate", 0, "target rows/s (0: open loop)")
	rows := fs.Int("rows", 0, "stop after this many rows (0: run for --duration)")
	duration := fs.Duration("duration", 30*time.Second, "stop after this long (0: run until --rows)")
	batch := fs.Int("batch", 100, "rows per request")
	payload := fs.Int("payload-bytes", 64, "approximate payload size (bytes)")
	conc := fs.Int("concurrency", 4, "concurrent appenders")
	fs.StringVar(&lc.recvAddr, "target-addr", "", "also run a built-in delivery target on this address and report deliveries (point the cluster's targets at it)")
	fs.DurationVar(&lc.recvDelay, "target-delay", 0, "built-in target's per-delivery latency")
	fs.DurationVar(&lc.wait, "wait", 30*time.Second, "with --target-addr: how long to wait for deliveries after appending")
	if code, ok := parseFlags(fs, "load", args, stdout, stderr); !ok {
		return lc, code, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fairshard load: unexpected arguments %q\n", fs.Args())
		return lc, 2, false
	}
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			fmt.Fprintf(stderr, "fairshard load: --api-token-file: %v\n", err)
			return lc, 2, false
		}
		*token = strings.TrimSpace(string(b))
	}
	nss, err := loadgen.ParseNamespaces(*nsFlag, node.ValidName)
	if err != nil {
		fmt.Fprintf(stderr, "fairshard load: --namespaces: %v\n", err)
		return lc, 2, false
	}
	if *rows == 0 && *duration == 0 {
		fmt.Fprintln(stderr, "fairshard load: set --rows or --duration")
		return lc, 2, false
	}
	lc.gen = loadgen.Config{
		Nodes: strings.Split(*nodes, ","), Token: *token, Namespaces: nss, Rate: *rate, Rows: *rows,
		Duration: *duration, BatchSize: *batch, PayloadBytes: *payload, Concurrency: *conc,
	}
	return lc, 0, true
}

// printLoadProgress prints the running totals once a second (appended and
// failed requests, and deliveries when recv is set) until done is closed.
func printLoadProgress(stdout io.Writer, g *loadgen.Generator, recv *loadgen.Receiver, done <-chan struct{}) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C:
			line := fmt.Sprintf("appended=%d errors=%d", g.Appended(), g.Errors())
			if recv != nil {
				line += fmt.Sprintf(" delivered=%d", recv.Delivered())
			}
			fmt.Fprintln(stdout, line)
		}
	}
}

// printLoadReport prints the append side of a finished run: throughput,
// request errors by status, latency percentiles and the last error.
func printLoadReport(stdout io.Writer, g *loadgen.Generator, rep loadgen.Report) {
	fmt.Fprintf(stdout, "appended %d rows in %v: %.0f rows/s, %d request errors, by status %v\n",
		rep.Appended, rep.Elapsed.Round(time.Millisecond), rep.RowsPerSec, rep.Errors, rep.ByStatus)
	fmt.Fprintf(stdout, "append request latency ms: p50 %.1f p90 %.1f p99 %.1f max %.1f\n",
		rep.AppendLatency.P50, rep.AppendLatency.P90, rep.AppendLatency.P99, rep.AppendLatency.Max)
	if last := g.LastError(); last != "" {
		fmt.Fprintf(stdout, "last error: %s\n", last)
	}
}

// printDeliveryReport prints what the built-in target received: totals,
// duplicates and the delivery rate measured from start (the first append)
// to the last delivery, then each namespace's deliveries, peak concurrency
// and append→delivery latency.
func printDeliveryReport(stdout io.Writer, recv *loadgen.Receiver, start time.Time) {
	var took time.Duration
	if last := recv.LastDelivery(); !last.IsZero() {
		took = last.Sub(start)
	}
	rate := 0.0
	if took > 0 {
		rate = float64(recv.Distinct()) / took.Seconds()
	}
	fmt.Fprintf(stdout, "delivered %d (distinct %d, duplicates %d) in %v from the first append: %.0f rows/s\n",
		recv.Delivered(), recv.Distinct(), len(recv.Duplicates()), took.Round(time.Millisecond), rate)
	for _, ns := range recv.Namespaces() {
		fmt.Fprintf(stdout, "  %-12s delivered %-8d max concurrent %-5d append→delivery ms p50 %.1f p99 %.1f\n",
			ns.Namespace, ns.Delivered, ns.MaxInFlight, ns.Latency.P50, ns.Latency.P99)
	}
}
