package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
)

// cpioWriter writes a cpio archive in the "newc" format, the one the kernel
// unpacks as an initramfs (Documentation/driver-api/early-userspace/buffer-format.rst).
type cpioWriter struct {
	w    *bufio.Writer
	n    int64 // bytes written, for padding
	ino  uint32
	dirs map[string]bool
	err  error
}

func newCPIOWriter(w io.Writer) *cpioWriter {
	return &cpioWriter{w: bufio.NewWriter(w), dirs: map[string]bool{"": true, ".": true, "/": true}}
}

const (
	cpioModeDir  = 0o040000
	cpioModeFile = 0o100000
	cpioModeChar = 0o020000
)

func (c *cpioWriter) write(p []byte) {
	if c.err != nil {
		return
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
}

func (c *cpioWriter) pad() {
	if rem := c.n % 4; rem != 0 {
		c.write(make([]byte, 4-rem))
	}
}

func (c *cpioWriter) header(name string, mode uint32, size int64, rdevMajor, rdevMinor uint32) {
	c.ino++
	nlink := uint32(1)
	if mode&0o170000 == cpioModeDir {
		nlink = 2
	}
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		c.ino, mode, 0, 0, nlink, 0, uint32(size), 0, 0, rdevMajor, rdevMinor, len(name)+1, 0)
	c.write([]byte(hdr))
	c.write([]byte(name))
	c.write([]byte{0})
	c.pad()
}

// cleanName is name as the archive holds it: relative, cleaned.
func cleanName(name string) string { return strings.TrimPrefix(path.Clean("/"+name), "/") }

// Dir adds a directory and its missing parents.
func (c *cpioWriter) Dir(name string, perm uint32) {
	name = cleanName(name)
	if c.dirs[name] {
		return
	}
	c.Dir(path.Dir(name), 0o755)
	c.dirs[name] = true
	c.header(name, cpioModeDir|perm, 0, 0, 0)
}

// entry writes the header of a file or device node after its missing parents.
func (c *cpioWriter) entry(name string, mode uint32, size int64, rdevMajor, rdevMinor uint32) {
	name = cleanName(name)
	c.Dir(path.Dir(name), 0o755)
	c.header(name, mode, size, rdevMajor, rdevMinor)
}

// CharDev adds a character device node.
func (c *cpioWriter) CharDev(name string, perm, major, minor uint32) {
	c.entry(name, cpioModeChar|perm, 0, major, minor)
}

// File adds a regular file read from r, which must yield exactly size bytes.
func (c *cpioWriter) File(name string, perm uint32, size int64, r io.Reader) {
	c.entry(name, cpioModeFile|perm, size, 0, 0)
	if c.err != nil {
		return
	}
	n, err := io.Copy(c.w, io.LimitReader(r, size))
	c.n += n
	if err == nil && n != size {
		err = fmt.Errorf("cpio %s: got %d bytes, want %d", name, n, size)
	}
	c.err = err
	c.pad()
}

// Close writes the trailer and flushes; it does not close the underlying writer.
func (c *cpioWriter) Close() error {
	c.header("TRAILER!!!", 0, 0, 0, 0)
	if c.err != nil {
		return fmt.Errorf("write cpio: %w", c.err)
	}
	if err := c.w.Flush(); err != nil {
		return fmt.Errorf("write cpio: %w", err)
	}
	return nil
}

// initramfsFile is one file to put into the initramfs.
type initramfsFile struct {
	Name string // path inside the archive
	Perm uint32
	Data []byte // content, or
	From string // a host file to copy
}

// writeInitramfs writes an initramfs with the usual top-level directories, a
// /dev/console node and files.
func writeInitramfs(dst string, files []initramfsFile) (err error) {
	f, err := os.Create(dst)
	if err != nil {
		return fmt.Errorf("create initramfs: %w", err)
	}
	defer func() {
		if cerr := f.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("close initramfs: %w", cerr)
		}
	}()
	c := newCPIOWriter(f)
	for _, d := range []string{"dev", "proc", "sys", "mnt", "tmp", "root"} {
		c.Dir(d, 0o755)
	}
	c.CharDev("dev/console", 0o600, 5, 1)
	for _, file := range files {
		if err := addFile(c, file); err != nil {
			return err
		}
	}
	return c.Close()
}

// addFile adds file to the archive, reading it from the host when it names one.
func addFile(c *cpioWriter, file initramfsFile) error {
	if file.From == "" {
		c.File(file.Name, file.Perm, int64(len(file.Data)), bytes.NewReader(file.Data))
		return nil
	}
	src, err := os.Open(file.From)
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return fmt.Errorf("initramfs: %w", err)
	}
	c.File(file.Name, file.Perm, st.Size(), src)
	return nil
}
