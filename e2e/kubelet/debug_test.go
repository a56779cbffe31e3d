package kubelet_test

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// The privileged debug mode: a pod in the host PID namespace runs
// `draind conns --pid PID` against another pod's app. Which capabilities
// it takes, exactly: each one is dropped in turn.
func TestNodeDebugConns(t *testing.T) {
	target := startPod(t, "classic.yaml", podParams{Name: "debug-target", AppArgs: []string{"--on-term", "exit"}})
	appPID := containerPID(t, target, target.container("app").id)
	full := []corev1.Capability{"SYS_ADMIN", "SYS_PTRACE", "BPF", "PERFMON"}
	for _, tc := range []struct {
		name   string
		caps   []corev1.Capability
		wantOK bool
	}{
		{"exact", full, true},
		{"no-sys-ptrace", []corev1.Capability{"SYS_ADMIN", "BPF", "PERFMON"}, false},
		{"no-sys-admin", []corev1.Capability{"SYS_PTRACE", "BPF", "PERFMON"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sc := securityContext(0, true, tc.caps...)
			sc.SeccompProfile = &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}
			sc.AppArmorProfile = &corev1.AppArmorProfile{Type: corev1.AppArmorProfileTypeUnconfined}
			pd := startPod(t, "debug.yaml", podParams{
				Name: "debug-" + tc.name, NoWait: true, SecurityContext: sc,
				DraindCommand: []string{"/usr/local/bin/draind", "conns", "--pid", strconv.Itoa(appPID), "-o", "json"},
			})
			var c *ctrRecord
			for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
				if c = pd.container("draind"); c != nil && c.state == runtimeapi.ContainerState_CONTAINER_EXITED && c.log != nil {
					break
				}
			}
			if c == nil || c.state != runtimeapi.ContainerState_CONTAINER_EXITED {
				t.Fatal("the debug container did not run to completion")
			}
			stdout, stderr := splitCRILog(c.log)
			var snap struct {
				Summary map[string]int `json:"summary"`
			}
			err := json.Unmarshal([]byte(stdout), &snap)
			t.Logf("%s (caps %v): exit %d; summary %v; stderr %s", tc.name, tc.caps, c.exitCode, snap.Summary, firstLine(stderr))
			result := fmt.Sprintf("exit %d %s", c.exitCode, firstLine(stderr))
			if err == nil {
				result = fmt.Sprintf("exit %d summary %v", c.exitCode, snap.Summary)
			}
			report.add("debug", tc.name, result)
			ok := c.exitCode == 0 && err == nil && snap.Summary["app_listeners"] >= 1 && snap.Summary["proxy_listeners"] >= 1
			if ok != tc.wantOK {
				t.Errorf("conns --pid with caps %v: ok=%v, want %v (exit %d, %v)", tc.caps, ok, tc.wantOK, c.exitCode, err)
			}
		})
	}
}

// splitCRILog joins a CRI log's stdout and stderr messages (P: partial line).
func splitCRILog(b []byte) (stdout, stderr string) {
	var out, errb strings.Builder
	for line := range strings.SplitSeq(string(b), "\n") {
		parts := strings.SplitN(line, " ", 4)
		if len(parts) < 4 {
			continue
		}
		w := &out
		if parts[1] == "stderr" {
			w = &errb
		}
		w.WriteString(parts[3])
		if parts[2] == "F" {
			w.WriteString("\n")
		}
	}
	return out.String(), errb.String()
}
