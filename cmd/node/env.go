package main

import (
	"flag"
	"fmt"
	"sort"
	"strings"
)

// envPrefix starts every environment variable the binary reads.
const envPrefix = "FAIRSHARD_"

// EnvName maps a flag name to its environment variable: "node-name" →
// "FAIRSHARD_NODE_NAME".
func EnvName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// applyEnv sets every flag not given on the command line from its
// FAIRSHARD_* variable (flags win). It returns the FAIRSHARD_* variables
// that match no flag, sorted, so the caller can report them.
func applyEnv(fs *flag.FlagSet, environ []string) (unknown []string, err error) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	known := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { known[EnvName(f.Name)] = f.Name })
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, envPrefix) {
			continue
		}
		flagName, isKnown := known[name]
		if !isKnown {
			unknown = append(unknown, name)
			continue
		}
		if given[flagName] {
			continue
		}
		if err := fs.Set(flagName, value); err != nil {
			return unknown, fmt.Errorf("%s=%q: %w", name, value, err)
		}
	}
	sort.Strings(unknown)
	return unknown, nil
}

// envUsage lists the environment variables after the flag help.
func envUsage(fs *flag.FlagSet) {
	out := fs.Output()
	fmt.Fprintf(out, "\nEvery flag can also be set by the environment variable %s<FLAG_NAME> (flags win),\ne.g. --node-name ↔ %s. Unknown %s* variables are reported at start.\n",
		envPrefix, EnvName("node-name"), envPrefix)
}
