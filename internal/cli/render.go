package cli

import (
	"encoding/json"
	"io"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/draind/draind/internal/flows"
	"github.com/draind/draind/internal/tcpstate"
)

// flushAt is how much output the writers below gather before a write.
const flushAt = 32 << 10

// JSONWriter writes a snapshot as compact JSON, one flow per line, while
// its sockets are read: the header, the listeners, the flows, then the
// summary (last, because it is known only at the end). The keys and values
// are those encoding/json gives flows.Snapshot; only their order differs.
// It exists for memory and speed: nothing is held but one output buffer,
// and a reflective encoder spends more time on 100k flows than the kernel
// dump.
type JSONWriter struct {
	w      io.Writer
	b      []byte
	lists  int // lists opened: 1 listeners, 2 flows
	inList int // items written to the open list
	err    error
}

// NewJSONWriter starts a snapshot of namespace taken at taken.
func NewJSONWriter(w io.Writer, taken time.Time, namespace string) *JSONWriter {
	j := &JSONWriter{w: w, b: make([]byte, 0, flushAt+1024)}
	j.b = append(j.b, `{"taken":`...)
	j.b = strconv.AppendQuote(j.b, taken.Format(time.RFC3339Nano))
	j.b = append(j.b, `,"namespace":`...)
	j.b = appendJSONString(j.b, namespace)
	return j
}

// appendJSONString appends s as a JSON string, exactly: Go's quoting
// (\x1b, invalid UTF-8 kept) is no JSON.
func appendJSONString(b []byte, s string) []byte {
	q, err := json.Marshal(s)
	if err != nil {
		return append(b, `""`...)
	}
	return append(b, q...)
}

// Listener writes a listener; all come before the first Flow.
func (j *JSONWriter) Listener(f *flows.Flow) { j.item(1, f) }

// Flow writes a flow.
func (j *JSONWriter) Flow(f *flows.Flow) { j.item(2, f) }

func (j *JSONWriter) item(list int, f *flows.Flow) {
	j.openList(list)
	if j.inList > 0 {
		j.b = append(j.b, ',')
	} else {
		j.b = append(j.b, '[')
	}
	j.inList++
	j.b = append(j.b, '\n')
	j.b = appendFlow(j.b, f)
	if len(j.b) >= flushAt {
		j.flush()
	}
}

// openList closes the lists before list (null when empty) and opens it.
func (j *JSONWriter) openList(list int) {
	for j.lists < list {
		if j.lists > 0 {
			j.closeList()
		}
		j.lists++
		j.inList = 0
		j.b = append(j.b, ",\n\""...)
		j.b = append(j.b, [...]string{"", "listeners", "flows"}[j.lists]...)
		j.b = append(j.b, `":`...)
	}
}

func (j *JSONWriter) closeList() {
	if j.inList == 0 {
		j.b = append(j.b, "null"...)
	} else {
		j.b = append(j.b, ']')
	}
}

// End writes the summary, then extra (more members, already JSON, each
// starting with a comma; nil: none), closes the object and flushes. It
// returns the first write error.
func (j *JSONWriter) End(s *flows.Summary, extra []byte) error {
	j.openList(2)
	j.closeList()
	j.b = append(j.b, ",\n"...)
	j.b = appendSummary(j.b, s)
	j.b = append(j.b, extra...)
	j.b = append(j.b, "}\n"...)
	j.flush()
	return j.err
}

func (j *JSONWriter) flush() {
	if j.err == nil && len(j.b) > 0 {
		_, j.err = j.w.Write(j.b)
	}
	j.b = j.b[:0]
}

// WriteJSON writes a whole snapshot as JSONWriter does.
func WriteJSON(w io.Writer, snap *flows.Snapshot) error {
	j := NewJSONWriter(w, snap.Taken, snap.Namespace)
	for i := range snap.Listeners {
		j.Listener(&snap.Listeners[i])
	}
	for i := range snap.Flows {
		j.Flow(&snap.Flows[i])
	}
	return j.End(&snap.Summary, nil)
}

func appendSummary(b []byte, s *flows.Summary) []byte {
	b = append(b, `"summary":{`...)
	for i, n := range s.Counts() {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendQuote(b, flows.SummaryKeys[i])
		b = append(b, ':')
		b = strconv.AppendInt(b, int64(n), 10)
	}
	return append(b, '}')
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

// tableRow is what the table shows of a flow, packed (56 bytes, no
// pointers): the table must hold every row to sort them and size its
// columns, and 200k flows fit in 11 MB this way.
type tableRow struct {
	local, remote [16]byte
	lport, rport  uint16
	uid, inode    uint32
	idleMS        int64
	state         tcpstate.State
	owner         flows.Owner
	dir           flows.Direction
	bits          uint8 // address kinds (2 bits each), holds, idle expired
}

const (
	rowHolds   = 1 << 4
	rowIdleExp = 1 << 5
)

func (r *tableRow) localAddr() netip.AddrPort { return flows.UnpackAddr(&r.local, r.bits&3, r.lport) }
func (r *tableRow) remoteAddr() netip.AddrPort {
	return flows.UnpackAddr(&r.remote, r.bits>>2&3, r.rport)
}

// TableWriter writes an ss-like table: listeners first, then flows, each
// sorted by owner and local address (then remote), then a summary line.
// Rows are kept packed in fixed chunks (growing copies nothing) until End,
// which sorts their indexes and sizes the columns (the output is what
// text/tabwriter gives, without its copy of every cell).
type TableWriter struct {
	chunks [][]tableRow
	order  []uint32
}

// rowChunk rows per chunk: 56 KiB.
const rowChunk = 1024

// Add takes a listener or a flow.
func (t *TableWriter) Add(f *flows.Flow) {
	r := tableRow{uid: f.UID, inode: f.Inode, idleMS: f.IdleMS, state: f.State, owner: f.Owner, dir: f.Direction,
		lport: f.Local.Port(), rport: f.Remote.Port()}
	r.bits = flows.PackAddr(&r.local, f.Local) | flows.PackAddr(&r.remote, f.Remote)<<2
	if f.Holds {
		r.bits |= rowHolds
	}
	if f.IdleExpired {
		r.bits |= rowIdleExp
	}
	n := len(t.order)
	if n%rowChunk == 0 && n/rowChunk == len(t.chunks) {
		t.chunks = append(t.chunks, make([]tableRow, rowChunk))
	}
	t.chunks[n/rowChunk][n%rowChunk] = r
	t.order = append(t.order, uint32(n))
}

func (t *TableWriter) row(i uint32) *tableRow { return &t.chunks[i/rowChunk][i%rowChunk] }

// Reset forgets the rows (a dump read again).
func (t *TableWriter) Reset() { t.order = t.order[:0] }

var tableHeader = [...]string{"STATE", "OWNER", "DIR", "LOCAL", "REMOTE", "UID", "IDLE", "HOLDS", "INODE"}

// cells appends row r's cells to b, and returns where each ends.
func (r *tableRow) cells(b []byte) ([]byte, [len(tableHeader)]int) {
	var ends [len(tableHeader)]int
	cell := func(i int) { ends[i] = len(b) }
	b = append(b, r.state.String()...)
	cell(0)
	b = append(b, r.owner.String()...)
	cell(1)
	b = append(b, r.dir.String()...)
	cell(2)
	b = r.localAddr().AppendTo(b)
	cell(3)
	if r.state == tcpstate.Listen {
		b = append(b, '*')
	} else {
		b = r.remoteAddr().AppendTo(b)
	}
	cell(4)
	b = strconv.AppendUint(b, uint64(r.uid), 10)
	cell(5)
	if r.idleMS >= 0 && r.state != tcpstate.Listen {
		b = append(b, (time.Duration(r.idleMS) * time.Millisecond).String()...)
	} else {
		b = append(b, '-')
	}
	cell(6)
	switch {
	case r.bits&rowHolds != 0:
		b = append(b, "yes"...)
	case r.bits&rowIdleExp != 0:
		b = append(b, "idle"...)
	case r.state == tcpstate.Listen:
		b = append(b, '-')
	default:
		b = append(b, "no"...)
	}
	cell(7)
	b = strconv.AppendUint(b, uint64(r.inode), 10)
	cell(8)
	return b, ends
}

// End sorts and writes the rows, then the summary line of namespace.
func (t *TableWriter) End(w io.Writer, namespace string, s *flows.Summary) error {
	slices.SortStableFunc(t.order, func(i, j uint32) int {
		a, b := t.row(i), t.row(j)
		if la, lb := a.state == tcpstate.Listen, b.state == tcpstate.Listen; la != lb {
			if la {
				return -1
			}
			return 1
		}
		if a.owner != b.owner {
			return int(a.owner) - int(b.owner)
		}
		if c := flows.ComparePacked(a.bits&3, &a.local, a.lport, b.bits&3, &b.local, b.lport); c != 0 {
			return c
		}
		return flows.ComparePacked(a.bits>>2&3, &a.remote, a.rport, b.bits>>2&3, &b.remote, b.rport)
	})
	// Column widths: the widest cell plus two spaces (the last column is
	// not padded).
	var width [len(tableHeader)]int
	for i, h := range tableHeader {
		width[i] = len(h)
	}
	var b []byte
	for _, i := range t.order {
		var ends [len(tableHeader)]int
		b, ends = t.row(i).cells(b[:0])
		start := 0
		for c, end := range ends {
			width[c] = max(width[c], end-start)
			start = end
		}
	}
	out := make([]byte, 0, flushAt+1024)
	pad := func(cell []byte, c int) {
		out = append(out, cell...)
		if c < len(tableHeader)-1 {
			for range width[c] + 2 - len(cell) {
				out = append(out, ' ')
			}
		}
	}
	for c, h := range tableHeader {
		pad([]byte(h), c)
	}
	out = append(out, '\n')
	for _, i := range t.order {
		var ends [len(tableHeader)]int
		b, ends = t.row(i).cells(b[:0])
		start := 0
		for c, end := range ends {
			pad(b[start:end], c)
			start = end
		}
		out = append(out, '\n')
		if len(out) >= flushAt {
			if _, err := w.Write(out); err != nil {
				return err
			}
			out = out[:0]
		}
	}
	out = append(out, '\n')
	out = append(out, printable(namespace)...)
	out = append(out, ": "...)
	out = append(out, summaryFields(s)...)
	out = append(out, '\n')
	_, err := w.Write(out)
	return err
}

func summaryFields(s *flows.Summary) string {
	return "app_listeners=" + strconv.Itoa(s.AppListeners) + " app_inbound=" + strconv.Itoa(s.AppInbound) +
		" app_outbound=" + strconv.Itoa(s.AppOutbound) + " app_idle=" + strconv.Itoa(s.AppIdle) +
		" proxy_listeners=" + strconv.Itoa(s.ProxyListeners) + " proxy_flows=" + strconv.Itoa(s.ProxyFlows) +
		" (inbound " + strconv.Itoa(s.ProxyInbound) + ", outbound " + strconv.Itoa(s.ProxyOutbound) + ")" +
		" proxy_idle=" + strconv.Itoa(s.ProxyIdle) + " control=" + strconv.Itoa(s.Control) + " closing=" + strconv.Itoa(s.Closing)
}

// WriteTable writes a whole snapshot as TableWriter does.
func WriteTable(w io.Writer, snap *flows.Snapshot) error {
	var t TableWriter
	for i := range snap.Listeners {
		t.Add(&snap.Listeners[i])
	}
	for i := range snap.Flows {
		t.Add(&snap.Flows[i])
	}
	return t.End(w, snap.Namespace, &snap.Summary)
}
