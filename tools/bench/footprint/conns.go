package main

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/draind/draind/tools/bench/benchns"
)

// usage is what one whole process cost (getrusage of the child).
type usage struct {
	wall, user, sys time.Duration
	minflt, maxRSS  int64 // page faults; kB
}

// connsTable compares `draind conns` with ss as whole processes run
// inside the namespace (as `ip netns exec` would), output to /dev/null.
func connsTable(w io.Writer, draind string, sizes []int, runs int) error {
	fmt.Fprintf(w, "| connections (sockets) | command | wall | vs ss | user | sys | minor faults | max RSS |\n|---|---|---|---|---|---|---|---|\n")
	for _, n := range sizes {
		if n == 0 {
			continue
		}
		ns, err := benchns.New()
		if err != nil {
			return err
		}
		err = ns.Fill(n)
		if err == nil {
			err = connsRound(w, ns, draind, n, runs)
		}
		ns.Close()
		if err != nil {
			return fmt.Errorf("%d flows: %w", n, err)
		}
	}
	return nil
}

func connsRound(w io.Writer, ns *benchns.NS, draind string, n, runs int) error {
	pairs := []struct{ draind, ss []string }{
		{[]string{draind, "conns", "-o", "json", "--idle=false"}, []string{"ss", "-tan"}},
		{[]string{draind, "conns", "-o", "json"}, []string{"ss", "-tani"}},
		{[]string{draind, "conns", "--idle=false"}, []string{"ss", "-tan"}},
	}
	for _, p := range pairs {
		m, err := measureCmds(ns, [][]string{p.draind, p.ss}, runs)
		if err != nil {
			return err
		}
		d, ss := m[0], m[1]
		for _, row := range []struct {
			argv []string
			u    usage
		}{{p.draind, d}, {p.ss, ss}} {
			name := "draind " + strings.Join(row.argv[1:], " ")
			if row.argv[0] == "ss" {
				name = strings.Join(row.argv, " ")
			}
			fmt.Fprintf(w, "| %d (%d) | `%s` | %s | %.2f× | %s | %s | %d | %s |\n", n, 2*n, name, ms(row.u.wall),
				float64(row.u.wall)/float64(ss.wall), ms(row.u.user), ms(row.u.sys), row.u.minflt, mib(row.u.maxRSS))
		}
	}
	return nil
}

// measureCmds runs each argv runs times, interleaved (after one warm-up
// each), and returns the median of each figure per argv.
func measureCmds(ns *benchns.NS, argvs [][]string, runs int) ([]usage, error) {
	null, err := os.OpenFile(os.DevNull, os.O_WRONLY, 0)
	if err != nil {
		return nil, err
	}
	defer null.Close()
	all := make([][]usage, len(argvs))
	for i := range runs + 1 {
		for j, argv := range argvs {
			u, err := runOnce(ns, argv, null)
			if err != nil {
				return nil, err
			}
			if i > 0 { // the first is a warm-up: page cache, kernel slabs
				all[j] = append(all[j], u)
			}
		}
	}
	out := make([]usage, len(argvs))
	for j, us := range all {
		med := func(get func(usage) int64) int64 {
			v := make([]int64, len(us))
			for i, u := range us {
				v[i] = get(u)
			}
			slices.Sort(v)
			return v[len(v)/2]
		}
		out[j] = usage{
			wall:   time.Duration(med(func(u usage) int64 { return int64(u.wall) })),
			user:   time.Duration(med(func(u usage) int64 { return int64(u.user) })),
			sys:    time.Duration(med(func(u usage) int64 { return int64(u.sys) })),
			minflt: med(func(u usage) int64 { return u.minflt }),
			maxRSS: med(func(u usage) int64 { return u.maxRSS }),
		}
	}
	return out, nil
}

func runOnce(ns *benchns.NS, argv []string, stdout *os.File) (usage, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout = stdout
	var stderr strings.Builder
	cmd.Stderr = &stderr
	var wall time.Duration
	err := ns.Do(func() error {
		start := time.Now()
		err := cmd.Run()
		wall = time.Since(start)
		return err
	})
	if err != nil {
		return usage{}, fmt.Errorf("%v: %w: %s", argv, err, stderr.String())
	}
	ru := cmd.ProcessState.SysUsage().(*syscall.Rusage)
	return usage{wall: wall, user: time.Duration(ru.Utime.Nano()), sys: time.Duration(ru.Stime.Nano()),
		minflt: ru.Minflt, maxRSS: ru.Maxrss}, nil
}
