package flows

import (
	"os"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf/btf"

	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/probes"
	"github.com/draind/draind/internal/testenv/testutil"
)

// TestStartupParts times, in this process, the parts of a tracker's start
// that `draind run` waits for before it starts the proxy: decoding the
// kernel's BTF, loading and verifying the tcpstate object and attaching
// it (with its own BTF decode, and with a shared warm cache), the first
// sock_diag snapshot, and the whole OpenTracker. It measures and asserts
// nothing; set DRAIND_STARTUP_PARTS=1 (docs/benchmarks.md, "Start-up"; in
// VMs: DRAIND_STARTUP_PARTS=1 bash tools/vmtest/vmtest.sh -v --run
// TestStartupParts ./internal/flows).
func TestStartupParts(t *testing.T) {
	if os.Getenv("DRAIND_STARTUP_PARTS") == "" {
		t.Skip("a measurement: set DRAIND_STARTUP_PARTS=1")
	}
	testutil.RequireRoot(t)
	testutil.RequireBTF(t)
	ns := testutil.NewNetNS(t)
	h, err := namespace.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	warm := btf.NewCache()
	if _, err := warm.Kernel(); err != nil {
		t.Fatal(err)
	}
	const rounds = 7
	parts := []struct {
		name string
		fn   func() error
	}{
		{"kernel BTF decode (btf.Cache.Kernel)", func() error { _, err := btf.NewCache().Kernel(); return err }},
		{"tcpstate load+verify+attach, own BTF decode", func() error {
			p, err := probes.OpenTCPState(h.Inode(), probes.TCPStateOptions{})
			if err == nil {
				p.Close()
			}
			return err
		}},
		{"tcpstate load+verify+attach, shared BTF cache", func() error {
			p, err := probes.OpenTCPState(h.Inode(), probes.TCPStateOptions{BTFCache: warm})
			if err == nil {
				p.Close()
			}
			return err
		}},
		{"first snapshot (OpenTracker, sockdiag mode)", func() error {
			tr, err := OpenTracker(h, TrackerConfig{Mode: ModeSockDiag})
			if err == nil {
				tr.Close()
			}
			return err
		}},
		{"OpenTracker, eBPF mode, shared BTF cache", func() error {
			tr, err := OpenTracker(h, TrackerConfig{Mode: ModeEBPF, BTFCache: warm})
			if err == nil {
				tr.Close()
			}
			return err
		}},
		{"OpenTracker, eBPF mode, own BTF decode", func() error {
			tr, err := OpenTracker(h, TrackerConfig{Mode: ModeEBPF})
			if err == nil {
				tr.Close()
			}
			return err
		}},
	}
	t.Logf("kernel %s, median (min–max) of %d", probes.KernelRelease(), rounds)
	for _, p := range parts {
		var ds []time.Duration
		for range rounds {
			start := time.Now()
			if err := p.fn(); err != nil {
				t.Fatalf("%s: %v", p.name, err)
			}
			ds = append(ds, time.Since(start))
		}
		slices.Sort(ds)
		t.Logf("%-50s %7.2f ms (%.2f–%.2f)", p.name, ms(ds[rounds/2]), ms(ds[0]), ms(ds[rounds-1]))
	}
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
