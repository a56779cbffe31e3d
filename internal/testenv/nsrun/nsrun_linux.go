// Package nsrun runs a function on an OS thread switched into a network
// namespace. Sockets it creates stay in that namespace; processes it starts
// (os/exec) are born there. The caller's thread never changes namespace.
//
// It serves the tests, the demo and the benchmarks; the product opens its
// netlink sockets in a target namespace directly (sockdiag.Dial).
package nsrun

import (
	"context"
	"errors"
	"net"
	"runtime"

	"github.com/vishvananda/netns"
)

// ErrGoexit is returned when fn ended its goroutine (runtime.Goexit, as
// t.Fatal does) instead of returning.
var ErrGoexit = errors.New("function called runtime.Goexit inside the namespace")

// Do runs fn on a fresh thread inside ns and returns its error. If the
// thread cannot be switched back, it is left locked so the runtime retires
// it rather than reuse it in the wrong namespace.
func Do(ns netns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		sent := false
		send := func(err error) { errc <- err; sent = true }
		defer func() {
			if !sent { // fn called runtime.Goexit (t.Fatal): the thread stays locked and dies
				errc <- ErrGoexit
			}
		}()
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			send(err)
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			send(err)
			return
		}
		err = fn()
		if netns.Set(orig) == nil {
			runtime.UnlockOSThread()
		}
		send(err)
	}()
	return <-errc
}

// Dialer returns a DialContext that connects from inside ns.
func Dialer(ns netns.NsHandle) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = Do(ns, func() error {
			c, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}
