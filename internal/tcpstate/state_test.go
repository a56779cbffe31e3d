package tcpstate

import "testing"

func TestString(t *testing.T) {
	for _, c := range []struct {
		s    State
		want string
	}{
		{Established, "ESTABLISHED"},
		{CloseWait, "CLOSE_WAIT"},
		{NewSynRecv, "NEW_SYN_RECV"},
		{0, "STATE(0)"},
		{NewSynRecv + 1, "STATE(13)"},
	} {
		if got := c.s.String(); got != c.want {
			t.Errorf("State(%d).String() = %q, want %q", uint8(c.s), got, c.want)
		}
		if b, _ := c.s.MarshalText(); string(b) != c.want {
			t.Errorf("State(%d).MarshalText() = %q, want %q", uint8(c.s), b, c.want)
		}
	}
}
