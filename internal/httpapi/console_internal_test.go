package httpapi

import (
	"slices"
	"testing"

	"github.com/fairshard/fairshard/api"
)

func TestRedactURL(t *testing.T) {
	cases := map[string]string{
		"": "",
		"https://hooks.example.com/{namespace}/{task_queue}": "https://hooks.example.com/{namespace}/{task_queue}",
		"https://user:s3cret@h.example/x":                    "https://user:REDACTED@h.example/x",
		"https://user@h.example/x":                           "https://user@h.example/x",
		"http://h/x?token=abc&page=2":                        "http://h/x?page=2&token=REDACTED",
		"http://h/x?API_Key=abc&sig=1&X-Amz-Signature=2":     "http://h/x?API_Key=REDACTED&X-Amz-Signature=REDACTED&sig=REDACTED",
		"http://h/x?code=1&client_secret=2&auth=3":           "http://h/x?auth=REDACTED&client_secret=REDACTED&code=REDACTED",
		"http://[::1%zz/":                                    "REDACTED",
	}
	for in, want := range cases {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func views(keys ...string) []api.Row {
	out := make([]api.Row, len(keys))
	for i, k := range keys {
		out[i] = api.Row{DispatchKey: k}
	}
	return out
}

func keysOfViews(vs []api.Row) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.DispatchKey
	}
	return out
}

// TestMergeRowPages: a merged page never skips a row a node has not
// examined yet, and never repeats one.
func TestMergeRowPages(t *testing.T) {
	cases := []struct {
		name     string
		pages    []api.RowPage
		limit    int
		want     []string
		wantNext string
	}{
		{"all complete, fits", []api.RowPage{{Rows: views("a", "c")}, {Rows: views("b")}}, 5, []string{"a", "b", "c"}, ""},
		{"all complete, more than the limit", []api.RowPage{{Rows: views("a", "c")}, {Rows: views("b", "d")}}, 3, []string{"a", "b", "c"}, "c"},
		{"a node's scan stopped early: cut there", []api.RowPage{{Rows: views("a", "x"), Next: ""}, {Rows: views("b"), Next: "m"}}, 5, []string{"a", "b"}, "m"},
		{"a full node page: cut at its last row", []api.RowPage{{Rows: views("a", "b"), Next: "b"}, {Rows: views("c")}}, 2, []string{"a", "b"}, "b"},
		{"nothing yet, cursor moves", []api.RowPage{{Next: "k"}, {}}, 5, []string{}, "k"},
		{"duplicates (copies on two nodes) once", []api.RowPage{{Rows: views("a", "b")}, {Rows: views("b")}}, 5, []string{"a", "b"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := mergeRowPages(tc.pages, tc.limit)
			if !slices.Equal(keysOfViews(got.Rows), tc.want) || got.Next != tc.wantNext {
				t.Fatalf("merged %v next %q, want %v next %q", keysOfViews(got.Rows), got.Next, tc.want, tc.wantNext)
			}
		})
	}
	// Paging through three nodes' rows with scan budgets returns every row
	// once, in order.
	nodes := [][]string{{"a", "d", "g", "j"}, {"b", "e", "h"}, {"c", "f", "i", "k", "l"}}
	page := func(rows []string, after string, limit, budget int) api.RowPage {
		var p api.RowPage
		scanned := 0
		for i, k := range rows {
			if k <= after {
				continue
			}
			if scanned == budget {
				return p
			}
			scanned++
			p.Next = k
			p.Rows = append(p.Rows, api.Row{DispatchKey: k})
			if len(p.Rows) == limit {
				if i == len(rows)-1 {
					p.Next = ""
				}
				return p
			}
		}
		p.Next = ""
		return p
	}
	var seen []string
	after := ""
	for range 50 {
		var pages []api.RowPage
		for i, rows := range nodes {
			pages = append(pages, page(rows, after, 2, i+1))
		}
		m := mergeRowPages(pages, 2)
		seen = append(seen, keysOfViews(m.Rows)...)
		if m.Next == "" {
			break
		}
		after = m.Next
	}
	if want := []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"}; !slices.Equal(seen, want) {
		t.Fatalf("paged %v, want %v", seen, want)
	}
}
