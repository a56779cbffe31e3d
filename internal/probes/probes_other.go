//go:build !linux

package probes

import "time"

// TCPState is the Linux eBPF probe; elsewhere it cannot be opened.
type TCPState struct{}

// OpenTCPState always fails outside Linux with an *UnavailableError.
func OpenTCPState(netnsInode uint64, opts TCPStateOptions) (*TCPState, error) {
	return nil, &UnavailableError{Reason: "eBPF is not supported on this OS", Err: ErrUnsupportedOS}
}

// ReadEvent never succeeds outside Linux.
func (p *TCPState) ReadEvent(ev *TCPEvent) error { return ErrUnsupportedOS }

// SetDeadline does nothing outside Linux.
func (p *TCPState) SetDeadline(t time.Time) {}

// Lost is 0 outside Linux.
func (p *TCPState) Lost() uint64 { return 0 }

// UsesCookie is false outside Linux.
func (p *TCPState) UsesCookie() bool { return false }

// Close does nothing outside Linux.
func (p *TCPState) Close() error { return nil }

// Procs is the Linux eBPF process probe; elsewhere it cannot be opened.
type Procs struct{}

// OpenProcs always fails outside Linux with an *UnavailableError.
func OpenProcs(netnsInode uint64, opts ProcOptions) (*Procs, error) {
	return nil, &UnavailableError{Reason: "eBPF is not supported on this OS", Err: ErrUnsupportedOS}
}

// PIDNS is 0 outside Linux.
func (p *Procs) PIDNS() uint64 { return 0 }

// Snapshot never succeeds outside Linux.
func (p *Procs) Snapshot() (ProcSnapshot, error) { return ProcSnapshot{}, ErrUnsupportedOS }

// ReadEvent never succeeds outside Linux.
func (p *Procs) ReadEvent(ev *ProcEvent) error { return ErrUnsupportedOS }

// SetDeadline does nothing outside Linux.
func (p *Procs) SetDeadline(t time.Time) {}

// Lost is 0 outside Linux.
func (p *Procs) Lost() uint64 { return 0 }

// Close does nothing outside Linux.
func (p *Procs) Close() error { return nil }

// Attach never succeeds outside Linux.
func (p *TCPState) Attach() error { return ErrUnsupportedOS }

// Scope is empty outside Linux.
func (p *TCPState) Scope() (TCPScope, string) { return "", "" }
