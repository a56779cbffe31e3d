// Command draind owns a sidecar proxy's life in a Kubernetes pod: it starts
// Envoy, serves readiness, and on termination keeps Envoy alive exactly as
// long as the application still needs it. See README.md.
package main

import (
	"context"
	"os"

	"github.com/draind/draind/internal/cli"
)

func main() {
	os.Exit(cli.Main(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
