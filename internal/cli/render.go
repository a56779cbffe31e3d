package cli

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/sockdiag"
)

// WriteTable writes a snapshot as an ss-like table: listeners first, then
// flows, each sorted by owner and local address, then a summary line.
func WriteTable(w io.Writer, snap *flows.Snapshot) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STATE\tOWNER\tDIR\tLOCAL\tREMOTE\tUID\tIDLE\tHOLDS\tINODE")
	rows := make([]flows.Flow, 0, len(snap.Listeners)+len(snap.Flows))
	rows = append(rows, sorted(snap.Listeners)...)
	rows = append(rows, sorted(snap.Flows)...)
	for i := range rows {
		f := &rows[i]
		remote := f.Remote.String()
		if f.State == sockdiag.Listen {
			remote = "*"
		}
		idle := "-"
		if f.IdleMS >= 0 && f.State != sockdiag.Listen {
			idle = (time.Duration(f.IdleMS) * time.Millisecond).String()
		}
		holds := "no"
		switch {
		case f.Holds:
			holds = "yes"
		case f.IdleExpired:
			holds = "idle"
		case f.State == sockdiag.Listen:
			holds = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\n",
			f.State, f.Owner, f.Direction, f.Local, remote, f.UID, idle, holds, f.Inode)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	s := snap.Summary
	_, err := fmt.Fprintf(w, "\n%s: app_listeners=%d app_inbound=%d app_outbound=%d app_idle=%d proxy_listeners=%d proxy_flows=%d (inbound %d, outbound %d) proxy_idle=%d control=%d closing=%d\n",
		snap.Namespace, s.AppListeners, s.AppInbound, s.AppOutbound, s.AppIdle, s.ProxyListeners, s.ProxyFlows, s.ProxyInbound, s.ProxyOutbound, s.ProxyIdle, s.Control, s.Closing)
	return err
}

func sorted(fs []flows.Flow) []flows.Flow {
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

// AppendJSON appends snap as compact JSON, one flow per line, with the same
// keys and values encoding/json gives Snapshot. It exists for speed: a
// reflective encoder spends more time on 100k flows than the kernel dump.
func AppendJSON(b []byte, snap *flows.Snapshot) []byte {
	b = append(b, `{"taken":`...)
	b = strconv.AppendQuote(b, snap.Taken.Format(time.RFC3339Nano))
	b = append(b, `,"namespace":`...)
	b = strconv.AppendQuote(b, snap.Namespace)
	s := &snap.Summary
	b = append(b, `,"summary":{"app_listeners":`...)
	b = strconv.AppendInt(b, int64(s.AppListeners), 10)
	b = append(b, `,"app_inbound":`...)
	b = strconv.AppendInt(b, int64(s.AppInbound), 10)
	b = append(b, `,"app_outbound":`...)
	b = strconv.AppendInt(b, int64(s.AppOutbound), 10)
	b = append(b, `,"app_idle":`...)
	b = strconv.AppendInt(b, int64(s.AppIdle), 10)
	b = append(b, `,"proxy_listeners":`...)
	b = strconv.AppendInt(b, int64(s.ProxyListeners), 10)
	b = append(b, `,"proxy_flows":`...)
	b = strconv.AppendInt(b, int64(s.ProxyFlows), 10)
	b = append(b, `,"proxy_inbound":`...)
	b = strconv.AppendInt(b, int64(s.ProxyInbound), 10)
	b = append(b, `,"proxy_outbound":`...)
	b = strconv.AppendInt(b, int64(s.ProxyOutbound), 10)
	b = append(b, `,"proxy_idle":`...)
	b = strconv.AppendInt(b, int64(s.ProxyIdle), 10)
	b = append(b, `,"control":`...)
	b = strconv.AppendInt(b, int64(s.Control), 10)
	b = append(b, `,"closing":`...)
	b = strconv.AppendInt(b, int64(s.Closing), 10)
	b = append(b, "},\n\"listeners\":"...)
	b = appendFlows(b, snap.Listeners)
	b = append(b, ",\n\"flows\":"...)
	b = appendFlows(b, snap.Flows)
	return append(b, "}\n"...)
}

func appendFlows(b []byte, fs []flows.Flow) []byte {
	if fs == nil {
		return append(b, "null"...)
	}
	b = append(b, '[')
	for i := range fs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '\n')
		b = appendFlow(b, &fs[i])
	}
	return append(b, ']')
}

func appendFlow(b []byte, f *flows.Flow) []byte {
	b = append(b, `{"family":`...)
	b = strconv.AppendUint(b, uint64(f.Family), 10)
	b = append(b, `,"state":"`...)
	b = append(b, f.State.String()...)
	b = append(b, `","local":"`...)
	b = f.Local.AppendTo(b)
	b = append(b, `","remote":"`...)
	b = f.Remote.AppendTo(b)
	b = append(b, `","uid":`...)
	b = strconv.AppendUint(b, uint64(f.UID), 10)
	b = append(b, `,"inode":`...)
	b = strconv.AppendUint(b, uint64(f.Inode), 10)
	b = append(b, `,"cookie":`...)
	b = strconv.AppendUint(b, f.Cookie, 10)
	if f.CgroupID != 0 {
		b = append(b, `,"cgroup_id":`...)
		b = strconv.AppendUint(b, f.CgroupID, 10)
	}
	if f.Transparent {
		b = append(b, `,"transparent":true`...)
	}
	b = append(b, `,"owner":"`...)
	b = append(b, f.Owner.String()...)
	b = append(b, `","direction":"`...)
	b = append(b, f.Direction.String()...)
	b = append(b, `","holds":`...)
	b = strconv.AppendBool(b, f.Holds)
	if f.Control {
		b = append(b, `,"control":true`...)
	}
	if f.IdleExpired {
		b = append(b, `,"idle_expired":true`...)
	}
	b = append(b, `,"idle_ms":`...)
	b = strconv.AppendInt(b, f.IdleMS, 10)
	return append(b, '}')
}
