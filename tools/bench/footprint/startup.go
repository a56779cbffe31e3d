package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/draind/draind/tools/bench/benchns"
)

// startupMarks are the moments of a draind start-up, told by the first log
// line holding each text (console format), in the order they happen.
var startupMarks = []struct{ name, text string }{
	{"proxy started", "\tproxy started\t"},
	{"proxy LIVE (envoysim's own line)", "state LIVE"},
	{"tracker open (eBPF load + first sock_diag snapshot)", "\ttracker\t"},
	{"app processes (eBPF task iterator + walk)", "\tapp liveness\t"},
	{"machine running, phase ready (log)", readyLine},
}

// readyLine is the drain machine's Ready: start-up is over (the trackers
// are open). Readiness may say 200 before it: it waits on Envoy only.
const readyLine = `"phase": "ready"`

// startupTable measures runs start-ups of draind (with envoysim, and with
// the stand-in) and of pilot-agent when given (with the stand-in), each in
// a fresh namespace, and prints the medians.
func startupTable(ctx context.Context, w io.Writer, p proxySetup, pilot string, runs int) error {
	self, cleanup, err := standinCopy()
	if err != nil {
		return err
	}
	defer cleanup()
	withStandin := p
	withStandin.envoysim = ""
	withStandin.args = append(append([]string(nil), p.args...), "--", self, "standin")
	marks := make([][]time.Duration, len(startupMarks))
	var ready, readyStandin, readyPilot []time.Duration
	for range runs {
		a, r, err := startOnce(readyLine, func(dir string) (*exec.Cmd, error) { return draindCommand(p, dir) })
		if err != nil {
			return err
		}
		ready = append(ready, r)
		for i, m := range startupMarks {
			marks[i] = append(marks[i], a.firstLine(m.text))
		}
		if _, r, err = startOnce(readyLine, func(dir string) (*exec.Cmd, error) { return draindCommand(withStandin, dir) }); err != nil {
			return err
		}
		readyStandin = append(readyStandin, r)
		if pilot == "" {
			continue
		}
		if _, r, err = startOnce("", func(dir string) (*exec.Cmd, error) { return pilotCommand(pilot, self, dir) }); err != nil {
			return fmt.Errorf("pilot-agent: %w", err)
		}
		readyPilot = append(readyPilot, r)
	}
	fmt.Fprintf(w, "| step (from exec) | median | min | max |\n|---|---|---|---|\n")
	for i, m := range startupMarks {
		fmt.Fprintf(w, "| draind + envoysim: %s | %s |\n", m.name, spread(marks[i]))
	}
	fmt.Fprintf(w, "| **draind + envoysim: /healthz/ready 200** | %s |\n", spread(ready))
	fmt.Fprintf(w, "| **draind + stand-in: /healthz/ready 200** | %s |\n", spread(readyStandin))
	if pilot != "" {
		fmt.Fprintf(w, "| **pilot-agent + stand-in: /healthz/ready 200** | %s |\n", spread(readyPilot))
	}
	return nil
}

// standinCopy copies this binary where the proxy's uid (1337) can run it
// as the stand-in (a test binary's own directory is private).
func standinCopy() (string, func(), error) {
	self, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	b, err := os.ReadFile(self)
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", "footprint-standin")
	if err != nil {
		return "", nil, err
	}
	cleanup := func() { os.RemoveAll(dir) }
	os.Chmod(dir, 0o755)
	path := filepath.Join(dir, "standin")
	if err := os.WriteFile(path, b, 0o755); err != nil {
		cleanup()
		return "", nil, err
	}
	return path, cleanup, nil
}

// spread is "median | min | max" of a set of durations (negative: absent).
func spread(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	if len(s) == 0 || s[0] < 0 {
		return "- | - | -"
	}
	return ms(s[len(s)/2]) + " | " + ms(s[0]) + " | " + ms(s[len(s)-1])
}

// startOnce starts an agent in a fresh namespace, waits for its first
// ready 200 (and then for its log line last, when given), stops it and
// returns it (its log lines) and the time to ready.
func startOnce(last string, command func(dir string) (*exec.Cmd, error)) (*agentProc, time.Duration, error) {
	ns, err := benchns.New()
	if err != nil {
		return nil, 0, err
	}
	defer ns.Close()
	dir, err := os.MkdirTemp("", "footprint")
	if err != nil {
		return nil, 0, err
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o755)
	cmd, err := command(dir)
	if err != nil {
		return nil, 0, err
	}
	c, err := newNSClient(ns)
	if err != nil {
		return nil, 0, err
	}
	defer c.close()
	a, err := startAgent(ns, cmd)
	if err != nil {
		return nil, 0, err
	}
	ready, err := c.waitReady(a, 30*time.Second)
	for end := time.Now().Add(5 * time.Second); err == nil && last != "" && a.firstLine(last) < 0 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(20 * time.Millisecond) // let the last log lines arrive
	a.stop()
	return a, ready, err
}

// pilotCommand is Istio's pilot-agent running the stand-in (through a
// wrapper that drops Envoy's flags) as its proxy, offline
// (docs/peers.md, "Running pilot-agent itself offline").
func pilotCommand(pilot, self, dir string) (*exec.Cmd, error) {
	wrapper := filepath.Join(dir, "envoy")
	if err := os.WriteFile(wrapper, []byte("#!/bin/sh\nexec "+self+" standin\n"), 0o755); err != nil {
		return nil, err
	}
	tmpl, err := bootstrapTemplate()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(pilot, "proxy", "sidecar", "--templateFile", tmpl)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"PROXY_CONFIG=binaryPath: "+wrapper+"\nconfigPath: "+filepath.Join(dir, "etc/istio/proxy")+
			"\ndiscoveryAddress: 127.0.0.1:15012\ncontrolPlaneAuthPolicy: NONE\nterminationDrainDuration: 0s\ndrainDuration: 1s\nproxyAdminPort: 15000\nstatusPort: 15020\n",
		"FILE_MOUNTED_CERTS=true", "CLOUD_PLATFORM=none", "ISTIO_META_DNS_CAPTURE=false",
		"POD_NAME=bench", "POD_NAMESPACE=default", "INSTANCE_IP=127.0.0.1", "SERVICE_ACCOUNT=default")
	return cmd, nil
}

// bootstrapTemplate finds Istio's Envoy bootstrap template in the module
// cache (the version tools/peers/pilot-agent.sh builds).
func bootstrapTemplate() (string, error) {
	out, err := exec.Command("go", "env", "GOMODCACHE").Output()
	if err != nil {
		return "", fmt.Errorf("go env GOMODCACHE: %w", err)
	}
	m, _ := filepath.Glob(filepath.Join(string(out[:len(out)-1]), "istio.io", "istio@*", "tools", "packaging", "common", "envoy_bootstrap.json"))
	if len(m) == 0 {
		return "", fmt.Errorf("no istio envoy_bootstrap.json in the module cache (make peers)")
	}
	return m[len(m)-1], nil
}
