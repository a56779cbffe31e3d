package probes

import (
	"encoding/binary"
	"testing"
)

func TestPodOf(t *testing.T) {
	for _, tc := range []struct {
		name      string
		ancestors []uint64
		own       uint64
		level     int
		pod       uint64
		ok        bool
	}{
		{"a container in a pod", []uint64{1, 10, 20, 30}, 30, 2, 20, true},
		{"cgroup v1: v2's root alone", []uint64{1}, 1, 0, 0, false},
		{"a child of the root: the root is no pod", []uint64{1, 10}, 10, 0, 0, false},
		{"whoami cut short", []uint64{1, 10, 20}, 30, 0, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			level, pod, container, ok := podOf(tc.ancestors, tc.own)
			if ok != tc.ok || (ok && (level != tc.level || pod != tc.pod || container != tc.own)) {
				t.Errorf("podOf = %d %d %d %t, want %d %d %d %t", level, pod, container, ok, tc.level, tc.pod, tc.own, tc.ok)
			}
		})
	}
}

func TestDecodeEarlyExit(t *testing.T) {
	b := make([]byte, earlyExitSize)
	le := binary.LittleEndian
	le.PutUint64(b[0:], 123)
	le.PutUint64(b[8:], 55)
	le.PutUint64(b[16:], 56)
	le.PutUint32(b[24:], 4242)
	le.PutUint32(b[28:], CLDKilled)
	le.PutUint32(b[32:], 9)
	copy(b[40:], "report\x00junk")
	got, ok := decodeEarlyExit(b)
	want := EarlyExit{Ktime: 123, Container: 55, Cgroup: 56, TGID: 4242, Code: CLDKilled, Status: 9, Comm: "report"}
	if !ok || got != want || !got.Ended() {
		t.Errorf("decode = %+v %t, want %+v", got, ok, want)
	}
	if _, ok := decodeEarlyExit(b[:20]); ok {
		t.Error("a short record decoded")
	}
	if (EarlyExit{Code: 5}).Ended() { // CLD_STOPPED
		t.Error("a stop taken for an end")
	}
}
