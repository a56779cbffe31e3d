package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/draind/draind/tools/bench/benchns"
)

// TestMain lets the test binary double as the benchmark's children,
// stand-in proxy and node workloads, as the command does.
func TestMain(m *testing.M) {
	benchns.ChildMain()
	if len(os.Args) > 1 && os.Args[1] == "standin" {
		if err := standin(); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	if len(os.Args) > 1 && os.Args[1] == "nodeload" {
		if err := nodeLoad(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "nodeload:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestStartup is `footprint startup` as a test, for kernels in VMs
// (docs/benchmarks.md, "Start-up"): DRAIND_BENCH_BIN names the directory
// holding draind and envoysim (make build), DRAIND_PILOT_AGENT optionally
// pilot-agent. It measures and asserts nothing.
//
//	DRAIND_BENCH_BIN=$PWD/bin bash tools/vmtest/vmtest.sh -v --run TestStartup --kernels "5.10 6.1 6.12" ./tools/bench/footprint
func TestStartup(t *testing.T) {
	dir := os.Getenv("DRAIND_BENCH_BIN")
	if dir == "" {
		t.Skip("a measurement: set DRAIND_BENCH_BIN to the directory of draind and envoysim")
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces)")
	}
	p := proxySetup{draind: filepath.Join(dir, "draind"), envoysim: filepath.Join(dir, "envoysim")}
	var out strings.Builder
	if err := startupTable(context.Background(), &out, p, os.Getenv("DRAIND_PILOT_AGENT"), 5); err != nil {
		t.Fatal(err)
	}
	t.Logf("kernel %s:\n%s", kernelRelease(), out.String())
}

func kernelRelease() string {
	b, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return strings.TrimSpace(string(b))
}
