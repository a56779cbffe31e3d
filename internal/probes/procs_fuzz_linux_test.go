package probes

import (
	"encoding/binary"
	"testing"
)

// FuzzDecodeProcEvent: process records come from a BPF program and the
// kernel: any record either decodes or is refused (too short), never a
// panic; pids are never negative and the command name never holds a NUL.
func FuzzDecodeProcEvent(f *testing.F) {
	rec := make([]byte, procEventSize)
	binary.LittleEndian.PutUint32(rec[peKind:], uint32(ProcExit))
	binary.LittleEndian.PutUint32(rec[peTgid:], 4242)
	binary.LittleEndian.PutUint32(rec[peStatus:], 7<<8)
	copy(rec[peComm:], "app\x00junk")
	f.Add(rec)
	f.Add([]byte{})
	f.Add(make([]byte, procEventSize-1))
	f.Fuzz(func(t *testing.T, b []byte) {
		var ev ProcEvent
		if err := decodeProcEvent(b, false, &ev); err != nil {
			if len(b) >= procEventSize {
				t.Fatalf("a %d-byte record refused: %v", len(b), err)
			}
			return
		}
		if len(b) < procEventSize {
			t.Fatalf("a %d-byte record decoded", len(b))
		}
		if ev.Task.PID < 0 || ev.Task.PPID < 0 || ev.Task.NSPID < 0 || ev.Task.NSPPID < 0 {
			t.Fatalf("negative pids: %+v", ev.Task)
		}
		for i := 0; i < len(ev.Task.Comm); i++ {
			if ev.Task.Comm[i] == 0 {
				t.Fatalf("comm %q holds a NUL", ev.Task.Comm)
			}
		}
	})
}
