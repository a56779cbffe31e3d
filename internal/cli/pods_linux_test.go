package cli

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"testing"
	"time"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/namespace"
	"github.com/draind/draind/internal/testenv/testutil"
)

// TestReadPodStateInNamespace reads /debug/state from a server that
// listens on loopback only inside a network namespace, from this
// process's own namespace: the connection must be made inside the pod's.
// A server that accepts nothing (the kernel completes the handshake, as
// for a draind that was SIGSTOPped) costs the timeout and no more; a
// closed port is refused at once.
func TestReadPodStateInNamespace(t *testing.T) {
	tns := testutil.NewNetNS(t)
	ns, err := namespace.Open(tns.Path())
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	var ln, hung net.Listener
	tns.Do(t, func() {
		if ln, err = net.Listen("tcp4", "127.0.0.1:15020"); err == nil {
			hung, err = net.Listen("tcp4", "127.0.0.1:15021")
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer hung.Close()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/debug/state" {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(agent.PodState{Version: agent.PodStateVersion, Phase: "gating", Trigger: "SIGTERM",
			Holds: []agent.PodHold{{Kind: "app-flows", What: "1 inbound flow"}}})
	})}
	go srv.Serve(ln)
	defer srv.Close()

	// From here, nothing listens on 127.0.0.1:15020.
	if c, err := net.DialTimeout("tcp4", "127.0.0.1:15020", 200*time.Millisecond); err == nil {
		c.Close()
		t.Skip("something listens on 127.0.0.1:15020 in this namespace too: the test would prove nothing")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := readPodState(ctx, ns, "127.0.0.1:15020")
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != "gating" || st.Trigger != "SIGTERM" || len(st.Holds) != 1 || st.Holds[0].Kind != "app-flows" {
		t.Errorf("state %+v", st)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	t0 := time.Now()
	_, err = readPodState(ctx, ns, "127.0.0.1:15021")
	if took := time.Since(t0); !errors.Is(err, context.DeadlineExceeded) || took > time.Second {
		t.Errorf("a server that never answers: %v after %s, want the deadline after 300ms", err, took)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := readPodState(ctx, ns, "127.0.0.1:15029"); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("a closed port: %v, want ECONNREFUSED", err)
	}

	// Connects never stall (a connect raced with the poller once hung one
	// dial in thirty).
	for i := range 200 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		c, err := dialIn(ctx, ns, netip.MustParseAddrPort("127.0.0.1:15021"))
		cancel()
		if err != nil {
			t.Fatalf("dial %d: %v", i, err)
		}
		c.Close()
	}

	// The same through dialIn directly, with an IPv6 loopback address:
	// no listener there, refused inside the namespace too.
	if _, err := dialIn(ctx, ns, netip.MustParseAddrPort("[::1]:15020")); err == nil {
		t.Error("[::1]:15020: connected, want an error")
	}
}
