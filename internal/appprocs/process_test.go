package appprocs

import (
	"slices"
	"testing"
)

// istioUID is the proxy's uid in the tests: Istio's.
const istioUID = 1337

func pids(ps []Process) []int {
	out := make([]int, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.PID)
	}
	slices.Sort(out)
	return out
}

// A pod as the kernel shows it: the shim (pid 50, outside the namespace)
// started pause, draind and the app's container init; draind started Envoy.
var podProcs = []Process{
	{PID: 100, PPID: 50, UID: 65535, Comm: "pause", StartTime: 1000},
	{PID: 200, PPID: 51, UID: 0, Comm: "draind", StartTime: 2000},
	{PID: 201, PPID: 200, UID: 1337, Comm: "envoy", StartTime: 2100},
	{PID: 300, PPID: 52, UID: 1000, Comm: "java", StartTime: 3000},
	{PID: 301, PPID: 300, UID: 1000, Comm: "sh", StartTime: 3100},
	{PID: 302, PPID: 301, UID: 1000, Comm: "curl", StartTime: 3200},
	{PID: 400, PPID: 53, UID: 0, Comm: "otel-agent", StartTime: 4000}, // another sidecar: the app's
}

func TestClassify(t *testing.T) {
	tests := []struct {
		name  string
		all   []Process
		rules Rules
		want  []int
	}{
		{
			name:  "pod: draind, envoy and pause excluded, other sidecars are the app",
			all:   podProcs,
			rules: Rules{ProxyUID: istioUID, SelfPIDs: []int{200}},
			want:  []int{300, 301, 302, 400},
		},
		{
			name: "empty namespace",
			want: []int{},
		},
		{
			name:  "without SelfPIDs draind is the app (uid 0), envoy still the proxy's by uid",
			all:   podProcs,
			rules: Rules{ProxyUID: istioUID},
			want:  []int{200, 300, 301, 302, 400},
		},
		{
			name: "proxy by uid and its child of another uid by ProxyPIDs",
			all: []Process{
				{PID: 10, PPID: 1, UID: 0, Comm: "pause", StartTime: 1},
				{PID: 20, PPID: 1, UID: 1337, Comm: "pilot-agent", StartTime: 2},
				{PID: 21, PPID: 20, UID: 1337, Comm: "envoy", StartTime: 3},
				{PID: 22, PPID: 21, UID: 0, Comm: "helper", StartTime: 4},
				{PID: 30, PPID: 1, UID: 0, Comm: "app", StartTime: 5},
			},
			rules: Rules{ProxyUID: istioUID, ProxyPIDs: []int{20}},
			want:  []int{30},
		},
		{
			name: "a child of a uid-1337 process is not the proxy's by descent alone",
			all: []Process{
				{PID: 21, PPID: 1, UID: 1337, Comm: "envoy", StartTime: 3},
				{PID: 22, PPID: 21, UID: 0, Comm: "helper", StartTime: 4},
			},
			rules: Rules{ProxyUID: istioUID},
			want:  []int{22},
		},
		{
			name: "ProxyUID 0 is root: root's processes are the proxy's",
			all: []Process{
				{PID: 21, PPID: 1, UID: 0, Comm: "envoy", StartTime: 3},
				{PID: 22, PPID: 1, UID: 1337, Comm: "app", StartTime: 4},
			},
			rules: Rules{},
			want:  []int{22},
		},
		{
			name: "custom proxy uid; uid 1337 is then the app's",
			all: []Process{
				{PID: 21, PPID: 1, UID: 101, Comm: "envoy", StartTime: 3},
				{PID: 22, PPID: 1, UID: 1337, Comm: "app", StartTime: 4},
			},
			rules: Rules{ProxyUID: 101},
			want:  []int{22},
		},
		{
			name: "draind outside the namespace: its children inside are its own",
			all: []Process{
				{PID: 500, PPID: 7, UID: 0, Comm: "sleep", StartTime: 10},
				{PID: 501, PPID: 500, UID: 0, Comm: "sleep", StartTime: 11},
				{PID: 600, PPID: 1, UID: 0, Comm: "app", StartTime: 12},
			},
			rules: Rules{ProxyUID: istioUID, SelfPIDs: []int{7}},
			want:  []int{600},
		},
		{
			name: "pid reuse: a 'parent' younger than its child is not its parent",
			all: []Process{
				{PID: 200, PPID: 1, UID: 0, Comm: "draind", StartTime: 900},
				{PID: 300, PPID: 200, UID: 0, Comm: "orphan", StartTime: 500},
			},
			rules: Rules{ProxyUID: istioUID, SelfPIDs: []int{1000}},
			want:  []int{200, 300},
		},
		{
			name: "pid reuse: SelfPIDs matched on the walk only through genuine parents",
			all: []Process{
				{PID: 200, PPID: 7, UID: 0, Comm: "draind", StartTime: 900},
				{PID: 300, PPID: 200, UID: 0, Comm: "orphan", StartTime: 500},
			},
			rules: Rules{ProxyUID: istioUID, SelfPIDs: []int{7}},
			want:  []int{300},
		},
		{
			name: "orphan reparented out of draind's tree is the app's",
			all: []Process{
				{PID: 200, PPID: 1, UID: 0, Comm: "draind", StartTime: 10},
				{PID: 300, PPID: 250, UID: 0, Comm: "worker", StartTime: 30}, // 250 exited
			},
			rules: Rules{ProxyUID: istioUID, SelfPIDs: []int{200}},
			want:  []int{300},
		},
		{
			name: "PPID cycle (corrupt input) terminates",
			all: []Process{
				{PID: 2, PPID: 3, UID: 0, Comm: "a", StartTime: 5},
				{PID: 3, PPID: 2, UID: 0, Comm: "b", StartTime: 5},
			},
			rules: Rules{ProxyUID: istioUID, SelfPIDs: []int{99}},
			want:  []int{2, 3},
		},
		{
			name:  "PausePIDs exclude a process of any name",
			all:   []Process{{PID: 5, PPID: 1, Comm: "infra", StartTime: 1}, {PID: 6, PPID: 1, Comm: "app", StartTime: 2}},
			rules: Rules{ProxyUID: istioUID, PausePIDs: []int{5}},
			want:  []int{6},
		},
		{
			name:  "pause rule off: a pause process is the app's",
			all:   podProcs[:1],
			rules: Rules{ProxyUID: istioUID, NoPauseRule: true},
			want:  []int{100},
		},
		{
			name: "pause's orphans (shared PID namespace) stay the app's",
			all: []Process{
				{PID: 1, PPID: 0, Comm: "pause", StartTime: 1},
				{PID: 40, PPID: 1, Comm: "worker", StartTime: 50},
			},
			rules: Rules{ProxyUID: istioUID},
			want:  []int{40},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := pids(Classify(tt.all, tt.rules))
			if !slices.Equal(got, tt.want) {
				t.Errorf("app = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestPauseRule(t *testing.T) {
	tests := []struct {
		name  string
		all   []Process
		rules Rules
		want  int // 0: none
	}{
		{name: "the pod", all: podProcs, rules: Rules{ProxyUID: istioUID, SelfPIDs: []int{200}}, want: 100},
		{name: "empty", want: 0},
		{
			name: "oldest is not named pause (CRI-O without infra): none",
			all: []Process{
				{PID: 10, PPID: 1, Comm: "nginx", StartTime: 1},
				{PID: 11, PPID: 1, Comm: "pause", StartTime: 2}, // an app binary named pause
			},
			rules: Rules{ProxyUID: istioUID},
			want:  0,
		},
		{
			name: "draind and the proxy are not candidates even when older",
			all: []Process{
				{PID: 10, PPID: 1, UID: 0, Comm: "draind", StartTime: 1},
				{PID: 11, PPID: 10, UID: 1337, Comm: "envoy", StartTime: 2},
				{PID: 12, PPID: 1, UID: 0, Comm: "pause", StartTime: 3},
				{PID: 13, PPID: 1, UID: 0, Comm: "app", StartTime: 4},
			},
			rules: Rules{ProxyUID: istioUID, SelfPIDs: []int{10}},
			want:  12,
		},
		{
			name: "equal start times (/proc ticks): lowest pid",
			all: []Process{
				{PID: 21, PPID: 1, Comm: "sleep", StartTime: 7},
				{PID: 20, PPID: 1, Comm: "sleep", StartTime: 7},
			},
			rules: Rules{ProxyUID: istioUID, PauseComm: "sleep"},
			want:  20,
		},
		{
			name: "a candidate whose parent is in the namespace is no infra process",
			all: []Process{
				{PID: 30, PPID: 31, Comm: "pause", StartTime: 5},
				{PID: 31, PPID: 1, Comm: "sh", StartTime: 5},
			},
			rules: Rules{ProxyUID: istioUID},
			want:  0,
		},
		{
			name:  "disabled",
			all:   podProcs,
			rules: Rules{ProxyUID: istioUID, SelfPIDs: []int{200}, NoPauseRule: true},
			want:  0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, ok := PauseProcess(tt.all, tt.rules)
			got := 0
			if ok {
				got = p.PID
			}
			if got != tt.want {
				t.Errorf("pause = %d, want %d", got, tt.want)
			}
		})
	}
}

func TestClasses(t *testing.T) {
	got := Classes(podProcs, Rules{ProxyUID: istioUID, SelfPIDs: []int{200}})
	want := []Class{ClassPause, ClassSelf, ClassSelf, ClassApp, ClassApp, ClassApp, ClassApp}
	if !slices.Equal(got, want) {
		t.Errorf("classes = %v, want %v", got, want)
	}
	// Envoy is draind's child and uid 1337: self wins, it is excluded
	// either way.
	if b, _ := ClassProxy.MarshalText(); string(b) != "proxy" {
		t.Errorf("ClassProxy text = %q", b)
	}
}

func TestExitStatus(t *testing.T) {
	tests := []struct {
		status    ExitStatus
		exited    bool
		code, sig int
		core      bool
		str       string
	}{
		{0, true, 0, 0, false, "exit 0"},
		{3 << 8, true, 3, 0, false, "exit 3"},
		{255 << 8, true, 255, 0, false, "exit 255"},
		{9, false, -1, 9, false, "signal 9"},
		{15, false, -1, 15, false, "signal 15"},
		{11 | 0x80, false, -1, 11, true, "signal 11 (core dumped)"},
	}
	for _, tt := range tests {
		s := tt.status
		if s.Exited() != tt.exited || s.ExitCode() != tt.code || s.Signal() != tt.sig || s.CoreDumped() != tt.core || s.String() != tt.str {
			t.Errorf("%#x: exited %v code %d signal %d core %v %q; want %v %d %d %v %q", uint32(s),
				s.Exited(), s.ExitCode(), s.Signal(), s.CoreDumped(), s.String(), tt.exited, tt.code, tt.sig, tt.core, tt.str)
		}
	}
}

// A pod whose containers are told apart by mount namespace: the proxy's
// container (mount namespace 7) runs tini as its PID 1 (root, its parent the
// shim), draind under it, Envoy as 1337, and the kubelet's postStart hook
// (`draind wait`, root, exec'd by the runtime: its parent is outside); the
// app's container is 8; pause is 6.
var containerPod = []Process{
	{PID: 100, PPID: 50, UID: 65535, Comm: "pause", StartTime: 1000, MountNS: 6},
	{PID: 190, PPID: 51, UID: 0, Comm: "tini", StartTime: 1900, MountNS: 7},
	{PID: 200, PPID: 190, UID: 0, Comm: "draind", StartTime: 2000, MountNS: 7},
	{PID: 201, PPID: 200, UID: 1337, Comm: "envoy", StartTime: 2100, MountNS: 7},
	{PID: 210, PPID: 60, UID: 0, Comm: "draind", StartTime: 2500, MountNS: 7},
	{PID: 300, PPID: 52, UID: 1000, Comm: "java", StartTime: 3000, MountNS: 8},
	{PID: 301, PPID: 300, UID: 1000, Comm: "sh", StartTime: 3100, MountNS: 8},
}

func TestClassifyContainerRule(t *testing.T) {
	tests := []struct {
		name  string
		all   []Process
		rules Rules
		want  map[int]Class
	}{
		{
			name:  "init wrapper and exec'd hook in draind's container are draind's",
			all:   containerPod,
			rules: Rules{ProxyUID: istioUID, SelfPIDs: []int{200}},
			want:  map[int]Class{100: ClassPause, 190: ClassSelf, 200: ClassSelf, 201: ClassSelf, 210: ClassSelf, 300: ClassApp, 301: ClassApp},
		},
		{
			name: "seen from outside (conns on the node): the container that runs the proxy's uid is the proxy's",
			all:  containerPod,
			// No SelfPIDs: draind is not the caller.
			rules: Rules{ProxyUID: istioUID},
			want:  map[int]Class{100: ClassPause, 190: ClassProxy, 200: ClassProxy, 201: ClassProxy, 210: ClassProxy, 300: ClassApp, 301: ClassApp},
		},
		{
			name: "a root proxy (no uid rule) found by its pid: its container is the proxy's",
			all: []Process{
				{PID: 10, PPID: 1, UID: 0, Comm: "envoy", StartTime: 10, MountNS: 3},
				{PID: 11, PPID: 2, UID: 0, Comm: "sh", StartTime: 11, MountNS: 3}, // kubectl exec
				{PID: 12, PPID: 2, UID: 0, Comm: "app", StartTime: 12, MountNS: 4},
			},
			rules: Rules{ProxyUID: istioUID, ProxyPIDs: []int{10}, NoPauseRule: true},
			want:  map[int]Class{10: ClassProxy, 11: ClassProxy, 12: ClassApp},
		},
		{
			name: "unknown mount namespaces (0) are not one container",
			all: []Process{
				{PID: 20, PPID: 1, UID: 0, Comm: "draind", StartTime: 20},
				{PID: 21, PPID: 2, UID: 0, Comm: "app", StartTime: 21},
			},
			rules: Rules{ProxyUID: istioUID, SelfPIDs: []int{20}, NoPauseRule: true},
			want:  map[int]Class{20: ClassSelf, 21: ClassApp},
		},
		{
			name: "the pause rule passes over draind's container: tini is not pause even when oldest of the rest",
			all: []Process{
				{PID: 30, PPID: 1, UID: 0, Comm: "pause", StartTime: 31, MountNS: 5},
				{PID: 31, PPID: 1, UID: 0, Comm: "pause", StartTime: 30, MountNS: 7}, // a wrapper named pause
				{PID: 32, PPID: 31, UID: 0, Comm: "draind", StartTime: 32, MountNS: 7},
			},
			rules: Rules{ProxyUID: istioUID, SelfPIDs: []int{32}},
			want:  map[int]Class{30: ClassPause, 31: ClassSelf, 32: ClassSelf},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			classes := Classes(tt.all, tt.rules)
			for i, p := range tt.all {
				if classes[i] != tt.want[p.PID] {
					t.Errorf("pid %d (%s): %s, want %s", p.PID, p.Comm, classes[i], tt.want[p.PID])
				}
			}
		})
	}
	got := Containers(containerPod, Rules{ProxyUID: istioUID, SelfPIDs: []int{200}})
	if len(got) != 1 || got[7] != ClassSelf {
		t.Errorf("Containers = %v, want draind's container 7 only", got)
	}
}
