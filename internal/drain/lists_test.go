package drain

import "testing"

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
