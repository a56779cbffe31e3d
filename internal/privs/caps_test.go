package privs

import (
	"strings"
	"testing"
)

func TestParseSet(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    Set
		str     string
		wantErr string
	}{
		{"", 0, "none", ""},
		{"NET_ADMIN", SetOf(CapNetAdmin), "NET_ADMIN", ""},
		{"cap_bpf, CAP_PERFMON", SetOf(CapBPF, CapPerfmon), "PERFMON,BPF", ""},
		{"net_bind_service,,KILL", SetOf(10, CapKill), "KILL,NET_BIND_SERVICE", ""},
		{"CHECKPOINT_RESTORE,CHOWN", SetOf(40, 0), "CHOWN,CHECKPOINT_RESTORE", ""},
		{"NET_ADMIN,NOPE", 0, "", `"NOPE" is not a capability`},
		{"ALL", 0, "", `"ALL" is not a capability`},
		{"12", 0, "", `"12" is not a capability`},
	} {
		got, err := ParseSet(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseSet(%q) = %v, %v; want error %q", tc.in, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want || got.String() != tc.str {
			t.Errorf("ParseSet(%q) = %v (%s), %v; want %v (%s)", tc.in, uint64(got), got, err, uint64(tc.want), tc.str)
		}
		var back Set
		if err := back.UnmarshalText([]byte(got.String())); err != nil || back != got {
			t.Errorf("UnmarshalText(%q) = %v, %v", got.String(), back, err)
		}
	}
	if s := Cap(50).String(); s != "50" {
		t.Errorf("Cap(50) = %q", s)
	}
	if n := SetOf(CapKill, CapBPF).Numbers(); len(n) != 2 || n[0] != 5 || n[1] != 39 {
		t.Errorf("Numbers = %v", n)
	}
}

// A /proc/PID/status of `draind run` as uid 1337 after start-up, kernel 6.18.
const statusFixture = `Name:	draind
Umask:	0022
State:	S (sleeping)
Uid:	1337	1337	1337	1337
Gid:	1337	1337	1337	1337
CapInh:	0000000000000000
CapPrm:	0000000000000020
CapEff:	0000000000000020
CapBnd:	000001fffeffffff
CapAmb:	0000000000000000
NoNewPrivs:	1
Seccomp:	0
`

func TestReadStatus(t *testing.T) {
	s, err := ReadStatus(strings.NewReader(statusFixture))
	if err != nil {
		t.Fatal(err)
	}
	want := Sets{Effective: SetOf(CapKill), Permitted: SetOf(CapKill), Bounding: 0x000001fffeffffff, NoNewPrivs: true}
	if s != want {
		t.Errorf("ReadStatus = %+v, want %+v", s, want)
	}
	if got := s.StatusLines(); !strings.Contains(statusFixture, got) {
		t.Errorf("StatusLines does not print what /proc printed:\n%s", got)
	}
	for _, bad := range []string{"Name:\tx\n", "CapEff:\tzz\n", "CapEff:\t1ffffffffffffffff\n"} {
		if _, err := ReadStatus(strings.NewReader(bad)); err == nil {
			t.Errorf("ReadStatus(%q): no error", bad)
		}
	}
}

// FuzzParseSet: --proxy-caps and DRAIND_PROXY_CAPS come from the pod spec.
// Whatever they say, ParseSet never panics, its errors are one line, and
// what it accepts prints back to the same set.
func FuzzParseSet(f *testing.F) {
	for _, s := range []string{"", "NET_ADMIN", "cap_bpf,cap_perfmon", " kill , ,SETUID", "CAP_", "NET_ADMIN\n", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseSet(in)
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error is not one line: %q", err)
			}
			return
		}
		back, err := ParseSet(strings.ReplaceAll(s.String(), "none", ""))
		if err != nil || back != s {
			t.Fatalf("%q → %s → %v, %v", in, s, back, err)
		}
	})
}
