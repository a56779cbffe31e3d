package agent

import (
	"reflect"
	"testing"

	"github.com/draind/draind/internal/envoy"
	"github.com/draind/draind/internal/flows"
)

// The pod's policy as the tracker takes it: the status port is the
// proxy's; the admin API and the status server are control traffic, with
// --exclude-ports; an address not given adds no port.
func TestPodPolicyFlows(t *testing.T) {
	defaultExclude := envoy.DefaultExclude().Ports
	p := PodPolicy{ProxyUID: 1337, ProxyPorts: []uint16{9000}, ExcludePorts: defaultExclude}
	if err := p.SetAddrs(DefaultAdminAddr, ":15022"); err != nil {
		t.Fatal(err)
	}
	p.ProxyLoopbackPorts = []uint16{15020}
	want := flows.Policy{ProxyUID: 1337, ProxyPorts: []uint16{9000, 15022}, ProxyRemotePorts: []uint16{15000, 15022, 15020},
		ControlPorts: []uint16{15020, 15021, 15090, 15000, 15022}}
	if got := p.Flows(); !reflect.DeepEqual(got, want) {
		t.Errorf("policy %+v, want %+v", got, want)
	}
	if p.ProxyPorts[0] != 9000 || len(p.ProxyPorts) != 1 || len(defaultExclude) != 3 {
		t.Errorf("Flows changed its inputs: %v %v", p.ProxyPorts, defaultExclude)
	}
	var none PodPolicy
	if err := none.SetAddrs("", ""); err != nil {
		t.Fatal(err)
	}
	if got := none.Flows(); len(got.ProxyPorts)+len(got.ProxyRemotePorts)+len(got.ControlPorts) != 0 {
		t.Errorf("no addresses: %+v", got)
	}
	if err := none.SetAddrs("nonsense", ""); err == nil {
		t.Error("SetAddrs took an address without a port")
	}
}
