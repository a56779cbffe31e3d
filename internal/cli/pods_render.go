package cli

// `draind pods`' table: one line per pod, every cell from outside escaped
// and cut (-o json has them whole).

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/draind/draind/internal/agent"
)

// writeNodeView writes the view as a table, one line per pod, sorted by
// namespace and name (the runtime's listing is).
func writeNodeView(w io.Writer, v *nodeView) error {
	fmt.Fprintf(w, "%s pods on this node: %d (%s at %s: %s; each asked for at most %s)\n",
		v.Time.Format("15:04:05"), len(v.Pods), cell(v.Runtime, headerWidth), cell(v.CRI.Address, headerWidth), cell(v.CRI.Why, whyWidth),
		time.Duration(v.TimeoutMS)*time.Millisecond)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tDRAIND\tPHASE\tTRIGGER\tSINCE\tDEADLINE IN\tHOLDS / FLOWS")
	for i := range v.Pods {
		c := podCells(&v.Pods[i])
		fmt.Fprintln(tw, strings.Join(c[:], "\t"))
	}
	return tw.Flush()
}

// The widths of the table's cells that hold strings from outside (the
// runtime's names, a pod's draind's answer, errors quoting either): each
// is escaped (printable) and cut there; -o json has them whole.
const (
	podWidth     = 80  // namespace/name: 63 and 1 and, rarely, up to 253
	nameWidth    = 40  // a container's name, a phase, a trigger, a hold's kind
	errorWidth   = 160 // an error, which may quote a pod's answer
	headerWidth  = 120 // the runtime's name and address
	whyWidth     = 400 // why that endpoint: the kubelet, and those not trusted
	commWidth    = 32  // a process's name (15 bytes, escaped)
	endWhyWidth  = 40
	holdKindWide = 24
)

// podCells are a row's table cells.
func podCells(r *podRow) [7]string {
	c := [7]string{cell(r.Namespace+"/"+r.Name, podWidth), "-", "-", "-", "-", "-", "-"}
	if d := r.Draind; d != nil {
		c[1] = cell(d.Container, nameWidth) + ":?" // its settings unread: the error says why
		if _, port, err := agent.SplitHostPort(d.StatusAddr); err == nil {
			c[1] = cell(d.Container, nameWidth) + ":" + strconv.Itoa(int(port))
		}
	}
	switch {
	case r.Error != "":
		c[2], c[6] = "?", cell(r.Error, errorWidth)
	case r.State != nil:
		st := r.State
		c[2] = cell(st.Phase, nameWidth)
		if st.Trigger != "" {
			c[3], c[4], c[5] = cell(st.Trigger, nameWidth), msString(st.SinceTriggerMS), msString(st.DeadlineInMS)
		}
		c[6] = holdsCell(st)
	case r.Flows != nil:
		s := r.Flows
		c[6] = fmt.Sprintf("no draind: app listeners %d, inbound %d, outbound %d; proxy listeners %d, flows %d",
			s.AppListeners, s.AppInbound, s.AppOutbound, s.ProxyListeners, s.ProxyFlows)
	case r.HostNetwork:
		c[6] = "no draind; host network (its flows are the node's)"
	}
	return c
}

// maxHolds and maxHoldText bound the holds cell: the table stays one
// line a pod; -o json has them all.
const (
	maxHolds    = 3
	maxHoldText = 60
)

// holdsCell is what holds the drain now, or how it ended.
func holdsCell(st *agent.PodState) string {
	if e := st.End; e != nil {
		s := fmt.Sprintf("ended: %s after %s", cell(e.Why, endWhyWidth), msString(e.TookMS))
		if e.Cut {
			s += fmt.Sprintf(", cut by the deadline (%d flows, %d app processes open)", e.OpenFlows, e.AppProcesses)
		}
		return s
	}
	if len(st.Holds) == 0 {
		return "-"
	}
	var parts []string
	for i, h := range st.Holds {
		if i == maxHolds {
			parts = append(parts, fmt.Sprintf("+%d more", len(st.Holds)-i))
			break
		}
		parts = append(parts, cell(h.Kind, holdKindWide)+": "+cell(h.What, maxHoldText))
	}
	return strings.Join(parts, "; ")
}

// msString is a span in ms as a short duration (0.1 s precision).
func msString(ms int64) string {
	return (time.Duration(ms) * time.Millisecond).Round(100 * time.Millisecond).String()
}
