package main

import (
	"bytes"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fairshard/fairshard/node"
)

// configReference is the document whose "## Configuration" table lists
// every flag of `fairshard serve`.
const configReference = "../../docs/operations.md"

// TestConfigReferenceMatchesServeHelp keeps the configuration table of
// docs/operations.md and `fairshard serve --help` in step, both ways: a
// flag the help prints must have a row (its first cell names it as
// `--flag`), a flag a row names must exist, and each row's env cell must
// name the flag's variable (FAIRSHARD_<FLAG_NAME>, or a FAIRSHARD_X_*
// pattern covering it).
func TestConfigReferenceMatchesServeHelp(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := run([]string{"serve", "--help"}, nil, &stdout, &stderr); code != 0 {
		t.Fatalf("serve --help: exit %d, want 0\nstdout:\n%s\nstderr:\n%s", code, stdout.String(), stderr.String())
	}
	help := helpFlags(stdout.String())
	if len(help) < 10 {
		t.Fatalf("found %d flags in serve --help; the parser lost them?\n%s", len(help), stdout.String())
	}

	data, err := os.ReadFile(configReference)
	if err != nil {
		t.Fatal(err)
	}
	rows := configTable(t, string(data))
	if len(rows) == 0 {
		t.Fatalf(`%s has no "## Configuration" table with rows starting "| `+"`--flag`"+`"`, configReference)
	}
	documented := map[string]string{} // flag → the env cell of its row
	for _, r := range rows {
		for _, f := range r.flags {
			if _, dup := documented[f]; dup {
				t.Errorf("%s line %d: --%s has a second row", configReference, r.line, f)
			}
			documented[f] = r.env
		}
	}

	for _, f := range help {
		env, ok := documented[f]
		if !ok {
			t.Errorf("--%s is a flag of fairshard serve but has no row in the configuration table of %s: add one (flag, %s, default, meaning)", f, configReference, node.EnvName(f))
			continue
		}
		if !envCovers(env, node.EnvName(f)) {
			t.Errorf("%s: the row of --%s names %q as its variable, want %s", configReference, f, env, node.EnvName(f))
		}
	}
	for _, r := range rows {
		for _, f := range r.flags {
			if !slices.Contains(help, f) {
				t.Errorf("%s line %d: --%s is not a flag of fairshard serve (serve --help does not list it): remove or rename the row", configReference, r.line, f)
			}
		}
	}
}

// helpFlags returns the flag names a flag.FlagSet's PrintDefaults wrote
// ("  -name type" lines), in order.
func helpFlags(help string) []string {
	re := regexp.MustCompile(`(?m)^  -([a-z0-9][a-z0-9-]*)\b`)
	var out []string
	for _, m := range re.FindAllStringSubmatch(help, -1) {
		out = append(out, m[1])
	}
	return out
}

// configRow is one row of the configuration table: the flags its first
// cell names and its second (env) cell.
type configRow struct {
	line  int
	flags []string
	env   string
}

// configTable reads the rows of the table under "## Configuration" (up
// to the next "## " heading) whose first cell names flags.
func configTable(t *testing.T, doc string) []configRow {
	t.Helper()
	flagRe := regexp.MustCompile("`--([a-z0-9][a-z0-9-]*)`")
	var out []configRow
	in := false
	for i, l := range strings.Split(doc, "\n") {
		if strings.HasPrefix(l, "## ") {
			in = strings.TrimSpace(l) == "## Configuration"
			continue
		}
		if !in || !strings.HasPrefix(l, "| `--") {
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(l), "|"), "|")
		if len(cells) < 4 {
			t.Errorf("%s line %d: a configuration row needs 4 cells (flag, env, default, meaning): %s", configReference, i+1, l)
			continue
		}
		r := configRow{line: i + 1, env: strings.TrimSpace(cells[1])}
		for _, m := range flagRe.FindAllStringSubmatch(cells[0], -1) {
			r.flags = append(r.flags, m[1])
		}
		out = append(out, r)
	}
	return out
}

// envCovers reports whether an env cell names the variable: itself, or a
// `FAIRSHARD_X_*` pattern whose prefix it has.
func envCovers(cell, variable string) bool {
	for _, w := range strings.FieldsFunc(cell, func(r rune) bool { return r == '`' || r == ',' || r == ' ' }) {
		if w == variable {
			return true
		}
		if p, ok := strings.CutSuffix(w, "*"); ok && p != node.EnvPrefix && strings.HasPrefix(variable, p) {
			return true
		}
	}
	return false
}
