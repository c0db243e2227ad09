package client_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fairshard/fairshard/client"
)

// benchRows are 100 rows shaped like `fairshard load`'s (≈ 100-byte JSON
// payloads), and cannedAnswer a node's answer to them.
func benchRows() ([]client.Row, []byte) {
	rows := make([]client.Row, 100)
	var res []string
	for i := range rows {
		key := fmt.Sprintf("load-1700000000000000000-%d", i)
		rows[i] = client.Row{DispatchKey: key, Namespace: "noisy", TaskQueue: "q1",
			Payload: json.RawMessage(`{"t":1700000000000000000,"pad":"` + strings.Repeat("x", 60) + `"}`)}
		res = append(res, fmt.Sprintf(`{"dispatch_key":%q,"status":"created","shard":%d,"node":"n1"}`, key, i))
	}
	return rows, []byte(`{"rows":[` + strings.Join(res, ",") + `]}`)
}

// noopNode answers every request with answer, reading the body: it isolates
// the client's own cost (encode, HTTP, decode) from a node's fsync.
func noopNode(b *testing.B, answer []byte) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(answer)
	}))
	b.Cleanup(srv.Close)
	return srv
}

// BenchmarkAppend100 is one client.Append of 100 rows to a no-op node.
func BenchmarkAppend100(b *testing.B) {
	rows, answer := benchRows()
	srv := noopNode(b, answer)
	c, err := client.New(client.Options{Nodes: []string{srv.URL}})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Append(ctx, rows...); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(rows))/b.Elapsed().Seconds(), "rows/s")
}

// BenchmarkRawPost100 is the hand-written path loadgen used before the
// client (one json.Marshal of the batch, http.Post, decode the statuses):
// the baseline for BenchmarkAppend100.
func BenchmarkRawPost100(b *testing.B) {
	type wireRow struct {
		DispatchKey string          `json:"dispatch_key"`
		Namespace   string          `json:"namespace"`
		TaskQueue   string          `json:"task_queue"`
		Payload     json.RawMessage `json:"payload"`
	}
	rows, answer := benchRows()
	srv := noopNode(b, answer)
	hc := &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	defer hc.CloseIdleConnections()
	b.ReportAllocs()
	for b.Loop() {
		wire := make([]wireRow, len(rows))
		for i, r := range rows {
			wire[i] = wireRow{r.DispatchKey, r.Namespace, r.TaskQueue, r.Payload}
		}
		body, _ := json.Marshal(map[string]any{"rows": wire})
		resp, err := hc.Post(srv.URL+"/v1/rows", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var out struct {
			Rows []struct {
				Status string `json:"status"`
			} `json:"rows"`
		}
		if err := json.Unmarshal(data, &out); err != nil || len(out.Rows) != len(rows) {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N*len(rows))/b.Elapsed().Seconds(), "rows/s")
}
