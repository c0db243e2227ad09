package webui

import (
	"regexp"
	"strings"
	"testing"
)

// TestWritesCarryJSONType: the node refuses a /v1 POST, PUT or PATCH
// without Content-Type application/json, body or not (a type a page of
// another site cannot send without a preflight). The console's one fetch
// is inside api(), which sets the type for every method but GET and
// HEAD, and every write goes through api().
func TestWritesCarryJSONType(t *testing.T) {
	b, err := static.ReadFile("static/app.js")
	if err != nil {
		t.Fatal(err)
	}
	js := string(b)
	if n := strings.Count(js, "fetch("); n != 1 {
		t.Fatalf("app.js calls fetch %d times, want once (in api()): check that every write sends Content-Type application/json", n)
	}
	api := js[strings.Index(js, "async function api("):]
	api = api[:strings.Index(api, "\n}\n")]
	if !strings.Contains(api, "fetch(") ||
		!regexp.MustCompile(`if \(method !== "GET" && method !== "HEAD"\) headers\["Content-Type"\] = "application/json";`).MatchString(api) {
		t.Fatalf("api() in app.js must set Content-Type application/json on every write before its fetch:\n%s", api)
	}
	writes := regexp.MustCompile(`api\("(POST|PUT|PATCH|DELETE)"`).FindAllString(js, -1)
	if len(writes) == 0 {
		t.Fatal("found no write through api(): has the console's call shape changed?")
	}
}
