package istio

import (
	"path/filepath"
	"slices"
)

// ProxyKind is what draind's proxy command is (`draind run --proxy`).
type ProxyKind string

// The proxy kinds.
const (
	ProxyAuto       ProxyKind = "auto"
	ProxyEnvoy      ProxyKind = "envoy"
	ProxyPilotAgent ProxyKind = "pilot-agent"
)

// ProxyKinds are the kinds --proxy accepts, validation checks and errors
// name.
var ProxyKinds = []ProxyKind{ProxyAuto, ProxyEnvoy, ProxyPilotAgent}

// Of resolves auto (or unset) for a proxy command: pilot-agent when the
// command is pilot-agent ([IsPilotAgent]), else Envoy. Another kind
// stands as given.
func (k ProxyKind) Of(command []string) ProxyKind {
	if k != ProxyAuto && k != "" {
		return k
	}
	if IsPilotAgent(command) {
		return ProxyPilotAgent
	}
	return ProxyEnvoy
}

// IsPilotAgent tells whether a proxy command is Istio's pilot-agent, by
// its file name.
func IsPilotAgent(command []string) bool {
	return len(command) > 0 && filepath.Base(command[0]) == "pilot-agent"
}

// Ports are the ports Istio's sidecar and control plane use (istio.io,
// "Ports used by Istio"): draind's own status port is never one of them
// when it supervises pilot-agent.
var Ports = []uint16{15000, 15001, 15004, 15006, 15008, 15009, 15010, 15012, 15014, 15017, 15020, 15021, 15053, 15090}

// FirstFreePort is draind's status port next to pilot-agent when nothing
// says otherwise: the first port from here that no Istio setting or
// [Ports] takes.
const FirstFreePort uint16 = 15022

// FreePort is the port draind's status server takes beside pilot-agent:
// the first from [FirstFreePort] that is neither one of [Ports] nor one of
// s's (pilot-agent's status port, Envoy's admin port).
func (s Settings) FreePort() uint16 {
	taken := append(slices.Clone(Ports), s.StatusPort, s.AdminPort)
	p := FirstFreePort
	for slices.Contains(taken, p) {
		p++
	}
	return p
}
