package appprocs

import "github.com/draind/draind/internal/probes"

// The loader steps shared with package probes (until the procs object
// moves there with the rest of the eBPF objects).
func raiseMemlock()                      { probes.RaiseMemlock() }
func unavailableReason(err error) string { return probes.UnavailableReason(err) }
