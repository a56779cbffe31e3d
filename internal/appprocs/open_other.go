//go:build !linux

package appprocs

import "errors"

// Both backends are Linux only: elsewhere Open returns an
// *UnavailableError.

func openEBPF(netnsInode uint64, rules Rules, o options) (Source, error) {
	return nil, errUnsupported()
}

func openProc(netnsInode uint64, rules Rules, o options) (Source, error) {
	return nil, errUnsupported()
}

func errUnsupported() error {
	return &UnavailableError{Reason: "not supported on this OS", Err: errors.ErrUnsupported}
}
