package kubeevents

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/draind/draind/internal/drain"
)

// The Events' types, as Kubernetes names them.
const (
	TypeNormal  = "Normal"
	TypeWarning = "Warning"
)

// The Events' reasons: short CamelCase, stable (what `kubectl get events
// --field-selector reason=...` and alerts match on).
const (
	ReasonStarted = "DrainStarted"
	// ReasonDrained means the gate opened (the app done, Envoy drained) and
	// the proxy stopped when asked.
	ReasonDrained = "Drained"
	// ReasonCut means the deadline ended the drain with work still open.
	ReasonCut = "DrainCut"
	// ReasonIncomplete means the drain ended otherwise uncleanly (the proxy
	// left on its own, had to be killed, or was stopped by
	// /quitquitquit).
	ReasonIncomplete = "DrainIncomplete"
)

// MaxMessage is the longest message posted, in bytes: the API server's
// limit on an Event's note.
const MaxMessage = 1024

// Text is what one Event says.
type Text struct {
	Type, Reason, Message string
}

// BeganText is the drain's start: its trigger, the pod's shape, and how
// long draind waits for the app's work at most.
func BeganText(st drain.State) Text {
	msg := fmt.Sprintf("Drain started by %s (pod shape %s): readiness fails, Envoy drains its listeners", st.Cause, st.Shape.Name())
	if !st.Deadline.IsZero() {
		msg += fmt.Sprintf("; draind waits for the app's work at most %s (until %s UTC), then stops the proxy",
			round(st.Deadline.Sub(st.Triggered)), st.Deadline.UTC().Format(time.TimeOnly))
	}
	return Text{Type: TypeNormal, Reason: ReasonStarted, Message: clip(msg)}
}

// EndedText is the drain's end: how long it took, what held it and for
// how long, what the deadline cut, and how the proxy stopped. A Warning
// when cut or not clean.
func EndedText(st drain.State) Text {
	e := st.End
	if e == nil {
		e = &drain.StateEnd{Why: "unknown"}
	}
	var b strings.Builder
	t := Text{Type: TypeNormal, Reason: ReasonDrained}
	switch {
	case e.Cut:
		t.Type, t.Reason = TypeWarning, ReasonCut
		fmt.Fprintf(&b, "Drain cut by the deadline after %s: %s still open, %s still running", round(e.Took),
			plural(e.OpenFlows, "flow"), plural(e.AppProcesses, "app process"))
	case !e.Clean:
		t.Type, t.Reason = TypeWarning, ReasonIncomplete
		fmt.Fprintf(&b, "Drain incomplete after %s", round(e.Took))
	default:
		fmt.Fprintf(&b, "Drained in %s", round(e.Took))
	}
	if longest, ok := st.Longest(); ok {
		fmt.Fprintf(&b, "; held longest by %s (%s)", longest.Kind, round(longest.For))
		// Every kind that held, but not those that held for no time a
		// person reads (a --min-drain 0 is a hold of a moment).
		var held []string
		for _, h := range st.Held {
			if round(h.For) > 0 {
				held = append(held, fmt.Sprintf("%s %s", h.Kind, round(h.For)))
			}
		}
		if len(held) > 1 {
			b.WriteString("; held by " + strings.Join(held, ", "))
		}
	} else {
		b.WriteString("; nothing held it")
	}
	fmt.Fprintf(&b, "; proxy stopped: %s", e.Why)
	if e.ExitCodeKnown {
		fmt.Fprintf(&b, " (exit code %d)", e.ExitCode)
	}
	t.Message = clip(b.String())
	return t
}

// round keeps milliseconds: what a person reads of a drain.
func round(d time.Duration) time.Duration { return d.Round(time.Millisecond) }

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	if strings.HasSuffix(what, "s") {
		return fmt.Sprintf("%d %ses", n, what)
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// clip keeps a message within MaxMessage bytes, whole runes only.
func clip(s string) string {
	if len(s) <= MaxMessage {
		return s
	}
	cut := MaxMessage - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}
