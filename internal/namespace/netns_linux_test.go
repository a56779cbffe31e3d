package namespace

import (
	"errors"
	"strings"
	"testing"
)

func TestOpenErrors(t *testing.T) {
	tests := []struct {
		name string
		open func() (*Net, error)
		want string
	}{
		{"missing path", func() (*Net, error) { return Open("/run/netns/does-not-exist") }, "netns /run/netns/does-not-exist: no such file or directory"},
		{"not a namespace", func() (*Net, error) { return Open("/etc/hostname") }, "not a namespace file"},
		{"gone pid", func() (*Net, error) { return ByPID(1 << 30) }, "pid 1073741824: no such process"},
		{"bad pid", func() (*Net, error) { return ByPID(-1) }, "not a valid pid"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := tt.open()
			if err == nil {
				h.Close()
				t.Fatal("no error")
			}
			var nse *Error
			if !errors.As(err, &nse) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %q (%T), want a *Error containing %q", err, err, tt.want)
			}
		})
	}
	if _, err := ByPID(1 << 30); !errors.Is(err, ErrProcessGone) {
		t.Errorf("gone pid: %v, want ErrProcessGone", err)
	}
}

func TestCurrent(t *testing.T) {
	h, err := Current()
	if err != nil {
		t.Fatal(err)
	}
	if h.Inode() == 0 || h.Name() != "current netns" {
		t.Errorf("inode %d name %q", h.Inode(), h.Name())
	}
	if !h.HoldsThread() {
		t.Errorf("the calling thread is not in its own process's namespace")
	}
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if err := h.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, err := SelfPID(); err != nil {
		t.Fatal(err)
	}
}
