package cli

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// printable is s as a table prints it: control characters (C0, DEL, C1),
// Unicode format characters (bidirectional overrides, zero-width ones),
// invalid UTF-8 and the backslash itself as Go writes them in a string
// literal (\x1b, \t, \u009b, \u202e, \xff, \\). A process name, a pod's
// answer or a runtime's string cannot then move the cursor, clear the
// screen, retitle the terminal or break a table's line; -o json keeps the
// string exact instead.
func printable(s string) string {
	i := 0
	for i < len(s) && s[i] >= 0x20 && s[i] < 0x7f && s[i] != '\\' {
		i++
	}
	if i == len(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b.WriteString(`\x`)
			b.WriteString(strconv.FormatUint(uint64(s[i])>>4, 16))
			b.WriteString(strconv.FormatUint(uint64(s[i])&0xf, 16))
		case r == '\\':
			b.WriteString(`\\`)
		case r < 0x80 && (r < 0x20 || r == 0x7f):
			q := strconv.QuoteRune(r) // '\x1b', '\t'
			b.WriteString(q[1 : len(q)-1])
		case unicode.IsControl(r) || unicode.Is(unicode.Cf, r):
			q := strconv.QuoteRuneToASCII(r) // '\u009b'
			b.WriteString(q[1 : len(q)-1])
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}

// cell is printable(s) cut to width runes, its last "…" when cut: a
// string from outside takes one table line, and at most its cell.
func cell(s string, width int) string {
	p := printable(s)
	if utf8.RuneCountInString(p) <= width {
		return p
	}
	n := 0
	for i := range p {
		if n == width-1 {
			return p[:i] + "…"
		}
		n++
	}
	return p
}
