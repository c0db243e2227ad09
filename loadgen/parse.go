package loadgen

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseNamespaces reads a namespace list "name:weight[:taskqueues],…"
// (weight and task queue count default to 1), as `fairshard load
// --namespaces` takes it. valid, when non-nil, checks each name (the node
// passes its namespace rule); errors name the offending entry.
func ParseNamespaces(s string, valid func(string) bool) ([]Namespace, error) {
	var out []Namespace
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		fields := strings.Split(part, ":")
		ns := Namespace{Name: fields[0], Weight: 1, TaskQueues: 1}
		if ns.Name == "" || (valid != nil && !valid(ns.Name)) {
			return nil, fmt.Errorf("namespace %q: is not a valid namespace name", ns.Name)
		}
		var err error
		if len(fields) > 1 {
			if ns.Weight, err = strconv.Atoi(fields[1]); err != nil || ns.Weight < 1 {
				return nil, fmt.Errorf("namespace %q: weight %q is not a positive integer", ns.Name, fields[1])
			}
		}
		if len(fields) > 2 {
			if ns.TaskQueues, err = strconv.Atoi(fields[2]); err != nil || ns.TaskQueues < 1 {
				return nil, fmt.Errorf("namespace %q: task queue count %q is not a positive integer", ns.Name, fields[2])
			}
		}
		if len(fields) > 3 {
			return nil, fmt.Errorf("namespace %q: want name:weight[:taskqueues]", part)
		}
		out = append(out, ns)
	}
	return out, nil
}
