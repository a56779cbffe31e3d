// Command testsummary runs a `go test -json` command line (its arguments),
// prints what go test prints without -json (each package's result, the
// output of the tests that failed), and ends by naming the tests that
// skipped, grouped by the reason they gave: a run that passes while a suite
// skipped (a test peer not built, no root) says so. Its exit status is the
// command's (1 if the command exits 0 but a test failed). `make test` uses it.
package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"slices"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: testsummary go test -json [flags] [packages]")
		os.Exit(2)
	}
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

func run(args []string, stdout, stderr io.Writer) int {
	// ^C goes to go test too: let it end and report, then summarise.
	signal.Notify(make(chan os.Signal, 1), os.Interrupt)
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Stdin = os.Stdin
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintln(stderr, "testsummary:", err)
		return 1
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(stderr, "testsummary:", err)
		return 1
	}
	s := newSummary(stdout)
	readErr := s.read(out)
	err = cmd.Wait()
	s.printSkips()
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		return exit.ExitCode()
	case err != nil:
		fmt.Fprintln(stderr, "testsummary:", err)
		return 1
	case readErr != nil:
		fmt.Fprintln(stderr, "testsummary: read go test's output:", readErr)
		return 1
	case s.failed:
		return 1
	}
	return 0
}

// event is one line of `go test -json` (`go doc test2json` has the format).
type event struct {
	Action  string
	Package string
	Test    string
	Output  string
}

// module is left out of the package paths the summary names.
const module = "github.com/draind/draind"

type testKey struct{ pkg, test string }

type skip struct {
	testKey
	reason string
}

type summary struct {
	w      io.Writer
	output map[testKey][]string // the output of each running test
	skips  []skip
	failed bool
}

func newSummary(w io.Writer) *summary {
	return &summary{w: w, output: map[testKey][]string{}}
}

func (s *summary) read(r io.Reader) error {
	br := bufio.NewReader(r)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			s.line(line)
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

func (s *summary) line(line []byte) {
	var e event
	if len(line) == 0 || line[0] != '{' || json.Unmarshal(line, &e) != nil {
		s.w.Write(line) // not go test's JSON: pass it on
		return
	}
	k := testKey{e.Package, e.Test}
	switch e.Action {
	case "build-output":
		fmt.Fprint(s.w, e.Output)
	case "build-fail":
		s.failed = true
	case "output":
		if e.Test != "" {
			s.output[k] = append(s.output[k], e.Output)
			return
		}
		if strings.HasPrefix(e.Output, "FAIL") {
			s.flush(e.Package) // tests a panic or timeout cut short
		}
		if e.Output != "PASS\n" {
			fmt.Fprint(s.w, e.Output)
		}
	case "fail":
		s.failed = true
		if e.Test == "" {
			s.flush(e.Package)
			return
		}
		fmt.Fprint(s.w, strings.Join(s.output[k], ""))
		delete(s.output, k)
	case "pass":
		delete(s.output, k)
	case "skip":
		if e.Test != "" {
			s.skips = append(s.skips, skip{k, skipReason(s.output[k])})
			delete(s.output, k)
		}
	}
}

// flush prints the output of pkg's tests that never ended.
func (s *summary) flush(pkg string) {
	var keys []testKey
	for k := range s.output {
		if k.pkg == pkg {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b testKey) int { return strings.Compare(a.test, b.test) })
	for _, k := range keys {
		fmt.Fprint(s.w, strings.Join(s.output[k], ""))
		delete(s.output, k)
	}
}

// A log line's prefix: indentation, the test file's name, its line, ": ".
var logPrefix = regexp.MustCompile(`^\s*[\w.-]+\.go:\d+: `)

// skipReason is what a skipped test said, less go test's own lines.
func skipReason(output []string) string {
	var said []string
	for _, l := range output {
		if strings.HasPrefix(l, "=== ") || strings.HasPrefix(strings.TrimSpace(l), "--- SKIP") {
			continue
		}
		if l = strings.TrimSpace(logPrefix.ReplaceAllString(l, "")); l != "" {
			said = append(said, l)
		}
	}
	if len(said) == 0 {
		return "(no reason given)"
	}
	return strings.Join(said, " / ")
}

// printSkips names the skipped tests, grouped by reason in the order the
// reasons came.
func (s *summary) printSkips() {
	if len(s.skips) == 0 {
		return
	}
	var reasons []string
	byReason := map[string][]string{}
	for _, sk := range s.skips {
		if _, ok := byReason[sk.reason]; !ok {
			reasons = append(reasons, sk.reason)
		}
		pkg := strings.TrimPrefix(sk.pkg, module+"/")
		byReason[sk.reason] = append(byReason[sk.reason], pkg+"."+sk.test)
	}
	fmt.Fprintf(s.w, "\nskipped (%d):\n", len(s.skips))
	for _, r := range reasons {
		fmt.Fprintf(s.w, "  %s\n", r)
		line := ""
		for _, name := range byReason[r] {
			if line != "" && len(line)+1+len(name) > 100 {
				fmt.Fprintf(s.w, "      %s\n", line)
				line = ""
			}
			line = strings.TrimPrefix(line+" "+name, " ")
		}
		fmt.Fprintf(s.w, "      %s\n", line)
	}
}
