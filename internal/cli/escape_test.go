package cli

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/appprocs"
	"github.com/draind/draind/internal/cri"
	"github.com/draind/draind/internal/flows"
)

func TestPrintable(t *testing.T) {
	for in, want := range map[string]string{
		"web-1":                 "web-1",
		"café → ok":             "café → ok",
		"\x1b[2J\x1b]0;pwn\x07": `\x1b[2J\x1b]0;pwn\a`,
		"a\tb\nc\rd":            `a\tb\nc\rd`,
		"\x7f":                  `\x7f`,
		"\xc2\x9b31m":           `\u009b31m`, // C1 CSI, valid UTF-8
		"\x9b31m":               `\x9b31m`,   // a lone byte: invalid UTF-8
		"abc\u202edef":          `abc\u202edef`,
		`a\x1b`:                 `a\\x1b`, // a backslash is escaped: no forged escape reads as a real one
	} {
		if got := printable(in); got != want {
			t.Errorf("printable(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestCell(t *testing.T) {
	if got := cell("short", 10); got != "short" {
		t.Errorf("cell = %q", got)
	}
	if got := cell(strings.Repeat("é", 20), 10); got != strings.Repeat("é", 9)+"…" {
		t.Errorf("cell = %q", got)
	}
	if got := cell(strings.Repeat("\x1b", 20), 10); got != strings.Repeat(`\x1b`, 2)+`\…` {
		t.Errorf("cell = %q", got)
	}
	if got := cell("ab", 2); got != "ab" || utf8.RuneCountInString(cell("abc", 2)) != 2 {
		t.Errorf("cell at the width: %q, %q", got, cell("abc", 2))
	}
}

// hostile is what a tenant names a process, or has its draind answer:
// clear the screen, retitle the terminal, a C1 CSI, a bidi override, a
// tab and a newline that would break the table's lines.
const hostile = "\x1b[2J\x1b]0;pwned\x07\u009b31m\u202e\tx\ny"

// wantClean fails unless out has no control byte but its own line ends
// and holds the escaped form of hostile.
func wantClean(t *testing.T, what, out string) {
	t.Helper()
	for i, r := range out {
		if r != '\n' && (r < 0x20 || r == 0x7f || r >= 0x80 && r < 0xa0 || r == '\u202e') {
			t.Errorf("%s: a raw %U at %d:\n%q", what, r, i, out)
			return
		}
	}
	if !strings.Contains(out, `\x1b[2J`) && !strings.Contains(out, `\x1b]0;`) {
		t.Errorf("%s: the escaped name is not there:\n%q", what, out)
	}
}

// TestTablesEscape: strings from a pod, the runtime and the kernel are
// escaped in every table (pods, conns --procs, conns' summary, watch's
// process line) and cut to their cell; the pod's error body, up to 1 MiB
// before, takes one cell. -o json stays exact.
func TestTablesEscape(t *testing.T) {
	body := strings.Repeat(hostile, 1<<20/len(hostile))
	v := nodeView{Runtime: "containerd " + hostile, TimeoutMS: 1000, CRI: cri.Endpoint{Address: "unix:///" + hostile, Why: "kubelet pid 7 " + hostile},
		Pods: []podRow{
			{Namespace: "a", Name: hostile, Draind: &draindRef{Container: hostile, StatusAddr: "127.0.0.1:15020"},
				State: &agent.PodState{Phase: hostile, Trigger: hostile, Holds: []agent.PodHold{{Kind: hostile, What: hostile}}}},
			{Namespace: "a", Name: "errs", Draind: &draindRef{Container: "envoy", StatusAddr: "127.0.0.1:15020"},
				Error: "draind at 127.0.0.1:15020: answered 500: " + body},
			{Namespace: "a", Name: "ended", State: &agent.PodState{Phase: "exited", End: &agent.PodEnd{Why: hostile}}},
		}}
	var b bytes.Buffer
	if err := writeNodeView(&b, &v); err != nil {
		t.Fatal(err)
	}
	wantClean(t, "pods", b.String())
	if lines := strings.Count(b.String(), "\n"); lines != 5 {
		t.Errorf("pods: %d lines, want 5 (the header, the columns, a line a pod):\n%s", lines, b.String())
	}
	if c := podCells(&v.Pods[1]); utf8.RuneCountInString(c[6]) > errorWidth {
		t.Errorf("the error cell has %d runes, want at most %d", utf8.RuneCountInString(c[6]), errorWidth)
	}
	j, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	var back nodeView
	if err := json.Unmarshal(j, &back); err != nil || back.Pods[0].Name != hostile || back.Pods[1].Error != v.Pods[1].Error || back.CRI.Why != v.CRI.Why {
		t.Errorf("pods -o json is not exact: %v", err)
	}

	procs := []appprocs.Process{{PID: 42, PPID: 1, UID: 1000, Comm: hostile}}
	b.Reset()
	if err := writeProcs(&b, procs, "proc: "+hostile); err != nil {
		t.Fatal(err)
	}
	wantClean(t, "conns --procs", b.String())
	b.Reset()
	printProcs(&b, outputTable, procs, hostile)
	wantClean(t, "watch", b.String())

	var tw TableWriter
	b.Reset()
	if err := tw.End(&b, "pod a/"+hostile, &flows.Summary{}); err != nil {
		t.Fatal(err)
	}
	wantClean(t, "conns' summary", b.String())
	b.Reset()
	if err := WriteJSON(&b, &flows.Snapshot{Namespace: hostile}); err != nil {
		t.Fatal(err)
	}
	var snap struct{ Namespace string }
	if err := json.Unmarshal(b.Bytes(), &snap); err != nil || snap.Namespace != hostile {
		t.Errorf("conns -o json: %q, %v; want the namespace exact", snap.Namespace, err)
	}
}
