package envoysim_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/draind/draind/internal/testenv/envoysim"
)

func startSim(t *testing.T, cfg envoysim.Config) *envoysim.Sim {
	t.Helper()
	s, err := envoysim.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

// echoServer is a TCP upstream that echoes.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() { defer wg.Done(); io.Copy(c, c); c.Close() }()
		}
	}()
	return ln.Addr().String()
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// dialEcho opens a proxied connection and proves it works end to end.
func dialEcho(t *testing.T, addr string) net.Conn {
	t.Helper()
	c := dial(t, addr)
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through %s: %q, %v", addr, buf, err)
	}
	c.SetReadDeadline(time.Time{})
	return c
}

// refused tells whether a new connection to addr is refused.
func refused(addr string) bool {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return true
	}
	c.Close()
	return false
}

// httpConn is a raw HTTP/1.1 client connection, to see exactly what the
// proxy does with keep-alive and Connection: close.
type httpConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialHTTP(t *testing.T, addr string) *httpConn {
	c := dial(t, addr)
	return &httpConn{t: t, c: c, r: bufio.NewReader(c)}
}

func (h *httpConn) send(path string) {
	h.t.Helper()
	if _, err := io.WriteString(h.c, "GET "+path+" HTTP/1.1\r\nHost: app\r\n\r\n"); err != nil {
		h.t.Fatal(err)
	}
}

// read reads one response and its body.
func (h *httpConn) read() (*http.Response, string) {
	h.t.Helper()
	h.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer h.c.SetReadDeadline(time.Time{})
	resp, err := http.ReadResponse(h.r, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		h.t.Fatal(err)
	}
	return resp, string(b)
}

func (h *httpConn) get(path string) (*http.Response, string) {
	h.t.Helper()
	h.send(path)
	return h.read()
}

// closedByPeer tells whether the server closed the connection.
func (h *httpConn) closedByPeer() bool {
	h.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	defer h.c.SetReadDeadline(time.Time{})
	_, err := h.r.ReadByte()
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || err != nil && !isTimeout(err)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// closes tells whether an HTTP/1.1 response carried Connection: close
// (http.ReadResponse turns the header into resp.Close and removes it).
func closes(resp *http.Response) bool {
	return resp.ProtoAtLeast(1, 1) && resp.Close
}

// eventually polls f until it returns nil, for up to 10 s.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// adminGet fetches an admin path.
func adminGet(t *testing.T, s *envoysim.Sim, path string) (int, string) {
	t.Helper()
	return adminDo(t, s, "GET", path)
}

func adminDo(t *testing.T, s *envoysim.Sim, method, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+s.AdminAddr()+path, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// upstream is an HTTP upstream with a /slow endpoint that answers only
// when released, and a /fast one.
type upstream struct {
	addr    string
	arrived chan struct{}
	release chan struct{}
}

func newUpstream(t *testing.T) *upstream {
	t.Helper()
	u := &upstream{arrived: make(chan struct{}, 16), release: make(chan struct{})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			u.arrived <- struct{}{}
			select {
			case <-u.release:
			case <-r.Context().Done():
				return
			}
			io.WriteString(w, "slow done")
			return
		}
		io.WriteString(w, "fast")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	u.addr = ln.Addr().String()
	return u
}
