package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// freePort is a port nothing listens on now (the kernel's pick, released).
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// With --grpc-port, the app answers the health check SERVING, keeps
// answering through --delay-shutdown after SIGTERM (as its HTTP side
// keeps serving), then stops with its HTTP server: the connection it
// served is closed and no new one is accepted.
func TestGRPCHealthGraceful(t *testing.T) {
	result := filepath.Join(t.TempDir(), "result")
	grpcPort := freePort(t)
	args := []string{"--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--grpc-port", fmt.Sprint(grpcPort),
		"--on-term", "graceful", "--delay-shutdown", "1s", "--result", result}
	code := make(chan int, 1)
	go func() { code <- run(args) }()
	// run takes SIGTERM (signal.Notify) before its "ready" line: only then
	// may this process get one.
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(result)
		if strings.HasPrefix(string(b), "ready ") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no ready line: %q", b)
		}
		time.Sleep(20 * time.Millisecond)
	}

	cc, err := grpc.NewClient(fmt.Sprintf("passthrough:///127.0.0.1:%d", grpcPort), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	check := func() (healthpb.HealthCheckResponse_ServingStatus, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return resp.GetStatus(), err
	}
	if st, err := check(); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("before SIGTERM: %v %v, want SERVING", st, err)
	}

	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // taken; the delay runs 1 s
	if st, err := check(); err != nil || st != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("during --delay-shutdown: %v %v, want SERVING", st, err)
	}
	select {
	case c := <-code:
		if c != 0 {
			t.Errorf("exit code %d", c)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("run did not return 10 s after SIGTERM")
	}
	if st, err := check(); err == nil {
		t.Errorf("after the stop: %v, want an error (connection closed, none accepted)", st)
	}
	b, _ := os.ReadFile(result)
	if !strings.Contains(string(b), "drained ") || strings.Contains(string(b), "grpc serve") {
		t.Errorf("result lines:\n%s", b)
	}
}
