package main

import (
	"fmt"
	"io"
)

func demo(args, environ []string, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "demo: not built yet")
	return 1
}
