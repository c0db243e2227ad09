package chaos

import (
	"cmp"
	"fmt"
	"time"
)

// A graceful stop (SIGTERM) is a leave: the node keeps serving and handing
// off until every row it holds is held by its shard's replica set, then
// exits 0, however long past --shutdown-grace that takes; only a second
// SIGTERM cuts it short (exit 1, the rows stay on its disk). The harness
// waits for the exit as an operator would, while the leave makes progress.
const (
	// shutdownGrace is the --shutdown-grace every node runs with.
	shutdownGrace = 20 * time.Second
	// leaveStall is how long a leave may go without progress (its
	// replication.leave.shards_left falling) before the harness gives up
	// waiting. The SIGTERM counts as progress, so every leave gets at least
	// this long.
	leaveStall = 60 * time.Second
	// leaveLimit bounds a graceful stop in all, progress or not.
	leaveLimit = 5 * time.Minute
	// leaveCutShort is how long the harness waits for the exit after the
	// second SIGTERM before it sends SIGKILL.
	leaveCutShort = 15 * time.Second
	// leavePoll is how often a leaving node's /v1/cluster is read.
	leavePoll = time.Second
)

// leaveStatus is replication.leave of a leaving node's GET /v1/cluster.
type leaveStatus struct {
	ShardsLeft    int    `json:"shards_left"`
	RowsHandedOff int64  `json:"rows_handed_off"`
	LastError     string `json:"last_error"`
	StrandedRows  int    `json:"stranded_rows"`
}

func (s leaveStatus) String() string {
	e := s.LastError
	e = cmp.Or(e, "none")
	return fmt.Sprintf("shards_left %d, rows_handed_off %d, stranded_rows %d, last_error: %s", s.ShardsLeft, s.RowsHandedOff, s.StrandedRows, e)
}

// leaveWatch applies the wait rule to the polls of one graceful stop, all
// on the clock of the SIGTERM (offsets from it): keep waiting while the
// grace has not passed, or within the last stall shards_left fell below
// its lowest value so far or rows_handed_off rose above its highest (a
// pass handing off many rows ends long after its first batch); give up
// after a stall without progress, or after the limit in all. A poll the
// node did not answer, or answered with no leave in progress, is no
// progress.
type leaveWatch struct {
	grace, stall, limit time.Duration

	handed   int64         // highest rows_handed_off seen
	lowest   int           // lowest shards_left seen; -1: none yet
	progress time.Duration // the last progress (the SIGTERM at 0)
	last     leaveStatus   // the last status read
	seen     bool          // whether any poll returned a status
}

func newLeaveWatch(grace, stall, limit time.Duration) *leaveWatch {
	return &leaveWatch{grace: grace, stall: stall, limit: limit, lowest: -1}
}

// observe records a poll at offset at; ok is false when the node did not
// answer or reported no leave.
func (w *leaveWatch) observe(at time.Duration, st leaveStatus, ok bool) {
	if !ok {
		return
	}
	w.last, w.seen = st, true
	if st.RowsHandedOff > w.handed {
		w.handed, w.progress = st.RowsHandedOff, at
	}
	if w.lowest < 0 || st.ShardsLeft < w.lowest {
		if w.lowest >= 0 {
			w.progress = at
		}
		w.lowest = st.ShardsLeft
	}
}

// giveUp returns "" while the harness keeps waiting at offset at, else why
// it stops waiting.
func (w *leaveWatch) giveUp(at time.Duration) string {
	switch {
	case at >= w.limit:
		return fmt.Sprintf("still leaving after %v in all (%s)", w.limit, w.status())
	case at < w.grace:
		return ""
	case at-w.progress >= w.stall:
		return fmt.Sprintf("no hand-off progress for %v (%s)", w.stall, w.status())
	}
	return ""
}

// status is the last leave status read, for the timeline.
func (w *leaveWatch) status() string {
	if !w.seen {
		return "no leave status read"
	}
	return w.last.String()
}
