package main

import (
	"flag"
	"fmt"

	"github.com/fairshard/fairshard/node"
)

// envUsage lists the environment variables after the flag help.
func envUsage(fs *flag.FlagSet) {
	fmt.Fprintf(fs.Output(), "\nEvery flag can also be set by the environment variable %s<FLAG_NAME> (flags win),\ne.g. --node-name ↔ %s. Unknown %s* variables are reported at start.\n",
		node.EnvPrefix, node.EnvName("node-name"), node.EnvPrefix)
}
