package istio

import (
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

// Where a pod's draind listens: the one rule `draind run` takes its status
// address by, and `draind drain`, `draind wait` and `draind pods` find it
// by. Beside pilot-agent the rule is Istio's business (pilot-agent keeps
// its status port, draind takes the first port Istio leaves free), hence
// here.

// DefaultStatusAddr is draind's status server when nothing moves it:
// Istio's status port, which draind's serves in place of pilot-agent's
// when it runs Envoy itself.
const DefaultStatusAddr = ":15020"

// The settings that give draind's status address, as its status address
// names them (StatusAddr.From).
const (
	StatusAddrFlag = "--status-addr"
	StatusAddrEnv  = "DRAIND_STATUS_ADDR"
	// proxyEnv is --proxy's environment twin.
	proxyEnv = "DRAIND_PROXY"

	fromDefault    = "default"
	fromPilotAgent = "beside pilot-agent (the first port Istio leaves free)"
)

// StatusInput is what decides where a draind listens: plain data, read
// from `draind run`'s flags, from `draind drain`'s environment, or from
// another container's argv and environment ([RunArgs]).
type StatusInput struct {
	// Given is the address --status-addr or DRAIND_STATUS_ADDR gave,
	// GivenBy which of them; both "": neither (a Given with no GivenBy
	// was StatusAddrFlag's). An empty address given stands, for the
	// command to refuse.
	Given, GivenBy string
	// PilotAgent says draind runs Istio's pilot-agent, which keeps its
	// status port.
	PilotAgent bool
	// Settings are Istio's settings: read them only when NeedsSettings.
	Settings Settings
}

// NeedsSettings tells whether [StatusAddrOf] reads in.Settings: nothing
// gave the address and draind runs pilot-agent. Callers read Istio's
// settings only then, as their errors are then the command's.
func (in StatusInput) NeedsSettings() bool { return !in.given() && in.PilotAgent }

// given says an address was given.
func (in StatusInput) given() bool { return in.Given != "" || in.GivenBy != "" }

// StatusAddr is where a draind listens, and what decided it.
type StatusAddr struct {
	// Addr is its status server's address, host:port as --status-addr
	// takes it (an empty host: every interface).
	Addr string
	// From is what decided it: --status-addr, DRAIND_STATUS_ADDR, beside
	// pilot-agent, or the default.
	From string
}

// StatusAddrOf says where a draind listens: the address given; else,
// beside pilot-agent, the first port Istio's settings and [Ports] leave
// free ([Settings.FreePort]); else [DefaultStatusAddr].
func StatusAddrOf(in StatusInput) StatusAddr {
	switch {
	case in.given():
		from := in.GivenBy
		if from == "" {
			from = StatusAddrFlag
		}
		return StatusAddr{Addr: in.Given, From: from}
	case in.PilotAgent:
		return StatusAddr{Addr: ":" + strconv.Itoa(int(in.Settings.FreePort())), From: fromPilotAgent}
	}
	return StatusAddr{Addr: DefaultStatusAddr, From: fromDefault}
}

// RunArgs reads a container's argv and environment (KEY=VALUE, the last
// of a key winning) as its `draind run` would: ok when the argv runs
// `draind run`, draind as argv[0] or after an init wrapper (tini --
// draind run ...). The proxy is pilot-agent as run would tell it (--proxy
// or DRAIND_PROXY, auto: the command after "--"). lookup reads the
// environment, for [ReadFrom] when in.NeedsSettings.
func RunArgs(args, env []string) (in StatusInput, lookup func(string) (string, bool), ok bool) {
	i := slices.IndexFunc(args, func(a string) bool { return filepath.Base(a) == "draind" })
	if i < 0 || i+1 >= len(args) || args[i+1] != "run" {
		return StatusInput{}, nil, false
	}
	flagArgs, command := args[i+2:], []string(nil)
	if j := slices.Index(flagArgs, "--"); j >= 0 {
		flagArgs, command = flagArgs[:j], flagArgs[j+1:]
	}
	lookup = func(name string) (string, bool) {
		for _, kv := range slices.Backward(env) {
			if k, v, ok := strings.Cut(kv, "="); ok && k == name {
				return v, true
			}
		}
		return "", false
	}
	// A flag beats its variable; an empty one is not given.
	setting := func(flag, env string) (string, string) {
		if v := flagValue(flagArgs, flag); v != "" {
			return v, "--" + flag
		}
		if v, _ := lookup(env); v != "" {
			return v, env
		}
		return "", ""
	}
	in.Given, in.GivenBy = setting("status-addr", StatusAddrEnv)
	kind, _ := setting("proxy", proxyEnv)
	in.PilotAgent = ProxyKind(kind).Of(command) == ProxyPilotAgent
	return in, lookup, true
}

// flagValue is the value of flag name in args as Go's flag package reads
// draind's flags (-name v, --name v, -name=v, --name=v; the last one
// wins), up to "--"; "" when absent.
func flagValue(args []string, name string) string {
	v := ""
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			break
		}
		trimmed := strings.TrimPrefix(strings.TrimPrefix(a, "-"), "-")
		if trimmed == a {
			continue
		}
		switch {
		case trimmed == name && i+1 < len(args):
			v = args[i+1]
			i++
		case strings.HasPrefix(trimmed, name+"="):
			v = trimmed[len(name)+1:]
		}
	}
	return v
}
