package settings

import (
	"strings"
)

// RouteTarget is one route's own delivery target, as stored (URL template
// unredacted: the API layer redacts before answering).
type RouteTarget struct {
	Namespace, TaskQueue string
	TargetSettings
	// UpdatedBy is the node that last wrote it.
	UpdatedBy string
}

// Targets lists the routes that have a target of their own, sorted by
// (namespace, task_queue). Routes served by the node default are not
// listed (see DefaultTarget).
func (s *Settings) Targets() []RouteTarget {
	var out []RouteTarget
	for _, e := range s.kv.List(prefixTarget) {
		ns, tq, ok := strings.Cut(strings.TrimPrefix(e.Key, prefixTarget), "/")
		if !ok {
			continue
		}
		t, ok := lookupJSON[TargetSettings](s, e.Key)
		if !ok {
			continue
		}
		out = append(out, RouteTarget{Namespace: ns, TaskQueue: tq, TargetSettings: t, UpdatedBy: e.Version.Node})
	}
	return out
}

// DefaultTarget returns the node's --default-target URL template ("" if
// none).
func (s *Settings) DefaultTarget() string { return s.defaultTarget }

// OwnTarget returns the route's own target (not the node default).
func (s *Settings) OwnTarget(ns, tq string) (TargetSettings, bool) {
	t, ok := lookupJSON[TargetSettings](s, targetKey(ns, tq))
	return t, ok && t.URL != ""
}

// Hold is one held workflow.
type Hold struct {
	WorkflowID string
	// HeldBy is the node that wrote the hold.
	HeldBy string
}

// Holds lists the held workflows, sorted by workflow_id.
func (s *Settings) Holds() []Hold {
	entries := s.kv.List(PrefixHold)
	out := make([]Hold, 0, len(entries))
	for _, e := range entries {
		out = append(out, Hold{WorkflowID: strings.TrimPrefix(e.Key, PrefixHold), HeldBy: e.Version.Node})
	}
	return out
}
