package cluster

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/draind/draind/e2e/kubelet/internal/node"
)

// The cluster's DNS: CoreDNS as a process on the node, as istiod is,
// behind the Service kube-dns in kube-system that kubeadm makes (no
// selector: its EndpointSlice is the node's address). The kubelet gives
// every ClusterFirst pod its ClusterIP as nameserver, so that pods reach
// Services by name, and pilot-agent istiod.istio-system.svc for its
// certificate.
const (
	dnsNamespace = "kube-system"
	dnsService   = "kube-dns"
	// dnsServiceHost is the Service's ClusterIP: this host of the Service
	// CIDR (kubeadm's choice, .10), fixed before any other Service takes
	// an address.
	dnsServiceHost = 10
	// clusterDomain is the kubelet's clusterDomain (package node's).
	clusterDomain     = "cluster.local"
	corednsHealthPort = 12180 // CoreDNS's health plugin, on loopback
	corednsReadyPort  = 12181 // its ready plugin: 200 once the kubernetes plugin has synced
)

// DNSServiceIP is the ClusterIP of the Service kube-dns: the kubelet's
// clusterDNS.
func (c Config) DNSServiceIP() string { return serviceIP(c.ServiceCIDR, dnsServiceHost).String() }

func (c Config) corefile() string { return filepath.Join(c.StateDir, "Corefile") }

// corefileFor is CoreDNS's configuration: kubeadm's for the cluster's
// zones (the kubernetes plugin, reverse zones included, pod records
// unverified), served on the node's address only (port 53 of the host's
// other addresses stays free), and NXDOMAIN at once for every other name.
// The cluster reaches nothing outside this machine, so there is no
// upstream to forward to: a forward to an unreachable one would hold each
// such lookup for seconds.
func (c *Cluster) corefileFor() string {
	return fmt.Sprintf(`%[1]s:53 in-addr.arpa:53 ip6.arpa:53 {
    bind %[2]s
    errors
    health 127.0.0.1:%[3]d
    ready 127.0.0.1:%[4]d
    kubernetes %[1]s in-addr.arpa ip6.arpa {
        kubeconfig %[5]s
        pods insecure
        ttl 30
    }
}
.:53 {
    bind %[2]s
    errors
    template ANY ANY {
        rcode NXDOMAIN
    }
}
`, clusterDomain, c.NodeIP, corednsHealthPort, corednsReadyPort, c.KubeConfig())
}

// dnsObjects are the Service kube-dns, at its fixed ClusterIP, and its
// EndpointSlice: this node's address, port 53 over UDP and TCP.
func (c *Cluster) dnsObjects() string {
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata:
  name: %[1]s
  namespace: %[2]s
  labels: {k8s-app: kube-dns, kubernetes.io/name: CoreDNS}
spec:
  clusterIP: %[3]s
  ports:
  - {name: dns, port: 53, protocol: UDP, targetPort: 53}
  - {name: dns-tcp, port: 53, protocol: TCP, targetPort: 53}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: %[1]s-node
  namespace: %[2]s
  labels:
    kubernetes.io/service-name: %[1]s
    endpointslice.kubernetes.io/managed-by: draind-cluster
addressType: IPv4
endpoints:
- addresses: [%[4]q]
  conditions: {ready: true}
ports:
- {name: dns, port: 53, protocol: UDP}
- {name: dns-tcp, port: 53, protocol: TCP}
`, dnsService, dnsNamespace, c.DNSServiceIP(), c.NodeIP)
}

// startDNS applies the Service kube-dns and its EndpointSlice, writes the
// Corefile and starts CoreDNS, and waits until it is ready: its
// kubernetes plugin has listed the Services. Before the node starts: the
// kubelet's clusterDNS answers from its first pod on, and kube-proxy's
// first sync has the Service's rules.
func (c *Cluster) startDNS(ctx context.Context) error {
	if c.CoreDNS == "" {
		return fmt.Errorf("no CoreDNS binary (Config.CoreDNS; hack/build-coredns.sh builds it)")
	}
	if _, err := c.KubectlCmd(ctx, []byte(c.dnsObjects()), "apply", "--server-side", "-f", "-"); err != nil {
		return err
	}
	if err := os.WriteFile(c.corefile(), []byte(c.corefileFor()), 0o644); err != nil {
		return err
	}
	d := c.Config.daemons()
	if _, err := node.StartDaemon(d, "coredns", c.CoreDNS, "-conf", c.corefile()); err != nil {
		return err
	}
	return waitHTTP(ctx, "coredns", d, &http.Client{Timeout: 2 * time.Second}, fmt.Sprintf("http://127.0.0.1:%d/ready", corednsReadyPort), 60*time.Second)
}

// waitDNSService waits for kube-proxy's rule for kube-dns's ClusterIP,
// then for an answer through it over UDP and over TCP, as a pod asks:
// the Service's IP of kubernetes.default. Nothing is sent to the
// ClusterIP before the rule exists (the default route would carry it off
// the machine).
func (c *Cluster) waitDNSService(ctx context.Context) error {
	ip := c.DNSServiceIP()
	err := node.WaitFor(ctx, 60*time.Second, func() error {
		out, err := exec.CommandContext(ctx, "iptables-save", "-t", "nat").Output()
		if err != nil {
			return fmt.Errorf("iptables-save: %w", err)
		}
		if !strings.Contains(string(out), "-d "+ip+"/32 ") {
			return fmt.Errorf("no rule for %s in the nat table", ip)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("kube-proxy's rules for %s/%s: %w (log: %s)", dnsNamespace, dnsService, err, node.Tail(filepath.Join(c.StateDir, "kube-proxy.log")))
	}
	name := "kubernetes.default.svc." + clusterDomain
	want := firstServiceIP(c.ServiceCIDR).String()
	for _, network := range []string{"udp", "tcp"} {
		r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, net.JoinHostPort(ip, "53"))
		}}
		err := node.WaitFor(ctx, 30*time.Second, func() error {
			lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			addrs, err := r.LookupHost(lctx, name)
			if err != nil {
				return err
			}
			if !slices.Contains(addrs, want) {
				return fmt.Errorf("%s is %v, want %s", name, addrs, want)
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("cluster DNS at %s over %s: %w (log: %s)", ip, network, err, node.Tail(filepath.Join(c.StateDir, "coredns.log")))
		}
	}
	return nil
}

// serviceIP is the host'th address of cidr.
func serviceIP(cidr string, host byte) net.IP {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil
	}
	ip := n.IP.To4()
	return net.IPv4(ip[0], ip[1], ip[2], ip[3]+host)
}
