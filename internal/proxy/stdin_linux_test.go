package proxy

import (
	"io"
	"os"
	"strings"
	"testing"
)

// The proxy's stdin is /dev/null: with fd 0 closed, the first file or
// socket it opens becomes its stdin (issue 43). The shell reads where its
// own fd 0 points.
func TestProxyStdinIsDevNull(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	p, err := Start([]string{"/bin/sh", "-c", `readlink /proc/$$/fd/0 || echo "fd 0 closed"`}, Options{Stdout: w, Stderr: w})
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := io.ReadAll(r)
	<-p.Exited()
	if got := strings.TrimSpace(string(out)); got != os.DevNull {
		t.Errorf("the proxy's stdin: %q, want %s", got, os.DevNull)
	}
}
