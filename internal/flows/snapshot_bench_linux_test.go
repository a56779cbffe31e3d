package flows

import (
	"fmt"
	"net"
	"testing"

	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/testenv/testutil"
)

// benchNamespace returns a namespace holding n established loopback
// connections (2n sockets) and a listener.
func benchNamespace(b testing.TB, n int) *sockdiag.Conn {
	ns := testutil.NewNetNS(b)
	var ln net.Listener
	var err error
	ns.Do(b, func() { ln, err = net.Listen("tcp4", "127.0.0.1:9000") })
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			b.Cleanup(func() { c.Close() })
		}
	}()
	ns.Do(b, func() {
		for range n {
			c, e := net.Dial("tcp4", "127.0.0.1:9000")
			if e != nil {
				err = e
				return
			}
			b.Cleanup(func() { c.Close() })
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	return dialNS(b, ns)
}

// BenchmarkSnapshot measures the listener check, the full dump, the
// attribution separately, at 5000 connections (the benchmark tool
// compares whole processes at 1k–100k: docs/benchmarks.md).
func BenchmarkSnapshot(b *testing.B) {
	const n = 5000
	d := benchNamespace(b, n)
	socks, err := d.Sockets(sockdiag.AllStates)
	if err != nil || len(socks) < 2*n {
		b.Fatalf("%d sockets, %v", len(socks), err)
	}
	kept := append([]sockdiag.Socket(nil), socks...)
	b.Run("listeners", func(b *testing.B) {
		for b.Loop() {
			if _, err := d.Sockets(sockdiag.ListenMask); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run(fmt.Sprintf("dump-%d", len(kept)), func(b *testing.B) {
		for b.Loop() {
			if _, err := d.Sockets(sockdiag.AllStates); err != nil {
				b.Fatal(err)
			}
		}
	})
	c := NewClassifier(DefaultPolicy())
	b.Run("classify", func(b *testing.B) {
		for b.Loop() {
			c.Classify(kept)
		}
	})
}
