package replication_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/fairshard/fairshard/replication"
)

// TestRoutesListsWhatHandlerServes: Routes names every route Handler
// serves (a mounting API lists and authenticates each), and only those.
func TestRoutesListsWhatHandlerServes(t *testing.T) {
	routes := replication.Routes()
	if len(routes) < 8 {
		t.Fatalf("Routes() = %v, want the 8 replication routes", routes)
	}
	mux, ok := replication.Handler(nil, nil, nil).(*http.ServeMux)
	if !ok {
		t.Fatal("Handler is not a ServeMux: check Routes against it another way")
	}
	for _, p := range routes {
		method, path, _ := strings.Cut(p, " ")
		if !strings.HasPrefix(path, replication.PathPrefix) {
			t.Errorf("route %q is outside %s", p, replication.PathPrefix)
		}
		if _, got := mux.Handler(httptest.NewRequest(method, path, nil)); got != p {
			t.Errorf("Handler serves %s %s as %q, want %q", method, path, got, p)
		}
	}
	if _, got := mux.Handler(httptest.NewRequest("POST", replication.PathPrefix+"nope", nil)); got != "" {
		t.Errorf("an unlisted path is served as %q", got)
	}
}
