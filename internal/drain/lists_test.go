package drain

import (
	"strings"
	"testing"
)

// Every pod shape has its text, and the start shape is the one the drain's
// line starts from: a gateway and a Job are told by the configuration.
func TestPodShapes(t *testing.T) {
	for s := ShapeSidecar; s <= ShapeClassicSidecar; s++ {
		if s.String() == "" || s.String() == "unknown" {
			t.Errorf("shape %d has no text", s)
		}
	}
	c := DefaultConfig()
	for _, tc := range []struct {
		set  func(*Config)
		want PodShape
	}{
		{func(*Config) {}, ShapeSidecar},
		{func(c *Config) { c.Gateway = true }, ShapeGateway},
		{func(c *Config) { c.ExitWithApp = ExitWithAppAny }, ShapeJob},
		{func(c *Config) { c.Prestop = true }, ShapePrestop},
	} {
		cc := c
		tc.set(&cc)
		if got := cc.StartShape(); got != tc.want {
			t.Errorf("start shape %q, want %q", got, tc.want)
		}
	}
}

// Validate names the policies from their lists, and accepts every word in
// them.
func TestValidatePolicyWords(t *testing.T) {
	for _, a := range AppExits {
		c := DefaultConfig()
		c.AppExit = a
		if err := c.Validate(); err != nil {
			t.Errorf("--app-exit %s: %v", a, err)
		}
	}
	for _, e := range ExitWithApps {
		c := DefaultConfig()
		c.ExitWithApp = e
		if err := c.Validate(); err != nil {
			t.Errorf("--exit-with-app %s: %v", e, err)
		}
	}
	c := DefaultConfig()
	c.AppExit = "never"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `"never": must be wait or flows`) {
		t.Errorf("--app-exit never: %v", err)
	}
	c = DefaultConfig()
	c.ExitWithApp = "maybe"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `"maybe": must be off, success or any`) {
		t.Errorf("--exit-with-app maybe: %v", err)
	}
}
