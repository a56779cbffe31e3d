package main

import (
	"debug/elf"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
)

// guestArch is what booting a guest of one architecture takes. The guest's
// architecture is the test binary's: `GOARCH=arm64 go test -exec vmexec`
// boots an arm64 VM.
type guestArch struct {
	goarch  string // GOARCH spelling, also the suffix of vmexec-ARCH and rootfs/ARCH
	machine elf.Machine
	qemu    string
	// qemuMachine are the machine and CPU flags under TCG.
	qemuMachine []string
	// cmdline is the kernel command line before the common part.
	cmdline []string
}

var guestArches = []guestArch{
	{
		goarch:      "amd64",
		machine:     elf.EM_X86_64,
		qemu:        "qemu-system-x86_64",
		qemuMachine: []string{"-accel", "tcg", "-cpu", "max"},
		cmdline:     []string{"console=ttyS0", "8250.nr_uarts=1", "i8042.noaux", "i8042.nokbd"},
	},
	{
		goarch:  "arm64",
		machine: elf.EM_AARCH64,
		qemu:    "qemu-system-aarch64",
		// virt: PCIe (virtio-*-pci as on x86), a PL011 UART and PSCI power
		// off. pauth-impdef: the architected pointer-authentication
		// algorithm (QARMA) costs TCG dearly; the implementation-defined
		// one is cheap and the guest cannot tell.
		qemuMachine: []string{"-machine", "virt", "-accel", "tcg", "-cpu", "max,pauth-impdef=on"},
		cmdline:     []string{"console=ttyAMA0"},
	},
}

// archOf reads the architecture of an ELF executable.
func archOf(path string) (*guestArch, error) {
	f, err := elf.Open(path)
	if err != nil {
		return nil, fmt.Errorf("inspect %s: %w", path, err)
	}
	defer f.Close()
	for i := range guestArches {
		if guestArches[i].machine == f.Machine {
			return &guestArches[i], nil
		}
	}
	return nil, fmt.Errorf("%s is built for %v; the runner boots amd64 and arm64 guests", path, f.Machine)
}

// guestInit picks the init for a guest of arch: the --init binary, this
// binary when the guest is of the host's architecture, else vmexec-ARCH
// beside it (make tools and tools/vmtest/vmtest.sh build both). It must be
// static and of the guest's architecture.
func guestInit(self, explicit string, arch *guestArch) (string, error) {
	init := explicit
	switch {
	case init != "":
	case arch.goarch == runtime.GOARCH:
		init = self
	default:
		init = self + "-" + arch.goarch
		if _, err := os.Stat(init); err != nil {
			return "", fmt.Errorf("an %s guest needs an init built for it: %s is missing (CGO_ENABLED=0 GOARCH=%s go -C tools build -o %s ./vmtest/vmexec, or pass --init)",
				arch.goarch, init, arch.goarch, init)
		}
	}
	got, err := archOf(init)
	if err != nil {
		return "", fmt.Errorf("init: %w", err)
	}
	if got != arch {
		return "", fmt.Errorf("init %s is built for %s, the test binary for %s", init, got.goarch, arch.goarch)
	}
	return init, checkStatic(init)
}

// guestRoot picks the directory shared as the guest's root: --root, the
// host's own root for the host's architecture (vimto's contract), else the
// root filesystem tools/vmtest/vmtest.sh builds from Debian packages of the
// guest's architecture (host programs like sh or iptables would not run).
func guestRoot(explicit string, arch *guestArch) (string, error) {
	switch {
	case explicit != "":
		return filepath.Abs(explicit)
	case arch.goarch == runtime.GOARCH:
		return "/", nil
	}
	root := filepath.Join(cacheDir(), "rootfs", arch.goarch)
	if _, err := os.Stat(filepath.Join(root, ".complete")); err != nil {
		return "", fmt.Errorf("an %s guest needs a root filesystem of its architecture, and %s is not built: run `bash tools/vmtest/vmtest.sh --fetch --arch %s`, or pass --root",
			arch.goarch, root, arch.goarch)
	}
	return root, nil
}
