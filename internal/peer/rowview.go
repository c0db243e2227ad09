package peer

import (
	"time"

	"github.com/fairshard/fairshard/api"
	"github.com/fairshard/fairshard/outbox"
)

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// ViewOf is r as the API shows it, held by node ("" to leave Node out).
func ViewOf(r outbox.Row, node string) api.Row {
	return api.Row{
		DispatchKey: r.DispatchKey, WorkflowID: r.WorkflowID, Ordinal: r.Ordinal,
		Namespace: r.Namespace, TaskQueue: r.TaskQueue, ActivityType: r.ActivityType,
		Payload: r.Payload, ContentType: r.ContentType, Status: api.RowStatus(r.Status), Attempt: r.Attempt,
		VisibleAfter: r.VisibleAfter, ClaimedAt: optTime(r.ClaimedAt), CreatedAt: r.CreatedAt,
		FinishedAt: optTime(r.FinishedAt), LastError: r.LastError, Shard: r.Shard, Node: node,
		Version: &api.RowVersion{Gen: r.Version.Gen, Seq: r.Version.Seq},
	}
}

// ViewsOf is ViewOf of every row.
func ViewsOf(rows []outbox.Row, node string) []api.Row {
	out := make([]api.Row, len(rows))
	for i := range rows {
		out[i] = ViewOf(rows[i], node)
	}
	return out
}

// AttemptsOf is the attempt history h as the API shows it.
func AttemptsOf(h []outbox.Attempt) []api.RowAttempt {
	if h == nil {
		return nil
	}
	out := make([]api.RowAttempt, len(h))
	for i, a := range h {
		out[i] = api.RowAttempt{Attempt: a.Attempt, ClaimedAt: a.ClaimedAt, FinishedAt: a.FinishedAt, DurationMS: a.DurationMS,
			Outcome: string(a.Outcome), StatusCode: a.StatusCode, Error: a.Error}
	}
	return out
}
