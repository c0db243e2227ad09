package node

import (
	"flag"
	"fmt"
	"sort"
	"strings"
)

// EnvPrefix starts every environment variable the binary reads.
const EnvPrefix = "FAIRSHARD_"

// EnvName maps a flag name to its environment variable: "node-name" →
// "FAIRSHARD_NODE_NAME".
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// KnownEnv returns every FAIRSHARD_* variable `fairshard serve` accepts,
// sorted: one per flag of Config.RegisterFlags.
func KnownEnv() []string {
	fs := flag.NewFlagSet("env", flag.ContinueOnError)
	var c Config
	c.RegisterFlags(fs)
	var out []string
	fs.VisitAll(func(f *flag.Flag) { out = append(out, EnvName(f.Name)) })
	sort.Strings(out)
	return out
}

// ApplyEnv sets every flag of fs not given on the command line from its
// FAIRSHARD_* variable in environ ("NAME=value" pairs), so flags win over
// the environment. It returns the FAIRSHARD_* variables that match no flag,
// sorted, for the caller to report; and an error naming the variable whose
// value a flag rejected.
func ApplyEnv(fs *flag.FlagSet, environ []string) (unknown []string, err error) {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	known := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { known[EnvName(f.Name)] = f.Name })
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, EnvPrefix) {
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
