package envoysim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// kind is a stat's type.
type kind uint8

const (
	counterKind kind = iota
	gaugeKind
)

// metric is one counter or gauge. used records whether it ever changed:
// usedonly hides the others.
type metric struct {
	kind kind
	v    atomic.Uint64
	used atomic.Bool
}

func (m *metric) add(n uint64) { m.v.Add(n); m.used.Store(true) }
func (m *metric) inc()         { m.add(1) }
func (m *metric) dec()         { m.v.Add(^uint64(0)); m.used.Store(true) }
func (m *metric) set(n uint64) { m.v.Store(n); m.used.Store(true) }
func (m *metric) get() uint64  { return m.v.Load() }

// histogram is a histogram with at most one summary: what the sim records
// (server.initialization_time_ms) is recorded once.
type histogram struct {
	mu     sync.Mutex
	values []float64
}

func (h *histogram) record(v float64) {
	h.mu.Lock()
	h.values = append(h.values, v)
	h.mu.Unlock()
}

var quantiles = []float64{0, 25, 50, 75, 90, 95, 99, 99.5, 99.9, 100}

// summary returns each quantile's value, or nil with no values.
func (h *histogram) summary() []float64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.values) == 0 {
		return nil
	}
	v := slices.Clone(h.values)
	slices.Sort(v)
	out := make([]float64, len(quantiles))
	for i, q := range quantiles {
		idx := int(q / 100 * float64(len(v)-1))
		out[i] = v[idx]
	}
	return out
}

// store holds every stat by name.
type store struct {
	mu         sync.Mutex
	metrics    map[string]*metric
	histograms map[string]*histogram
	include    func(name string) bool // the stats matcher; nil keeps all
}

func newStore(in *StatsInclusion) *store {
	st := &store{metrics: map[string]*metric{}, histograms: map[string]*histogram{}}
	if in != nil {
		st.include = in.matcher()
	}
	return st
}

// matcher compiles an inclusion list (regexes were checked by withDefaults).
func (in *StatsInclusion) matcher() func(string) bool {
	var res []*regexp.Regexp
	for _, r := range in.Regexes {
		res = append(res, regexp.MustCompile(`^(?:`+r+`)$`))
	}
	return func(name string) bool {
		for _, p := range in.Prefixes {
			if strings.HasPrefix(name, p) {
				return true
			}
		}
		for _, s := range in.Suffixes {
			if strings.HasSuffix(name, s) {
				return true
			}
		}
		for _, re := range res {
			if re.MatchString(name) {
				return true
			}
		}
		return false
	}
}

// get returns the named stat. A stat the matcher rejects is still counted,
// by the caller, but exists nowhere: as Envoy's null stats.
func (st *store) get(name string, k kind) *metric {
	if st.include != nil && !st.include(name) {
		return &metric{kind: k}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	m, ok := st.metrics[name]
	if !ok {
		m = &metric{kind: k}
		st.metrics[name] = m
	}
	return m
}

func (st *store) counter(name string) *metric { return st.get(name, counterKind) }
func (st *store) gauge(name string) *metric   { return st.get(name, gaugeKind) }

func (st *store) histogram(name string) *histogram {
	if st.include != nil && !st.include(name) {
		return &histogram{}
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	h, ok := st.histograms[name]
	if !ok {
		h = &histogram{}
		st.histograms[name] = h
	}
	return h
}

func (st *store) lookup(name string) (uint64, bool) {
	st.mu.Lock()
	m, ok := st.metrics[name]
	st.mu.Unlock()
	if !ok {
		return 0, false
	}
	return m.get(), true
}

// statsParams are /stats' query parameters, parsed as Envoy parses them.
type statsParams struct {
	usedOnly bool
	filter   *regexp.Regexp
	typ      string // All, Counters, Gauges, Histograms, TextReadouts
	format   string // text, json, prometheus, html, active-html
}

// parseStatsParams returns the params, or a 400 body.
func parseStatsParams(q map[string][]string) (statsParams, string) {
	p := statsParams{typ: "All", format: "text"}
	_, p.usedOnly = q["usedonly"]
	if f, ok := q["filter"]; ok && len(f) > 0 {
		re, err := regexp.Compile(f[0]) // Go's regexp is RE2
		if err != nil {
			return p, "Invalid re2 regex"
		}
		p.filter = re
	}
	if t, ok := q["type"]; ok && len(t) > 0 {
		switch t[0] {
		case "All", "Counters", "Gauges", "Histograms", "TextReadouts":
			p.typ = t[0]
		default:
			return p, "invalid &type= param"
		}
	}
	if f, ok := q["format"]; ok && len(f) > 0 {
		switch f[0] {
		case "text", "json", "prometheus", "html", "active-html":
			p.format = f[0]
		default:
			return p, "usage: /stats?format=(html|active-html|json|prometheus|text)\n\n"
		}
	}
	return p, ""
}

type sample struct {
	name string
	kind kind
	v    uint64
}

type histSample struct {
	name string
	q    []float64 // nil: no recorded values
}

// snapshot selects and sorts what a /stats request shows.
func (st *store) snapshot(p statsParams) ([]sample, []histSample) {
	st.mu.Lock()
	var out []sample
	for name, m := range st.metrics {
		if p.usedOnly && !m.used.Load() {
			continue
		}
		if p.filter != nil && !p.filter.MatchString(name) {
			continue
		}
		if p.typ == "Counters" && m.kind != counterKind || p.typ == "Gauges" && m.kind != gaugeKind ||
			p.typ == "Histograms" || p.typ == "TextReadouts" {
			continue
		}
		out = append(out, sample{name, m.kind, m.get()})
	}
	var hs []histSample
	var hnames []string
	for name := range st.histograms {
		hnames = append(hnames, name)
	}
	hists := st.histograms
	st.mu.Unlock()
	if p.typ == "All" || p.typ == "Histograms" {
		for _, name := range hnames {
			if p.filter != nil && !p.filter.MatchString(name) {
				continue
			}
			q := hists[name].summary()
			if p.usedOnly && q == nil {
				continue
			}
			hs = append(hs, histSample{name, q})
		}
	}
	slices.SortFunc(out, func(a, b sample) int { return strings.Compare(a.name, b.name) })
	slices.SortFunc(hs, func(a, b histSample) int { return strings.Compare(a.name, b.name) })
	return out, hs
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', 6, 64) }

// renderText writes Envoy's text format: (text readouts, none here),
// counters and gauges in name order, then histograms.
func renderText(samples []sample, hs []histSample) []byte {
	var b bytes.Buffer
	for _, s := range samples {
		b.WriteString(s.name)
		b.WriteString(": ")
		b.WriteString(strconv.FormatUint(s.v, 10))
		b.WriteByte('\n')
	}
	for _, h := range hs {
		b.WriteString(h.name)
		b.WriteString(": ")
		if h.q == nil {
			b.WriteString("No recorded values")
		} else {
			for i, q := range quantiles {
				if i > 0 {
					b.WriteByte(' ')
				}
				// Envoy prints (interval,cumulative); no flush has run an
				// interval here, so the interval part is nan.
				fmt.Fprintf(&b, "P%s(nan,%s)", fmtFloat(q), fmtFloat(h.q[i]))
			}
		}
		b.WriteByte('\n')
	}
	return b.Bytes()
}

// renderJSON writes {"stats":[{"name":..,"value":N},...,{"histograms":...}]}.
func renderJSON(samples []sample, hs []histSample) []byte {
	type nv struct {
		Name  string `json:"name"`
		Value uint64 `json:"value"`
	}
	type qv struct {
		Interval   *float64 `json:"interval"`
		Cumulative *float64 `json:"cumulative"`
	}
	type cq struct {
		Name   string `json:"name"`
		Values []qv   `json:"values"`
	}
	type hists struct {
		Supported []float64 `json:"supported_quantiles"`
		Computed  []cq      `json:"computed_quantiles"`
	}
	var elems []any
	for _, s := range samples {
		elems = append(elems, nv{s.name, s.v})
	}
	if len(hs) > 0 {
		h := hists{Supported: quantiles, Computed: []cq{}}
		for _, x := range hs {
			c := cq{Name: x.name, Values: []qv{}}
			for i := range quantiles {
				var v qv
				if x.q != nil {
					f := x.q[i]
					v.Cumulative = &f
				}
				c.Values = append(c.Values, v)
			}
			h.Computed = append(h.Computed, c)
		}
		elems = append(elems, map[string]any{"histograms": h})
	}
	if elems == nil {
		elems = []any{}
	}
	b, _ := json.Marshal(map[string]any{"stats": elems})
	return append(b, '\n')
}

// renderPrometheus writes a Prometheus text exposition. Envoy extracts tags
// into labels (envoy_listener_address="..."); the sim does not: each stat
// is one untagged envoy_<name> series.
func renderPrometheus(samples []sample) []byte {
	var b bytes.Buffer
	for _, s := range samples {
		name := "envoy_" + promName(s.name)
		typ := "counter"
		if s.kind == gaugeKind {
			typ = "gauge"
		}
		fmt.Fprintf(&b, "# TYPE %s %s\n%s{} %d\n", name, typ, name, s.v)
	}
	return b.Bytes()
}

func promName(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

// resetCounters sets every counter to zero (/reset_counters).
func (st *store) resetCounters() {
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, m := range st.metrics {
		if m.kind == counterKind {
			m.v.Store(0)
		}
	}
}

// renderHTML writes the stats as an HTML page, as official Envoy builds
// answer /stats?format=html (active-html is a page that fetches them again
// with JSON; the sim serves the same static page for it).
func renderHTML(samples []sample, hs []histSample) []byte {
	var b bytes.Buffer
	b.WriteString("<!DOCTYPE html>\n<html lang='en'>\n<head><title>Envoy Admin</title></head>\n<body>\n<pre>\n")
	template.HTMLEscape(&b, renderText(samples, hs))
	b.WriteString("</pre>\n</body>\n</html>\n")
	return b.Bytes()
}
