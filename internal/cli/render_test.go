package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/sockdiag"
	"github.com/draind/draind/internal/tcpstate"
)

func testSnapshot() flows.Snapshot {
	socks := []sockdiag.Socket{
		{Family: unix.AF_INET, State: tcpstate.Listen, Local: netip.MustParseAddrPort("0.0.0.0:8080"), Remote: netip.MustParseAddrPort("0.0.0.0:0"), Inode: 5, Cookie: 1},
		{Family: unix.AF_INET6, State: tcpstate.Listen, Local: netip.MustParseAddrPort("[::]:15006"), Remote: netip.MustParseAddrPort("[::]:0"), UID: 1337, Inode: 4, Cookie: 2, HasInfo: true, LastDataRecv: time.Hour},
		{Family: unix.AF_INET6, State: tcpstate.Established, Local: netip.MustParseAddrPort("[::1]:8080"), Remote: netip.MustParseAddrPort("[::1]:4000"), UID: 1337, Inode: 6, Cookie: 1 << 40, CgroupID: 77, HasInfo: true, LastDataSent: time.Second, LastDataRecv: 2 * time.Second},
		{Family: unix.AF_INET, State: tcpstate.TimeWait, Local: netip.MustParseAddrPort("127.0.0.1:4001"), Remote: netip.MustParseAddrPort("127.0.0.1:8080")},
		{Family: unix.AF_INET, State: tcpstate.Established, Transparent: true, UID: 1337, Local: netip.MustParseAddrPort("127.0.0.1:4002"), Remote: netip.MustParseAddrPort("127.0.0.1:9"), HasInfo: true, LastDataSent: time.Hour, LastDataRecv: time.Hour},
		{Family: unix.AF_INET, State: tcpstate.Established, Local: netip.MustParseAddrPort("127.0.0.1:4001"), Remote: netip.MustParseAddrPort("127.0.0.1:8080"), UID: 1000, Inode: 9, Cookie: 9},
	}
	p := flows.DefaultPolicy()
	p.IdleTimeout = time.Minute
	p.ControlPorts = []uint16{9} // the flow to 127.0.0.1:9 is control traffic
	snap := flows.NewClassifier(p).Classify(socks)
	snap.Taken = time.Date(2026, 11, 22, 7, 0, 0, 123, time.UTC)
	snap.Namespace = `pid "42"`
	return snap
}

func TestJSONMatchesEncodingJSON(t *testing.T) {
	full := testSnapshot()
	noFlows := full
	noFlows.Flows = nil
	noListeners := full
	noListeners.Listeners = nil
	for name, snap := range map[string]flows.Snapshot{"full": full, "no flows": noFlows, "no listeners": noListeners, "empty": {}} {
		t.Run(name, func(t *testing.T) {
			want, err := json.Marshal(&snap)
			if err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			if err := WriteJSON(&got, &snap); err != nil {
				t.Fatal(err)
			}
			var a, b any
			if err := json.Unmarshal(want, &a); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(got.Bytes(), &b); err != nil {
				t.Fatalf("output is not JSON: %v\n%s", err, got.Bytes())
			}
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("differs from encoding/json:\n got %s\nwant %s", got.Bytes(), want)
			}
		})
	}
}

// The JSON streams: it is written in pieces as it grows, never held whole.
func TestJSONWriterFlushes(t *testing.T) {
	snap := testSnapshot()
	f := snap.Flows[0]
	var out countingWriter
	j := NewJSONWriter(&out, snap.Taken, snap.Namespace)
	for range 5000 {
		j.Flow(&f)
	}
	if err := j.End(&snap.Summary, []byte(`,"extra":1`)); err != nil {
		t.Fatal(err)
	}
	if out.writes < 5 || out.max > flushAt+1024 {
		t.Fatalf("%d writes, the largest %d bytes: want several of at most %d", out.writes, out.max, flushAt+1024)
	}
	var v struct {
		Flows []json.RawMessage `json:"flows"`
		Extra int               `json:"extra"`
	}
	if err := json.Unmarshal(out.buf.Bytes(), &v); err != nil || len(v.Flows) != 5000 || v.Extra != 1 {
		t.Fatalf("%d flows, extra %d, %v", len(v.Flows), v.Extra, err)
	}
}

type countingWriter struct {
	buf         bytes.Buffer
	writes, max int
}

func (c *countingWriter) Write(p []byte) (int, error) {
	c.writes++
	c.max = max(c.max, len(p))
	return c.buf.Write(p)
}

// tabwriterTable is the table as text/tabwriter wrote it before rows were
// packed: the oracle for TableWriter's own column sizing.
func tabwriterTable(snap *flows.Snapshot) string {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STATE\tOWNER\tDIR\tLOCAL\tREMOTE\tUID\tIDLE\tHOLDS\tINODE")
	sorted := func(fs []flows.Flow) []flows.Flow {
		out := append([]flows.Flow(nil), fs...)
		sort.SliceStable(out, func(i, j int) bool {
			if out[i].Owner != out[j].Owner {
				return out[i].Owner < out[j].Owner
			}
			if c := out[i].Local.Compare(out[j].Local); c != 0 {
				return c < 0
			}
			return out[i].Remote.Compare(out[j].Remote) < 0
		})
		return out
	}
	for _, f := range append(sorted(snap.Listeners), sorted(snap.Flows)...) {
		remote := f.Remote.String()
		if f.State == tcpstate.Listen {
			remote = "*"
		}
		idle := "-"
		if f.IdleMS >= 0 && f.State != tcpstate.Listen {
			idle = (time.Duration(f.IdleMS) * time.Millisecond).String()
		}
		holds := "no"
		switch {
		case f.Holds:
			holds = "yes"
		case f.IdleExpired:
			holds = "idle"
		case f.State == tcpstate.Listen:
			holds = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\n", f.State, f.Owner, f.Direction, f.Local, remote, f.UID, idle, holds, f.Inode)
	}
	tw.Flush()
	s := snap.Summary
	fmt.Fprintf(&buf, "\n%s: app_listeners=%d app_inbound=%d app_outbound=%d app_idle=%d proxy_listeners=%d proxy_flows=%d (inbound %d, outbound %d) proxy_idle=%d control=%d closing=%d\n",
		snap.Namespace, s.AppListeners, s.AppInbound, s.AppOutbound, s.AppIdle, s.ProxyListeners, s.ProxyFlows, s.ProxyInbound, s.ProxyOutbound, s.ProxyIdle, s.Control, s.Closing)
	return buf.String()
}

func TestTableMatchesTabwriter(t *testing.T) {
	snap := testSnapshot()
	var got bytes.Buffer
	if err := WriteTable(&got, &snap); err != nil {
		t.Fatal(err)
	}
	if want := tabwriterTable(&snap); got.String() != want {
		t.Fatalf("table:\n%s\nwant:\n%s", got.String(), want)
	}
	if !strings.Contains(got.String(), "idle") {
		t.Fatalf("no idle flow in:\n%s", got.String())
	}
}

// Many random rows (IPv4, IPv6, owners, states), in any order: the same
// table as text/tabwriter and netip's order give.
func TestTableMatchesTabwriterRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	addr := func() netip.AddrPort {
		port := uint16(rng.IntN(4) * 1000)
		switch rng.IntN(3) {
		case 0:
			return netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 0, byte(rng.IntN(3)), byte(rng.IntN(3))}), port)
		case 1:
			return netip.AddrPortFrom(netip.AddrFrom16([16]byte{0xfd, 15: byte(rng.IntN(3))}), port)
		}
		return netip.AddrPortFrom(netip.MustParseAddr("::ffff:10.0.0.1").Unmap(), port)
	}
	states := []tcpstate.State{tcpstate.Listen, tcpstate.Established, tcpstate.CloseWait, tcpstate.FinWait2}
	var socks []sockdiag.Socket
	for i := range 3000 {
		socks = append(socks, sockdiag.Socket{Family: unix.AF_INET, State: states[rng.IntN(len(states))], Local: addr(), Remote: addr(),
			UID: uint32(rng.IntN(2)) * 1337, Inode: uint32(i), HasInfo: rng.IntN(2) == 0, LastDataSent: time.Duration(rng.IntN(90000)) * time.Millisecond})
	}
	snap := flows.NewClassifier(flows.DefaultPolicy()).Classify(socks)
	var got bytes.Buffer
	if err := WriteTable(&got, &snap); err != nil {
		t.Fatal(err)
	}
	if want := tabwriterTable(&snap); got.String() != want {
		g, w := strings.Split(got.String(), "\n"), strings.Split(want, "\n")
		for i := range min(len(g), len(w)) {
			if g[i] != w[i] {
				t.Fatalf("line %d:\n got %q\nwant %q", i, g[i], w[i])
			}
		}
		t.Fatalf("%d lines, want %d", len(g), len(w))
	}
}
