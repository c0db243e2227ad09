package client_test

import (
	"os"
	"strings"
	"testing"
)

// TestREADMEProducerCompiles: the README's Go producer is the main of
// client/examples/producer, which go vet and go build compile, so the
// README cannot show code that does not build.
func TestREADMEProducerCompiles(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	src, err := os.ReadFile("examples/producer/main.go")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(readme), "\n## Go client\n")
	_, block, ok2 := strings.Cut(section, "```go\n")
	block, _, ok3 := strings.Cut(block, "```")
	if !ok || !ok2 || !ok3 {
		t.Fatal(`README.md has no "## Go client" section with a go code block`)
	}
	i := strings.Index(string(src), "func main() {")
	if i < 0 {
		t.Fatal("examples/producer/main.go has no func main")
	}
	if got, want := strings.TrimSpace(block), strings.TrimSpace(string(src[i:])); got != want {
		t.Errorf("README's Go producer differs from client/examples/producer/main.go; copy one into the other.\nREADME:\n%s\nfile:\n%s", got, want)
	}
	if lines := strings.Count(strings.TrimSpace(block), "\n") - 1; lines > 10 {
		t.Errorf("the README's producer has %d lines in main; keep it about 10", lines)
	}
}
