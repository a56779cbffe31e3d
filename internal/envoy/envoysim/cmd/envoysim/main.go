// Command envoysim runs the Envoy stand-in as a process: a TEST PART for
// draind's tests (see package envoysim and docs/envoysim.md).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
)

func main() {
	err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
	var ec interface{ ExitCode() int }
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.As(err, &ec):
		os.Exit(ec.ExitCode())
	default:
		fmt.Fprintln(os.Stderr, "envoysim:", err)
		os.Exit(1)
	}
}
