package main

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/fairshard/fairshard/node"
)

// Files `fairshard secrets --dir` keeps (what --cluster-secret-file,
// --gossip-key-file and --api-token-file read).
const (
	clusterSecretFile = "cluster-secret"
	gossipKeyFile     = "gossip-key"
	apiTokenFile      = "api-token"
)

// secretsCmd prints a fresh cluster secret, gossip key and API token, or
// with --dir makes sure DIR holds all three (the one-shot init service of
// docker-compose.yml): a value given in FAIRSHARD_CLUSTER_SECRET,
// FAIRSHARD_GOSSIP_KEY or FAIRSHARD_API_TOKEN is written (the user's env
// file wins); else a file already there is kept; else a fresh value is
// generated. Files are 0600; with --dir the values are never printed,
// except the API token with --print-api-token (what a user of compose
// runs once to learn it).
func secretsCmd(args, environ []string, stdout, stderr io.Writer) int {
	fset := flag.NewFlagSet("fairshard secrets", flag.ContinueOnError)
	dir := fset.String("dir", "", "directory to keep "+clusterSecretFile+", "+gossipKeyFile+" and "+apiTokenFile+" in (default: print fresh values)")
	printToken := fset.Bool("print-api-token", false, "with --dir: print the kept API token (and nothing else) on stdout")
	if code, ok := parseFlags(fset, "secrets", args, stdout, stderr); !ok {
		return code
	}
	if *dir == "" {
		if *printToken {
			fmt.Fprintln(stderr, "fairshard secrets: --print-api-token needs --dir")
			return 2
		}
		fmt.Fprintf(stdout, "FAIRSHARD_CLUSTER_SECRET=%s\nFAIRSHARD_GOSSIP_KEY=%s\nFAIRSHARD_API_TOKEN=%s\n", newClusterSecret(), newGossipKey(), newAPIToken())
		return 0
	}
	env := map[string]string{}
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = strings.TrimSpace(v)
		}
	}
	gossip := env[node.EnvName("gossip-key")]
	if gossip != "" {
		keys := strings.Split(gossip, ",")
		if _, err := node.ParseGossipKeys(keys); err != nil {
			fmt.Fprintf(stderr, "fairshard secrets: %s: %v\n", node.EnvName("gossip-key"), err)
			return 2
		}
		gossip = strings.Join(keys, "\n")
	}
	token := env[node.EnvName("api-token")]
	if strings.ContainsAny(token, " \t\r\n") {
		fmt.Fprintf(stderr, "fairshard secrets: %s: the token must not contain whitespace\n", node.EnvName("api-token"))
		return 2
	}
	// The report goes to stderr when stdout carries the token.
	report := stdout
	if *printToken {
		report = stderr
	}
	for _, f := range []struct{ name, given, fresh string }{
		{clusterSecretFile, env[node.EnvName("cluster-secret")], newClusterSecret()},
		{gossipKeyFile, gossip, newGossipKey()},
		{apiTokenFile, token, newAPIToken()},
	} {
		path := filepath.Join(*dir, f.name)
		what, err := keepSecret(path, f.given, f.fresh)
		if err != nil {
			fmt.Fprintf(stderr, "fairshard secrets: %v\n", err)
			return 1
		}
		fmt.Fprintf(report, "%s: %s\n", path, what)
	}
	if *printToken {
		b, err := os.ReadFile(filepath.Join(*dir, apiTokenFile))
		if err != nil {
			fmt.Fprintf(stderr, "fairshard secrets: %v\n", err)
			return 1
		}
		fmt.Fprintln(stdout, strings.TrimSpace(string(b)))
	}
	return 0
}

// keepSecret writes given to path when set, else keeps a non-empty file,
// else writes fresh; it says which.
func keepSecret(path, given, fresh string) (string, error) {
	if given == "" {
		b, err := os.ReadFile(path)
		if err == nil && strings.TrimSpace(string(b)) != "" {
			return "kept", nil
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("read %s: %w", path, err)
		}
	}
	v, what := fresh, "generated"
	if given != "" {
		v, what = given, "written from the environment"
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(v+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("write %s: %w", path, err)
	}
	return what, nil
}

func newClusterSecret() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newAPIToken is a fresh API token: 32 random bytes, hex.
func newAPIToken() string { return newClusterSecret() }

func newGossipKey() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}
