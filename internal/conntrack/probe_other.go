//go:build !linux

package conntrack

import (
	"errors"
	"time"
)

// errProbeOS is the Err of the ProbeUnavailableError OpenProbe returns
// outside Linux.
var errProbeOS = errors.New("the tcpstate eBPF probe needs Linux")

// Probe is the Linux eBPF probe; elsewhere it cannot be opened.
type Probe struct{}

// OpenProbe always fails outside Linux with a *ProbeUnavailableError.
func OpenProbe(netnsInode uint64, opts ProbeOptions) (*Probe, error) {
	return nil, &ProbeUnavailableError{Reason: "eBPF is not supported on this OS", Err: errProbeOS}
}

// ReadEvent never succeeds outside Linux.
func (p *Probe) ReadEvent(ev *Event) error { return errProbeOS }

// SetDeadline does nothing outside Linux.
func (p *Probe) SetDeadline(t time.Time) {}

// Lost is 0 outside Linux.
func (p *Probe) Lost() uint64 { return 0 }

// UsesCookie is false outside Linux.
func (p *Probe) UsesCookie() bool { return false }

// Close does nothing outside Linux.
func (p *Probe) Close() error { return nil }
