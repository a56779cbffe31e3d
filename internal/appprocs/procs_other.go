//go:build !linux

package appprocs

import "errors"

// ProcTracker follows the app's processes; Linux only (see procs_linux.go).
type ProcTracker struct{}

var _ AppProcSource = (*ProcTracker)(nil)

func errProcsUnsupported() error {
	return &ProcUnavailableError{Reason: "not supported on this OS", Err: errors.ErrUnsupported}
}

// OpenProcTracker is Linux only: it returns a *ProcUnavailableError.
func OpenProcTracker(netnsInode uint64, rules AppProcRules, opts ...ProcOption) (*ProcTracker, error) {
	return nil, errProcsUnsupported()
}

// OpenProcPoller is Linux only: it returns a *ProcUnavailableError.
func OpenProcPoller(netnsInode uint64, rules AppProcRules, opts ...ProcOption) (*ProcTracker, error) {
	return nil, errProcsUnsupported()
}

// OpenAppProcSource is Linux only: it returns a *ProcUnavailableError.
func OpenAppProcSource(netnsInode uint64, rules AppProcRules, mode ProcMode, opts ...ProcOption) (*ProcTracker, string, error) {
	return nil, "", errProcsUnsupported()
}

func (t *ProcTracker) AppProcs() []Process     { return nil }
func (t *ProcTracker) Count() int              { return 0 }
func (t *ProcTracker) Notify() <-chan struct{} { return nil }
func (t *ProcTracker) Lost() uint64            { return 0 }
func (t *ProcTracker) Source() string          { return "" }
func (t *ProcTracker) Err() error              { return errProcsUnsupported() }
func (t *ProcTracker) Coverage() ProcCoverage {
	return ProcCoverage{Reason: "not supported on this OS"}
}
func (t *ProcTracker) Complete() bool       { return false }
func (t *ProcTracker) AppExits() []ProcExit { return nil }
func (t *ProcTracker) HostNetNS() (uint64, bool) {
	return 0, false
}
func (t *ProcTracker) Close() error { return nil }
