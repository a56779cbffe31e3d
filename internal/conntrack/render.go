package conntrack

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
	"time"
)

// WriteTable writes a snapshot as an ss-like table: listeners first, then
// flows, each sorted by owner and local address, then a summary line.
func WriteTable(w io.Writer, snap *Snapshot) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "STATE\tOWNER\tDIR\tLOCAL\tREMOTE\tUID\tIDLE\tHOLDS\tINODE")
	rows := make([]Flow, 0, len(snap.Listeners)+len(snap.Flows))
	rows = append(rows, sorted(snap.Listeners)...)
	rows = append(rows, sorted(snap.Flows)...)
	for i := range rows {
		f := &rows[i]
		remote := f.Remote.String()
		if f.State == Listen {
			remote = "*"
		}
		idle := "-"
		if f.IdleMS >= 0 && f.State != Listen {
			idle = (time.Duration(f.IdleMS) * time.Millisecond).String()
		}
		holds := "no"
		switch {
		case f.Holds:
			holds = "yes"
		case f.IdleExpired:
			holds = "idle"
		case f.State == Listen:
			holds = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%d\n",
			f.State, f.Owner, f.Direction, f.Local, remote, f.UID, idle, holds, f.Inode)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	s := snap.Summary
	_, err := fmt.Fprintf(w, "\n%s: app_listeners=%d app_inbound=%d app_outbound=%d app_idle=%d proxy_listeners=%d proxy_flows=%d proxy_idle=%d closing=%d\n",
		snap.Namespace, s.AppListeners, s.AppInbound, s.AppOutbound, s.AppIdle, s.ProxyListeners, s.ProxyFlows, s.ProxyIdle, s.Closing)
	return err
}

func sorted(fs []Flow) []Flow {
	out := append([]Flow(nil), fs...)
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
