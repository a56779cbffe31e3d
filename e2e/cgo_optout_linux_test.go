package e2e

import (
	"os"
	"strings"

	"github.com/draind/draind/internal/agent"
	"github.com/draind/draind/internal/privs"
)

// A draind that cannot drop its capabilities refuses to start unless the
// operator opts out (agent.AllowUndroppedCapsEnv). This test binary is
// every process of the pods, draind included, and go test links it with
// cgo wherever a C compiler is (-race always does): its pods' draind opts
// out, as it ran before the refusal, with the capabilities execve gave
// it. The privilege tests run a static build (privs_linux_test.go), which
// drops them; TestCgoBinaryRefusesToStart clears the opt-out. Set in the
// test process alone (its roles, "__draind" and the others, inherit it or
// not, as the test decides).
func init() {
	if len(os.Args) > 1 && strings.HasPrefix(os.Args[1], "__") {
		return
	}
	if privs.Supported() != nil {
		os.Setenv(agent.AllowUndroppedCapsEnv, "true")
	}
}
