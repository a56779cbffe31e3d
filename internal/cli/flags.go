package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/draind/draind/internal/flows"
)

// flagSet is a flag.FlagSet whose flags have environment twins:
// --min-drain ↔ DRAIND_MIN_DRAIN, plus aliases (Istio's names) where they
// mean the same. A flag on the command line beats its env twin, which beats
// an alias, which beats the default.
type flagSet struct {
	*flag.FlagSet
	aliases    map[string][]envAlias // flag name → other variables that set it
	source     map[string]string     // flags given → what gave each: "--name" or a variable
	bare       map[string]string     // flags that may stand without a value → that value (optionalValue)
	stdout     io.Writer
	printUsage func()
}

func newFlagSet(name, synopsis string, stdout io.Writer) *flagSet {
	fs := &flagSet{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), aliases: map[string][]envAlias{}, stdout: stdout}
	fs.SetOutput(io.Discard)
	// flag calls Usage on every parse error; print it only for -h.
	fs.FlagSet.Usage = func() {}
	fs.printUsage = func() {
		fmt.Fprintf(stdout, "usage: draind %s\n\nflags (environment twin in brackets):\n", synopsis)
		fs.VisitAll(func(f *flag.Flag) {
			dash, env := "--", ""
			if len(f.Name) == 1 {
				dash = "-"
			} else {
				env = " [" + strings.Join(fs.envVars(f.Name), ", ") + "]"
			}
			def := ""
			if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "0s" {
				def = " (default " + f.DefValue + ")"
			}
			fmt.Fprintf(stdout, "  %s%-16s %s%s%s\n", dash, f.Name, f.Usage, def, env)
		})
	}
	return fs
}

// envAlias is another project's variable that sets a flag (Istio's), with
// its own syntax: convert turns its value into the flag's.
type envAlias struct {
	name    string
	convert func(string) (string, error)
}

// alias adds a variable that also sets flag name, after the flag's own
// DRAIND_ twin.
func (fs *flagSet) alias(name string, a envAlias) {
	fs.aliases[name] = append(fs.aliases[name], a)
}

// envVars lists the variables that set a flag, in precedence order.
func (fs *flagSet) envVars(name string) []string {
	out := []string{envName(name)}
	for _, a := range fs.aliases[name] {
		out = append(out, a.name)
	}
	return out
}

func envName(flagName string) string {
	return "DRAIND_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// errHelp is returned by parse after printing the usage for -h.
var errHelp = errors.New("help requested")

// parse parses args then fills unset flags from the environment. Errors
// name the flag or variable and are usage errors (exit 2).
func (fs *flagSet) parse(args []string) error {
	if err := fs.Parse(fs.withBareValues(args)); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.printUsage()
			return errHelp
		}
		return usageErr("%s: %s (see draind %s -h)", fs.Name(), escapeControl(err.Error()), fs.Name())
	}
	source := map[string]string{}
	fs.Visit(func(f *flag.Flag) { source[f.Name] = "--" + f.Name })
	fs.source = source
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if source[f.Name] != "" || err != nil || len(f.Name) == 1 {
			return
		}
		vars := append([]envAlias{{name: envName(f.Name)}}, fs.aliases[f.Name]...)
		for _, env := range vars {
			v, ok := os.LookupEnv(env.name)
			if !ok || v == "" {
				continue
			}
			val, e := v, error(nil)
			if env.convert != nil {
				val, e = env.convert(v)
			}
			if e == nil {
				e = fs.Set(f.Name, val)
			}
			if e != nil {
				err = usageErr("%s: %s=%q (for --%s): %v", fs.Name(), env.name, v, f.Name, e)
			}
			source[f.Name] = env.name
			return
		}
	})
	return err
}

// optionalValue lets flag name stand alone on the command line, meaning its
// bare word: `--exit-with-app -- envoy` is `--exit-with-app=success`. Any
// other word after it is its value, as for any flag (a wrong one is an error
// naming the flag, not the proxy's command).
func (fs *flagSet) optionalValue(name, alone string) {
	if fs.bare == nil {
		fs.bare = map[string]string{}
	}
	fs.bare[name] = alone
}

// withBareValues spells out the optional flags given without a value, up to
// the first "--" (after it is the command).
func (fs *flagSet) withBareValues(args []string) []string {
	if len(fs.bare) == 0 {
		return args
	}
	out := slices.Clone(args)
	for i, a := range out {
		if a == "--" {
			break
		}
		name := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		alone, ok := fs.bare[name]
		if !ok || name == a {
			continue
		}
		if i+1 < len(out) && !strings.HasPrefix(out[i+1], "-") {
			continue // its value, or a typo the flag names
		}
		out[i] = "--" + name + "=" + alone
	}
	return out
}

// isSet reports whether a flag was given on the command line or through
// one of its environment variables (after parse).
func (fs *flagSet) isSet(name string) bool { return fs.source[name] != "" }

// sourceOf names what set a flag (after parse): "--name", the variable,
// or "" when it kept its default.
func (fs *flagSet) sourceOf(name string) string { return fs.source[name] }

// portList is a comma-separated list of TCP ports.
type portList []uint16

func (p *portList) String() string {
	s := make([]string, len(*p))
	for i, v := range *p {
		s[i] = strconv.Itoa(int(v))
	}
	return strings.Join(s, ",")
}

func (p *portList) Set(v string) error {
	*p = (*p)[:0]
	for f := range strings.SplitSeq(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		n, err := strconv.ParseUint(f, 10, 16)
		if err != nil || n == 0 {
			return fmt.Errorf("%q is not a port (1-65535)", f)
		}
		*p = append(*p, uint16(n))
	}
	return nil
}

// oneOf is a flag limited to the words of a list (alias: other words that
// mean one of them): the list the help, the parse and its error read.
type oneOf[T ~string] struct {
	val   T
	words []T
	alias map[string]T
}

func newOneOf[T ~string](val T, words []T) *oneOf[T] { return &oneOf[T]{val: val, words: words} }

func (o *oneOf[T]) String() string { return string(o.val) }
func (o *oneOf[T]) Set(v string) error {
	if a, ok := o.alias[v]; ok {
		o.val = a
		return nil
	}
	if i := slices.Index(o.words, T(v)); i >= 0 {
		o.val = o.words[i]
		return nil
	}
	return fmt.Errorf("must be one of %s", o.choices())
}

// choices are the words as help and errors name them: a|b|c.
func (o *oneOf[T]) choices() string { return flows.Words(o.words, "|") }

// outputFormat is -o of conns and watch.
type outputFormat string

const (
	outputTable outputFormat = "table"
	outputJSON  outputFormat = "json"
)

var outputFormats = []outputFormat{outputTable, outputJSON}

// logFormat is --log-format of run and prestop.
type logFormat string

const (
	logJSON    logFormat = "json"
	logConsole logFormat = "console"
)

var logFormats = []logFormat{logJSON, logConsole}

func logFormatFlag(fs *flagSet) *oneOf[logFormat] {
	f := newOneOf(logJSON, logFormats)
	fs.Var(f, "log-format", f.choices())
	return f
}

// minDrainFlag is --min-drain: a duration (a fixed wait), or "auto" (the
// adaptive wait until the pod is out of rotation).
type minDrainFlag struct {
	d    *time.Duration
	auto *bool
}

func (f minDrainFlag) String() string {
	if f.auto != nil && *f.auto {
		return "auto"
	}
	return durationFlag{f.d}.String()
}

func (f minDrainFlag) Set(v string) error {
	if v == "auto" {
		*f.auto = true
		return nil
	}
	if err := (durationFlag{f.d}).Set(v); err != nil {
		return fmt.Errorf("%q is not a duration (e.g. 500ms, 5s, 1m) nor auto", v)
	}
	*f.auto = false
	return nil
}

// durationFlag is a time.Duration flag whose parse errors say what is wrong
// (the standard one says only "parse error").
type durationFlag struct{ d *time.Duration }

func (f durationFlag) String() string {
	if f.d == nil {
		return "0s"
	}
	return f.d.String()
}

func (f durationFlag) Set(v string) error {
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("%q is not a duration (e.g. 500ms, 5s, 1m)", v)
	}
	if d < 0 {
		return fmt.Errorf("%q is negative", v)
	}
	*f.d = d
	return nil
}

// durationVar defines a duration flag with a helpful parse error.
func (fs *flagSet) durationVar(p *time.Duration, name string, def time.Duration, usage string) {
	*p = def
	fs.Var(durationFlag{p}, name, usage)
}

// escapeControl writes control characters as Go escapes: the flag
// package's errors repeat an unknown flag as given, and an error stays one
// line.
func escapeControl(s string) string {
	if !strings.ContainsFunc(s, unicode.IsControl) {
		return s
	}
	q := strconv.Quote(s)
	return q[1 : len(q)-1]
}
