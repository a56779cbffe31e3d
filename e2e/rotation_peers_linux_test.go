package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/logevent"
	"github.com/draind/draind/internal/testenv/nsrun"
)

// Issue 41 in the pod harness: the out-of-rotation rule tells the
// kubelet's probes from traffic by their target, on the two CNI shapes a
// pod meets. The remote namespace plays the node: on a bridge CNI it is
// the pod's default gateway (where everything the node forwards with
// masquerade comes from: a NodePort, a ClusterIP from the node, a
// hostNetwork pod); on a routed CNI the pod has a /32 behind a link-local
// gateway and the node reaches it from its own address (HOST_IP), the
// kubelet's probes included.

// cniShape is how the pod's link is laid.
type cniShape string

const (
	cniBridge cniShape = "bridge"
	cniRouted cniShape = "routed"
	// linkLocalGW is the routed shape's gateway, as Calico and the AWS VPC
	// CNI give it.
	linkLocalGW = "169.254.1.1"
	// bridgeNodeIP is the node's own address on the bridge shape: not the
	// gateway, and never a source the pod sees.
	bridgeNodeIP = "198.51.100.10"
)

var cniShapes = []cniShape{cniBridge, cniRouted}

// withCNI lays the link newPod made as shape s, and gives the containers
// the node's address as the downward API does.
func withCNI(s cniShape) podOption {
	return func(p *pod) {
		p.t.Helper()
		hp, err := netlink.NewHandleAt(p.ns.Handle)
		if err != nil {
			p.t.Fatal(err)
		}
		defer hp.Close()
		hr, err := netlink.NewHandleAt(p.remote.Handle)
		if err != nil {
			p.t.Fatal(err)
		}
		defer hr.Close()
		podLink, err := hp.LinkByName("veth-a")
		if err != nil {
			p.t.Fatal(err)
		}
		nodeLink, err := hr.LinkByName("veth-b")
		if err != nil {
			p.t.Fatal(err)
		}
		must := func(what string, err error) {
			if err != nil {
				p.t.Fatalf("%s shape: %s: %v", s, what, err)
			}
		}
		addr := func(cidr string) *netlink.Addr {
			a, err := netlink.ParseAddr(cidr)
			must(cidr, err)
			return a
		}
		switch s {
		case cniBridge:
			must("default route", hp.RouteAdd(&netlink.Route{LinkIndex: podLink.Attrs().Index, Gw: net.ParseIP(remoteIP)}))
			p.env = append(p.env, agent.NodeIPEnv+"="+bridgeNodeIP)
		case cniRouted:
			must("pod /24", hp.AddrDel(podLink, addr(podIP+"/24")))
			must("pod /32", hp.AddrAdd(podLink, addr(podIP+"/32")))
			must("gateway route", hp.RouteAdd(&netlink.Route{LinkIndex: podLink.Attrs().Index, Dst: addr(linkLocalGW + "/32").IPNet, Scope: netlink.SCOPE_LINK}))
			must("default route", hp.RouteAdd(&netlink.Route{LinkIndex: podLink.Attrs().Index, Gw: net.ParseIP(linkLocalGW)}))
			must("node /24", hr.AddrDel(nodeLink, addr(remoteIP+"/24")))
			must("node address", hr.AddrAdd(nodeLink, addr(remoteIP+"/32")))
			must("gateway address", hr.AddrAdd(nodeLink, addr(linkLocalGW+"/32")))
			must("pod route", hr.RouteAdd(&netlink.Route{LinkIndex: nodeLink.Attrs().Index, Dst: addr(podIP + "/32").IPNet, Scope: netlink.SCOPE_LINK, Src: net.ParseIP(remoteIP)}))
			p.env = append(p.env, agent.NodeIPEnv+"="+remoteIP)
		}
	}
}

// TestRotationNodeClients (issue 41, acceptance 3): clients the node
// forwards (from the gateway on a bridge, from the node's address on a
// routed CNI), and an outside client whose address the node keeps
// (externalTrafficPolicy Local), each open a new connection every 100 ms
// until 3 s after the deletion; the app's preStop waits for the pod to
// leave rotation. The rule counts them as the node's and as other, and no
// connection fails.
func TestRotationNodeClients(t *testing.T) {
	for _, shape := range cniShapes {
		t.Run(string(shape), func(t *testing.T) {
			p := newPod(t, withCNI(shape))
			p.startApp()
			p.startDraind(nil)
			outside := outsideClient(t, p)
			url := "http://" + podIP + ":15006/"
			kept := startClientsDial(p, 100*time.Millisecond, url, outside)
			// Stopped with the node's clients: appPreStopRotation deletes
			// the pod 2 s in and stops them 3 s after.
			keptDone := make(chan struct{})
			time.AfterFunc(5*time.Second, func() { kept.halt(); close(keptDone) })
			appPreStopRotation(t, p, startClients(p, 100*time.Millisecond), 3*time.Second, false)
			<-keptDone
			if n := kept.failed.Load(); n != 0 || kept.ok.Load() == 0 {
				t.Errorf("the outside client: %d failed (first: %v), %d ok", n, kept.firstErr, kept.ok.Load())
			}
			out := p.logLines(logevent.OutOfRotation)[0]
			if n, _ := out["from_node"].(float64); n == 0 || out["from_pods"].(float64) != 0 {
				t.Errorf("the node's clients not counted as the node's: %v", out)
			}
			if n, _ := out["from_other"].(float64); n == 0 {
				t.Errorf("the outside client not counted as other: %v", out)
			}
			if took, _ := time.ParseDuration(out["took"].(string)); took < 3*time.Second {
				t.Errorf("out of rotation %s after the deletion, while the node's clients still sent: %v", took, out)
			}
		})
	}
}

// outsideAddr is an outside client's address, as the node keeps it under
// externalTrafficPolicy Local: the remote namespace holds it too, and the
// pod reaches it through its default route on either shape.
const outsideAddr = "198.51.100.7"

// outsideClient gives the remote namespace outsideAddr and returns a dialer
// whose connections come from it.
func outsideClient(t *testing.T, p *pod) func(ctx context.Context, network, addr string) (net.Conn, error) {
	t.Helper()
	p.remote.AddAddr(t, "veth-b", outsideAddr+"/32")
	return func(ctx context.Context, network, addr string) (c net.Conn, err error) {
		err = nsrun.Do(p.remote.Handle, func() error {
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(outsideAddr)}}
			c, err = d.DialContext(ctx, network, addr)
			return err
		})
		return c, err
	}
}

// TestRotationIdleProbed (issue 41, acceptance 2): a pod whose only
// connections are the kubelet's probes (draind's status port and the
// app's own health port, --probe-ports), every 100 ms through the drain,
// leaves rotation on quiet, never at the ceiling, and counts no traffic.
func TestRotationIdleProbed(t *testing.T) {
	for _, shape := range cniShapes {
		t.Run(string(shape), func(t *testing.T) {
			p := newPod(t, withCNI(shape))
			p.startApp("--probe-listen", "0.0.0.0:8081")
			p.startDraind([]string{"--probe-ports", "8081"})
			base := "http://" + podIP + ":"
			drainIdleProbed(t, p, base+"15020"+agent.RotationWaitPath, base+"15020/healthz/ready", base+"8081/")
		})
	}
}

// drainIdleProbed deletes an idle pod as the kubelet does for a classic
// sidecar whose app's preStop calls waitURL (the out-of-rotation wait),
// the kubelet's probes of probeURLs every 100 ms from the node meanwhile.
// The wait must end on quiet, with no connection counted and the probes
// left out.
func drainIdleProbed(t *testing.T, p *pod, waitURL string, probeURLs ...string) {
	t.Helper()
	stop := probeLoop(p, 100*time.Millisecond, probeURLs...)
	time.Sleep(time.Second) // the rate before the trigger: probes only
	p.drainedAt = time.Now()
	done := make(chan string, 1)
	go func() {
		hc := &http.Client{Transport: &http.Transport{DialContext: p.remote.Dialer(), DisableKeepAlives: true}, Timeout: 30 * time.Second}
		outcome := ""
		if resp, err := hc.Get(waitURL); err == nil {
			outcome = resp.Header.Get("Draind-Outcome")
			resp.Body.Close()
		}
		p.app.Signal(syscall.SIGTERM) // the kubelet, once the hook returned
		done <- outcome
	}()
	p.draind.Signal(syscall.SIGTERM)
	outcome := <-done
	probes := stop()
	if code, _ := p.waitExit(30 * time.Second); code != 0 {
		t.Fatalf("draind exited %d; log:\n%s", code, p.draindLog.String())
	}
	if outcome != "out-of-rotation" {
		t.Fatalf("the app's preStop call said %q", outcome)
	}
	lines := p.logLines(logevent.OutOfRotation)
	if len(lines) != 1 {
		t.Fatalf("out_of_rotation lines %v; log:\n%s", lines, p.draindLog.String())
	}
	out := lines[0]
	if out["why"] != "quiet" || out["connections"].(float64) != 0 || out["probes_left_out"].(float64) == 0 {
		t.Errorf("want quiet after 0 connections with the probes left out: %v", out)
	}
	t.Logf("%d probes sent; out of rotation %v (%v, window %v, %v probes left out)", probes, out["took"], out["why"], out["window"], out["probes_left_out"])
}

// probeLoop GETs each url every period from the remote (the kubelet's
// probes: a new connection each, any answer), until the returned func is
// called; that returns how many connected.
func probeLoop(p *pod, period time.Duration, urls ...string) func() int {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	n := 0
	hc := &http.Client{Transport: &http.Transport{DialContext: p.remote.Dialer(), DisableKeepAlives: true}, Timeout: time.Second}
	wg.Go(func() {
		tk := time.NewTicker(period)
		defer tk.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tk.C:
			}
			for _, u := range urls {
				if resp, err := hc.Get(u); err == nil {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					mu.Lock()
					n++
					mu.Unlock()
				}
			}
		}
	})
	return func() int {
		close(stop)
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		return n
	}
}
