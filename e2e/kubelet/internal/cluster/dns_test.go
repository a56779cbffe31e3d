package cluster

import (
	"strings"
	"testing"
)

// TestDNSServiceIP: kube-dns takes the Service CIDR's .10, as kubeadm's.
func TestDNSServiceIP(t *testing.T) {
	if got := DefaultConfig().DNSServiceIP(); got != "198.18.128.10" {
		t.Errorf("DNSServiceIP %s, want 198.18.128.10", got)
	}
}

// TestCorefile: CoreDNS serves on the node's address only, every server
// block bound to it (a block without bind would take port 53 of every
// address of the host).
func TestCorefile(t *testing.T) {
	c := &Cluster{Config: DefaultConfig(), NodeIP: "192.0.2.2"}
	cf := c.corefileFor()
	blocks := strings.Count(cf, ":53 {")
	if blocks != 2 || strings.Count(cf, "bind 192.0.2.2\n") != blocks {
		t.Errorf("want 2 server blocks, each bound to the node's address:\n%s", cf)
	}
	if !strings.Contains(cf, "kubeconfig "+c.KubeConfig()+"\n") {
		t.Errorf("the kubernetes plugin without the cluster's kubeconfig:\n%s", cf)
	}
}
