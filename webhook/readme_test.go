package webhook_test

import (
	"os"
	"strings"
	"testing"
)

// TestREADMETargetCompiles: the API guide's target verifying signatures
// (docs/api.md, "Signed deliveries and target headers") is the main of
// webhook/examples/target, which go vet and go build compile, so the
// guide cannot show code that does not build.
func TestREADMETargetCompiles(t *testing.T) {
	guide, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("examples/target/main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(guide), "\n## Signed deliveries and target headers\n")
	_, block, ok2 := strings.Cut(section, "```go\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal(`docs/api.md has no "## Signed deliveries and target headers" section with a go code block`)
	}
	i := strings.Index(string(src), "func main() {")
	if i < 0 {
		t.Fatal("examples/target/main.go has no func main")
	}
	if got, want := strings.TrimSpace(block), strings.TrimSpace(string(src[i:])); got != want {
		t.Errorf("docs/api.md's target differs from webhook/examples/target/main.go; copy one into the other.\ndocs/api.md:\n%s\nfile:\n%s", got, want)
	}
}
