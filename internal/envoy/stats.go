package envoy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
)

// Stat is one counter or gauge. The text and JSON formats do not say which.
type Stat struct {
	Name  string
	Value uint64
}

// StatsQuery is what /stats is asked for.
type StatsQuery struct {
	// UsedOnly hides stats that never changed (the bare usedonly flag).
	UsedOnly bool
	// Filter is an RE2 regular expression, matched partially against each
	// name: use ^...$ for an exact match. Envoy answers 400 to a bad one.
	Filter string
	// Format is "" or "text" (the default text format) or "json".
	Format string
	// Type is "" (all) or one of Envoy's words: "Counters", "Gauges",
	// "Histograms", "TextReadouts", "All".
	Type string
}

func (q StatsQuery) encode() string {
	var parts []string
	if q.UsedOnly {
		parts = append(parts, "usedonly")
	}
	if q.Filter != "" {
		parts = append(parts, "filter="+escape(q.Filter))
	}
	if q.Format != "" {
		parts = append(parts, "format="+escape(q.Format))
	}
	if q.Type != "" {
		parts = append(parts, "type="+escape(q.Type))
	}
	return strings.Join(parts, "&")
}

// Stats returns the counters and gauges /stats answers, in Envoy's order.
// Text readouts and histograms are skipped.
func (c *Client) Stats(ctx context.Context, q StatsQuery) ([]Stat, error) {
	var parse func([]byte) ([]Stat, error)
	switch q.Format {
	case "", "text":
		parse = ParseStatsText
	case "json":
		parse = ParseStatsJSON
	default:
		return nil, fmt.Errorf("envoy admin: stats format %q: only text and json are parsed", q.Format)
	}
	_, body, err := c.do(ctx, request{method: "GET", path: "/stats", query: q.encode(), repeatable: true})
	if err != nil {
		return nil, err
	}
	stats, err := parse(body)
	if err != nil {
		return nil, fmt.Errorf("envoy admin: GET /stats: %w", err)
	}
	return stats, nil
}

// Stat returns one counter's or gauge's value, asked for by exact name and
// without usedonly, so a stat Envoy has is found even if it never changed.
// A stat Envoy does not have is [ErrStatAbsent].
func (c *Client) Stat(ctx context.Context, name string) (uint64, error) {
	stats, err := c.Stats(ctx, StatsQuery{Filter: "^" + regexp.QuoteMeta(name) + "$"})
	if err != nil {
		return 0, err
	}
	for _, s := range stats {
		if s.Name == name {
			return s.Value, nil
		}
	}
	return 0, fmt.Errorf("envoy admin: %s: %w", name, ErrStatAbsent)
}

// malformed makes an ErrMalformed error.
func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

// ParseStatsText parses Envoy's text stats format. An empty body is no stats
// and no error (a filter may match nothing).
func ParseStatsText(b []byte) ([]Stat, error) {
	stats := []Stat{}
	lineNo := 0
	readout := 0 // line where an unterminated multi-line text readout began
	for len(b) > 0 {
		var line []byte
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			line, b = b, nil
		}
		lineNo++
		line = bytes.TrimSuffix(line, []byte{'\r'})
		if readout > 0 {
			// A text readout's value holds a newline: its lines run to the
			// one that ends with the closing quote.
			if bytes.HasSuffix(line, []byte{'"'}) {
				readout = 0
			}
			continue
		}
		if len(line) == 0 {
			continue
		}
		i := bytes.Index(line, []byte(": "))
		if i <= 0 {
			return nil, malformed("stats line %d: no \"name: value\": %q", lineNo, truncate(line, 80))
		}
		name, value := line[:i], line[i+2:]
		if !validName(name) {
			return nil, malformed("stats line %d: bad stat name %q", lineNo, truncate(name, 80))
		}
		switch {
		case len(value) > 0 && value[0] == '"':
			if len(value) == 1 || value[len(value)-1] != '"' {
				readout = lineNo
			}
		case isHistogram(value):
		default:
			v, err := strconv.ParseUint(string(value), 10, 64)
			if err != nil {
				return nil, malformed("stats line %d: %s: value %q is not a uint64", lineNo, name, truncate(value, 80))
			}
			stats = append(stats, Stat{Name: string(name), Value: v})
		}
	}
	if readout > 0 {
		return nil, malformed("stats line %d: unterminated text readout", readout)
	}
	return stats, nil
}

// validName accepts what Envoy's names are made of: no spaces, no control
// characters, no quotes.
func validName(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c == 0x7f || c == '"' {
			return false
		}
	}
	return len(b) > 0
}

// isHistogram recognises a text histogram summary: "No recorded values", or
// space-separated quantiles or buckets like P0(nan,1) P99.5(1.5,2) B0.5(0,0).
func isHistogram(v []byte) bool {
	if string(v) == "No recorded values" {
		return true
	}
	if len(v) == 0 {
		return false
	}
	for _, f := range bytes.Split(v, []byte{' '}) {
		if len(f) < 4 || (f[0] != 'P' && f[0] != 'B') || f[len(f)-1] != ')' {
			return false
		}
		open := bytes.IndexByte(f, '(')
		if open < 2 || bytes.IndexByte(f[open+1:len(f)-1], '(') >= 0 || bytes.IndexByte(f[open+1:len(f)-1], ')') >= 0 {
			return false
		}
	}
	return true
}

// ParseStatsJSON parses /stats?format=json: {"stats":[{"name":..,"value":N}]},
// skipping text readouts (string values) and the histograms element.
func ParseStatsJSON(b []byte) ([]Stat, error) {
	var doc struct {
		Stats *[]map[string]json.RawMessage `json:"stats"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&doc); err != nil {
		return nil, malformed("stats json: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, malformed("stats json: data after the document")
	}
	if doc.Stats == nil {
		return nil, malformed("stats json: no \"stats\" array")
	}
	stats := make([]Stat, 0, len(*doc.Stats))
	for i, e := range *doc.Stats {
		rawName, hasName := e["name"]
		if !hasName {
			if _, ok := e["histograms"]; ok {
				continue
			}
			return nil, malformed("stats json: element %d has no name", i)
		}
		var name string
		if err := json.Unmarshal(rawName, &name); err != nil || name == "" {
			return nil, malformed("stats json: element %d: bad name %s", i, truncate(rawName, 80))
		}
		raw := bytes.TrimSpace(e["value"])
		if len(raw) > 0 && raw[0] == '"' {
			continue // text readout
		}
		v, err := strconv.ParseUint(string(raw), 10, 64)
		if err != nil {
			return nil, malformed("stats json: %s: value %q is not a uint64", name, truncate(raw, 80))
		}
		stats = append(stats, Stat{Name: name, Value: v})
	}
	return stats, nil
}
