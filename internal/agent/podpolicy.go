package agent

import (
	"slices"
	"time"

	"github.com/draind/draind/internal/flows"
)

// PodPolicy is who owns what in a pod draind runs in: the one statement of
// it that `draind run`, prestop, conns and watch attribute sockets by. The
// proxy's sockets are its uid's and its ports'; draind's status server is
// served from the proxy's container, so its port is the proxy's; the admin
// API and the status server are the pod's control traffic, with Envoy's
// own status and metrics listeners (--exclude-ports), never the app's or
// the proxy's flows.
type PodPolicy struct {
	ProxyUID   uint32
	ProxyPorts []uint16
	// AdminPort is Envoy's admin API, StatusPort draind run's status
	// server (0: none).
	AdminPort, StatusPort uint16
	// ProxyLoopbackPorts are more ports served on loopback from the
	// proxy's container that draind calls (pilot-agent's status port).
	ProxyLoopbackPorts []uint16
	ExcludePorts       []uint16
	IdleTimeout        time.Duration
}

// SetAddrs sets AdminPort and StatusPort from --admin-addr and
// --status-addr (an empty address: none).
func (p *PodPolicy) SetAddrs(adminAddr, statusAddr string) error {
	for _, a := range []struct {
		addr string
		port *uint16
	}{{adminAddr, &p.AdminPort}, {statusAddr, &p.StatusPort}} {
		if a.addr == "" {
			continue
		}
		_, port, err := SplitHostPort(a.addr)
		if err != nil {
			return err
		}
		*a.port = port
	}
	return nil
}

// ControlPorts are the local ports whose connections are control traffic:
// --exclude-ports, the admin API and the status server.
func (p *PodPolicy) ControlPorts() []uint16 {
	return appendNonZero(slices.Clone(p.ExcludePorts), p.AdminPort, p.StatusPort)
}

// Flows is the policy as the tracker and the classifier take it.
func (p *PodPolicy) Flows() flows.Policy {
	return flows.Policy{
		ProxyUID:         p.ProxyUID,
		ProxyPorts:       appendNonZero(slices.Clone(p.ProxyPorts), p.StatusPort),
		ProxyRemotePorts: append(appendNonZero(nil, p.AdminPort, p.StatusPort), p.ProxyLoopbackPorts...),
		ControlPorts:     p.ControlPorts(),
		IdleTimeout:      p.IdleTimeout,
	}
}

func appendNonZero(ports []uint16, more ...uint16) []uint16 {
	for _, p := range more {
		if p != 0 {
			ports = append(ports, p)
		}
	}
	return ports
}
