package kubelet_test

import (
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// serviceFlows follows the node's conntrack table for connections to one
// Service address: for each client port, the pod kube-proxy's DNAT chose.
// A failed request logs its client port (loadclient's "local"); this pins
// it to the pod that held it, where the steps of every terminating pod at
// that moment only say which pods might have.
//
// It polls (every serviceFlowsPoll): vishvananda/netlink dumps the table
// but has no event subscription. A connection's entry outlives it by the
// TCP states' timeouts (120 s in SYN_SENT, FIN_WAIT and TIME_WAIT; 10 s
// in CLOSE after a reset), so a poll sees each.
type serviceFlows struct {
	svc  netip.Addr
	stop chan struct{}
	done chan struct{}
	once sync.Once

	mu    sync.Mutex
	seen  map[clientEnd][]flowSeen
	polls int
	err   error // the last dump's, nil once one works again
}

// serviceFlowsPoll is how often serviceFlows dumps the table: a dump of
// a few thousand entries costs milliseconds of the node's saturated CPUs.
const serviceFlowsPoll = time.Second

// flowSightLag is how long after a request its new connection may be
// first seen: a poll, and the dial's wait for a saturated node's CPU. A
// port reused sooner for another pod would be taken for the request's.
const flowSightLag = 2 * serviceFlowsPoll

type clientEnd struct {
	ip   netip.Addr
	port uint16
}

// flowSeen is one connection from a client end: the pod it went to and
// when a poll first saw it.
type flowSeen struct {
	pod   netip.Addr
	first time.Time
}

// watchServiceFlows starts following connections to svc (an IPv4
// ClusterIP); stop ends it.
func watchServiceFlows(svc string) (*serviceFlows, error) {
	addr, err := netip.ParseAddr(svc)
	if err != nil {
		return nil, err
	}
	f := &serviceFlows{svc: addr, stop: make(chan struct{}), done: make(chan struct{}), seen: map[clientEnd][]flowSeen{}}
	f.poll() // the connections open before the event
	go func() {
		defer close(f.done)
		t := time.NewTicker(serviceFlowsPoll)
		defer t.Stop()
		for {
			select {
			case <-f.stop:
				f.poll() // the last: failures near the end
				return
			case <-t.C:
				f.poll()
			}
		}
	}()
	return f, nil
}

func (f *serviceFlows) poll() {
	flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
	now := time.Now()
	f.mu.Lock()
	defer f.mu.Unlock()
	f.polls++
	f.err = err
	for _, fl := range flows {
		if fl.Forward.Protocol != unix.IPPROTO_TCP {
			continue
		}
		dst, _ := netip.AddrFromSlice(fl.Forward.DstIP.To4())
		if dst != f.svc {
			continue
		}
		src, _ := netip.AddrFromSlice(fl.Forward.SrcIP.To4())
		pod, _ := netip.AddrFromSlice(fl.Reverse.SrcIP.To4())
		end := clientEnd{src, fl.Forward.SrcPort}
		f.seen[end] = addFlowSeen(f.seen[end], flowSeen{pod, now})
	}
}

// addFlowSeen adds a poll's sight of a connection to the ones seen from
// its client end: the same pod as the last is the same connection (its
// first sight kept), another is the port's reuse.
func addFlowSeen(seen []flowSeen, s flowSeen) []flowSeen {
	if n := len(seen); n > 0 && seen[n-1].pod == s.pod {
		return seen
	}
	return append(seen, s)
}

// stopWatch ends the polling; safe twice.
func (f *serviceFlows) stopWatch() {
	f.once.Do(func() { close(f.stop) })
	<-f.done
}

// podFor is the pod the connection from client's local (loadclient's
// "IP:PORT", or "*:PORT" for a dial that failed) went to, for a request
// that started at at; ok false when no poll saw it.
func (f *serviceFlows) podFor(client netip.Addr, local string, at time.Time) (netip.Addr, bool) {
	i := strings.LastIndexByte(local, ':')
	if i < 0 {
		return netip.Addr{}, false
	}
	port, err := strconv.ParseUint(local[i+1:], 10, 16)
	if err != nil {
		return netip.Addr{}, false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return flowAt(f.seen[clientEnd{client, uint16(port)}], at)
}

// flowAt is the connection a request that started at used: the last one
// first seen by then, or by flowSightLag after it (a new connection's
// first sight follows the request by up to a poll, more on a saturated
// node).
func flowAt(seen []flowSeen, at time.Time) (netip.Addr, bool) {
	var pod netip.Addr
	for _, s := range seen {
		if s.first.After(at.Add(flowSightLag)) {
			break
		}
		pod = s.pod
	}
	return pod, pod.IsValid()
}

// String is the watch's health for a report: the polls and the last
// error, if the last dump failed.
func (f *serviceFlows) String() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	s := strconv.Itoa(f.polls) + " conntrack polls, " + strconv.Itoa(len(f.seen)) + " client ports"
	if f.err != nil {
		s += ", last: " + f.err.Error()
	}
	return s
}

func TestFlowAt(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a, b := netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2")
	var seen []flowSeen
	for _, s := range []flowSeen{{a, t0}, {a, t0.Add(time.Second)}, {b, t0.Add(30 * time.Second)}} {
		seen = addFlowSeen(seen, s)
	}
	if len(seen) != 2 || !seen[0].first.Equal(t0) {
		t.Fatalf("seen %v: want a's first sight and b's", seen)
	}
	for _, tc := range []struct {
		name string
		at   time.Time
		want netip.Addr
	}{
		{"a kept-alive connection seen long before", t0.Add(20 * time.Second), a},
		{"a new connection seen a poll after the request", t0.Add(-time.Second), a},
		{"the port reused for another pod", t0.Add(29 * time.Second), b},
		{"after the reuse", t0.Add(40 * time.Second), b},
		{"before any sight", t0.Add(-10 * time.Second), netip.Addr{}},
	} {
		got, ok := flowAt(seen, tc.at)
		if got != tc.want || ok != tc.want.IsValid() {
			t.Errorf("%s: %v %v, want %v", tc.name, got, ok, tc.want)
		}
	}
}
