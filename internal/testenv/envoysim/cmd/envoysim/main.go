// Command envoysim runs the Envoy stand-in as a process: a TEST PART for
// draind's tests (see package envoysim and docs/envoysim.md).
package main

import (
	"context"
	"os"

	"github.com/draind/draind/internal/testenv/envoysim"
)

func main() {
	os.Exit(envoysim.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
