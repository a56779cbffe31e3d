package agent

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/draind/draind/internal/privs"
)

// A binary that cannot drop its capabilities (cgo) refuses to start, with
// one line naming the opt-out, unless the operator sets it (issue 43).
func TestCapsUnsupportedFailsClosed(t *testing.T) {
	cgo := fmt.Errorf("%w (operation not supported)", privs.ErrCgo)
	env := func(kv ...string) func(string) (string, bool) {
		return func(k string) (string, bool) {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1], true
				}
			}
			return "", false
		}
	}
	for _, tc := range []struct {
		name      string
		supported error
		lookup    func(string) (string, bool)
		refused   bool
		warned    bool
	}{
		{"static binary", nil, env(), false, false},
		{"static binary, opt-out set anyway", nil, env(AllowUndroppedCapsEnv, "true"), false, false},
		{"cgo, no opt-out", cgo, env(), true, false},
		{"cgo, opt-out false", cgo, env(AllowUndroppedCapsEnv, "false"), true, false},
		{"cgo, opt-out malformed", cgo, env(AllowUndroppedCapsEnv, "yes please"), true, false},
		{"cgo, opt-out", cgo, env(AllowUndroppedCapsEnv, "true"), false, true},
		{"cgo, opt-out 1", cgo, env(AllowUndroppedCapsEnv, "1"), false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			warning, err := capsUnsupported(tc.supported, tc.lookup)
			var ce *ConfigError
			switch {
			case tc.refused && (!errors.As(err, &ce) || strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), AllowUndroppedCapsEnv)):
				t.Errorf("%v; want one line naming %s (a *ConfigError: exit 2)", err, AllowUndroppedCapsEnv)
			case !tc.refused && err != nil:
				t.Errorf("refused: %v", err)
			case tc.warned != (warning != ""):
				t.Errorf("warning %q", warning)
			}
		})
	}
}
