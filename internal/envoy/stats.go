package envoy

import (
	"bytes"
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
)

// stat is one counter or gauge. The text format does not say which.
type stat struct {
	name  string
	value uint64
}

// stats asks GET /stats?[usedonly&]filter=F and returns its counters and
// gauges in Envoy's order (text readouts and histograms skipped).
func (c *Client) stats(ctx context.Context, filter string, usedOnly bool) ([]stat, error) {
	q := "filter=" + escape(filter)
	if usedOnly {
		q = "usedonly&" + q
	}
	_, body, err := c.do(ctx, request{method: "GET", path: "/stats", query: q, repeatable: true})
	if err != nil {
		return nil, err
	}
	stats, err := parseStatsText(body)
	if err != nil {
		return nil, fmt.Errorf("envoy admin: GET /stats: %w", err)
	}
	return stats, nil
}

// malformed makes an ErrMalformed error.
func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

// parseStatsText parses Envoy's text stats format: quoted text readouts
// first (a value may span lines), then counters and gauges as
// "name: uint64" in name order, then histograms ("P0(nan,1) P25(...)" or
// "No recorded values"). Readouts and histograms are recognised and
// skipped; any other line is an error. An empty body is no stats and no
// error (a filter may match nothing).
func parseStatsText(b []byte) ([]stat, error) {
	stats := []stat{}
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
			stats = append(stats, stat{name: string(name), value: v})
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

// escape is url.QueryEscape with spaces as %20, which every Envoy version
// decodes the same way.
func escape(s string) string {
	return strings.ReplaceAll(url.QueryEscape(s), "+", "%20")
}
