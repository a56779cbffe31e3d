package kubelet_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// securityContext builds a container securityContext.
func securityContext(uid int64, noEscalation bool, add ...corev1.Capability) *corev1.SecurityContext {
	sc := &corev1.SecurityContext{
		RunAsUser: &uid, RunAsGroup: &uid,
		Capabilities: &corev1.Capabilities{Add: add, Drop: []corev1.Capability{"ALL"}},
	}
	if noEscalation {
		f := false
		sc.AllowPrivilegeEscalation = &f
	}
	return sc
}

func withSeccomp(sc *corev1.SecurityContext) *corev1.SecurityContext {
	sc.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
	return sc
}

var trackerInfo = regexp.MustCompile(`draind_tracker_info\{mode="([a-z]+)"\} 1`)

// Which tracker draind runs under each securityContext, as the kubelet and
// runc apply it: a non-root user gets capabilities.add only in its bounding
// set (CRI sets no ambient or inheritable ones), so eBPF needs file
// capabilities on the binary; root gets the added ones directly.
func TestTrackerModeBySecurityContext(t *testing.T) {
	for _, tc := range []struct {
		name    string
		image   string
		sc      *corev1.SecurityContext
		runAs   bool   // draind runs as root and starts the proxy as 1337
		want    string // tracker mode, or "no-start" for a container that cannot exec
		comment string
	}{
		{"nonroot-filecaps", imgDraind, securityContext(1337, false, "BPF", "PERFMON"), false, "ebpf",
			"uid 1337, file caps cap_bpf,cap_perfmon+ep, capabilities.add BPF PERFMON (the documented mode)"},
		{"nonroot-filecaps-noescalation", imgDraind, securityContext(1337, true, "BPF", "PERFMON"), false, "ebpf",
			"the same with allowPrivilegeEscalation: false (no_new_privs): runc sets the permitted set before exec, so the file caps add nothing new and survive"},
		{"nonroot-no-filecaps", imgDraindNoCaps, securityContext(1337, false, "BPF", "PERFMON"), false, "sockdiag",
			"uid 1337, no file caps: capabilities.add reaches only the bounding set"},
		{"nonroot-none", imgDraindNoCaps, securityContext(1337, true), false, "sockdiag",
			"uid 1337, drop ALL, no file caps: sock_diag polling, no capability needed"},
		{"nonroot-filecaps-not-in-bounding", imgDraind, securityContext(1337, false), false, "no-start",
			"file caps +ep but BPF/PERFMON not added: execve fails with EPERM (the kernel refuses a +ep binary it cannot give all its caps)"},
		{"nonroot-filecaps-permitted-only", imgDraindPerm, securityContext(1337, false, "BPF", "PERFMON"), false, "sockdiag",
			"file caps +p (no effective bit): the caps are permitted, not effective; draind does not raise them today"},
		{"nonroot-filecaps-permitted-only-no-bounding", imgDraindPerm, securityContext(1337, false), false, "sockdiag",
			"file caps +p and no capabilities.add: execve succeeds (no effective bit, no EPERM), sock_diag"},
		{"nonroot-filecaps-seccomp-runtime-default", imgDraind, withSeccomp(securityContext(1337, true, "BPF", "PERFMON")), false, "ebpf",
			"the documented mode under containerd's RuntimeDefault seccomp profile: it allows bpf and perf_event_open when CAP_BPF/CAP_PERFMON are in the bounding set"},
		{"root-added-caps", imgDraindNoCaps, securityContext(0, true, "BPF", "PERFMON", "SETUID", "SETGID"), true, "ebpf",
			"uid 0, drop ALL, add BPF PERFMON (+SETUID SETGID for --run-proxy-as 1337), allowPrivilegeEscalation false"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var extra []string
			if tc.runAs {
				extra = []string{"--run-proxy-as", "1337"}
			}
			name := "caps-" + tc.name
			if len(name) > 50 {
				name = name[:50]
			}
			name = strings.TrimRight(name, "-")
			pd := startPod(t, "classic.yaml", podParams{
				Name: name, DraindImage: tc.image, SecurityContext: tc.sc,
				DraindCommand: defaultDraindCommand(extra...),
				AppArgs:       []string{"--on-term", "exit"},
				NoWait:        tc.want == "no-start",
			})
			if tc.want == "no-start" {
				var c *ctrRecord
				for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
					if c = pd.container("draind"); c != nil && c.state == runtimeapi.ContainerState_CONTAINER_EXITED {
						break
					}
				}
				if c == nil || c.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
					t.Fatalf("draind's container started; want an exec failure")
				}
				why := firstLine(c.msg + "\n" + string(c.log))
				t.Logf("%s: container %s, exit %d, reason %q: %s", tc.name, c.state, c.exitCode, c.reason, why)
				report.add("caps", tc.name, fmt.Sprintf("container not started: exit %d %s: %s", c.exitCode, c.reason, why))
				return
			}
			logs := pd.draindLog(-1)
			r := findLog(logs, "tracker")
			_, metrics := pd.getBody(statusPort, "/metrics")
			m := trackerInfo.FindStringSubmatch(metrics)
			if r == nil || m == nil {
				t.Fatalf("no tracker log line (%v) or draind_tracker_info (%v)", r, m)
			}
			live := findLog(logs, "app liveness")
			t.Logf("%s: tracker %s (%v); /metrics draind_tracker_info mode=%s; app liveness %v (%v) — %s", tc.name, r["mode"], r["reason"], m[1], live["source"], live["reason"], tc.comment)
			report.add("caps", tc.name, fmt.Sprintf("tracker=%v (%v); app liveness %v", r["mode"], r["reason"], live["source"]))
			if r["mode"] != tc.want || m[1] != tc.want {
				t.Errorf("tracker %v (metrics %s), want %s: %s", r["mode"], m[1], tc.want, tc.comment)
			}
		})
	}
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
