package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

type cpioEntry struct {
	name         string
	mode         uint32
	data         []byte
	rmaj, rminor uint32
}

// readCPIO parses a newc archive, checking the 4-byte alignment.
func readCPIO(t *testing.T, b []byte) []cpioEntry {
	t.Helper()
	var out []cpioEntry
	off := 0
	field := func(i int) uint32 {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
		if err != nil {
			t.Fatalf("header field %d at %d: %v", i, off, err)
		}
		return uint32(v)
	}
	align := func(n int) int { return (n + 3) &^ 3 }
	for {
		if off%4 != 0 || string(b[off:off+6]) != "070701" {
			t.Fatalf("bad header at %d", off)
		}
		mode, size, rmaj, rmin, namesize := field(1), field(6), field(9), field(10), field(11)
		nameStart := off + 110
		name := string(b[nameStart : nameStart+int(namesize)-1])
		dataStart := align(nameStart + int(namesize))
		data := b[dataStart : dataStart+int(size)]
		off = align(dataStart + int(size))
		if name == "TRAILER!!!" {
			return out
		}
		out = append(out, cpioEntry{name, mode, data, rmaj, rmin})
	}
}

func TestWriteInitramfs(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "init")
	if err := os.WriteFile(src, []byte("#!init binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	dst := filepath.Join(dir, "initramfs.cpio")
	err := writeInitramfs(dst, []initramfsFile{
		{Name: "/init", Perm: 0o755, From: src},
		{Name: "/modules/00-a.ko", Perm: 0o644, Data: []byte("abcde")},
		{Name: "/job.json", Perm: 0o644, Data: []byte("{}")},
	})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	entries := readCPIO(t, b)
	byName := map[string]cpioEntry{}
	var order []string
	for _, e := range entries {
		byName[e.name] = e
		order = append(order, e.name)
	}
	for name, want := range map[string]string{"init": "#!init binary", "modules/00-a.ko": "abcde", "job.json": "{}"} {
		e, ok := byName[name]
		if !ok {
			t.Fatalf("no %s in %q", name, order)
		}
		if !bytes.Equal(e.data, []byte(want)) || e.mode&0o170000 != cpioModeFile {
			t.Errorf("%s: mode %o data %q", name, e.mode, e.data)
		}
	}
	if e := byName["dev/console"]; e.mode != cpioModeChar|0o600 || e.rmaj != 5 || e.rminor != 1 {
		t.Errorf("dev/console = %+v", e)
	}
	if e := byName["modules"]; e.mode != cpioModeDir|0o755 {
		t.Errorf("parent directory modules missing or wrong: %+v", e)
	}
	// A directory comes before what it holds.
	seen := map[string]bool{}
	for _, name := range order {
		if parent := filepath.Dir(name); parent != "." && !seen[parent] {
			t.Errorf("%s precedes its directory", name)
		}
		seen[name] = true
	}
}
