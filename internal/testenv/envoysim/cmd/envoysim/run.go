package main

import (
	"context"
	"io"

	"github.com/draind/draind/internal/testenv/envoysim"
)

// run is the program: see envoysim.Run.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return envoysim.Run(ctx, args, stdout, stderr)
}
