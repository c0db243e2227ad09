package webhook_test

import (
	"os"
	"strings"
	"testing"
)

// TestREADMETargetCompiles: the README's target verifying signatures is
// the main of webhook/examples/target, which go vet and go build compile,
// so the README cannot show code that does not build.
func TestREADMETargetCompiles(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("examples/target/main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n### Signed deliveries and target headers\n")
	_, block, ok2 := strings.Cut(section, "```go\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal(`README.md has no "### Signed deliveries and target headers" section with a go code block`)
	}
	i := strings.Index(string(src), "func main() {")
	if i < 0 {
		t.Fatal("examples/target/main.go has no func main")
	}
	if got, want := strings.TrimSpace(block), strings.TrimSpace(string(src[i:])); got != want {
		t.Errorf("README's target differs from webhook/examples/target/main.go; copy one into the other.\nREADME:\n%s\nfile:\n%s", got, want)
	}
}
