package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
)

const (
	defaultKernel = "6.1"
	defaultMemory = "1536M"
	defaultSMP    = "2"
	// cgroup2Cmdline boots with the cgroup v2 unified hierarchy alone: no
	// controller can be bound to a v1 hierarchy (what current
	// distributions, systemd's unified mode and kubelet >= 1.35 expect).
	cgroup2Cmdline = "cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1"
	// bootMargin is added to the test binary's own -test.timeout: boot,
	// 9p start-up and power-off under TCG.
	bootMargin     = 2 * time.Minute
	defaultTimeout = 30 * time.Minute
)

// defaultModules are loaded at boot: what the init needs (virtio, 9p,
// overlay) and what the project's tests need (sock_diag, veth). Missing or
// built-in ones are fine.
var defaultModules = []string{
	"virtio_pci", "virtio_console", "virtio_rng",
	"9pnet_virtio", "9p", "overlay",
	"inet_diag", "tcp_diag", "udp_diag", "veth",
}

type options struct {
	Kernel  string
	Memory  string
	SMP     string
	Timeout time.Duration
	Modules []string
	Console bool
	Keep    bool
	// QEMU is the qemu binary; empty means the one for the guest's
	// architecture (guestArch.qemu).
	QEMU string
	// Root is the guest's root filesystem (a host directory, shared
	// read-only under a tmpfs overlay); empty means the host's own root
	// for a guest of the host's architecture, the cached root of
	// tools/vmtest/vmtest.sh for another.
	Root string
	// Init is the guest's init, a static vmexec built for the guest's
	// architecture; empty means this binary, or vmexec-ARCH beside it.
	Init string
	// Append is added to the kernel command line (cgroup_no_v1=all, ...).
	Append string
	// Tmpfs are guest directories given a tmpfs of their own, for what
	// cannot live on the overlay root (containerd's overlayfs snapshots).
	Tmpfs []string
	// Args is the command to run in the VM: the test binary and its flags.
	Args []string
}

// vmFlags are vimto's flags. `go test -exec vmexec ./pkg -vm.kernel=X` hands
// them to the runner after the test binary, among the test's own flags.
var vmFlags = map[string]bool{"vm.kernel": true, "vm.memory": true, "vm.smp": true, "vm.timeout": true}

func parseOptions(args []string, getenv func(string) string, cwd string, stderr io.Writer) (*options, error) {
	var (
		kernel, memory, smp, modules, qemu, timeout string
		root, init, cmdline, tmpfs                  string
		console, keep, cgroup2                      bool
	)
	fs := flag.NewFlagSet("vmexec", flag.ContinueOnError)
	fs.SetOutput(stderr)
	for _, name := range []string{"kernel", "vm.kernel"} {
		fs.StringVar(&kernel, name, "", "kernel: a directory (boot/vmlinuz*, lib/modules/RELEASE), a vmlinuz, or a cached alias like 6.1 (env DRAIND_VM_KERNEL)")
	}
	for _, name := range []string{"memory", "vm.memory"} {
		fs.StringVar(&memory, name, "", "guest memory, qemu -m syntax (default "+defaultMemory+")")
	}
	for _, name := range []string{"smp", "vm.smp"} {
		fs.StringVar(&smp, name, "", "guest CPUs, qemu -smp syntax (default "+defaultSMP+")")
	}
	for _, name := range []string{"timeout", "vm.timeout"} {
		fs.StringVar(&timeout, name, "", "overall limit for one VM (env DRAIND_VM_TIMEOUT; default -test.timeout + 2m, or 30m)")
	}
	fs.StringVar(&modules, "modules", "", "extra kernel modules to load at boot, comma-separated (env DRAIND_VM_MODULES)")
	fs.BoolVar(&console, "console", false, "stream the kernel console to stderr (env DRAIND_VM_CONSOLE=1)")
	fs.BoolVar(&keep, "keep", false, "keep the temporary directory (initramfs, console log)")
	fs.StringVar(&qemu, "qemu", "", "qemu binary (default qemu-system-x86_64 or qemu-system-aarch64, after the test binary's architecture)")
	fs.StringVar(&root, "root", "", "the guest's root filesystem, a host directory (env DRAIND_VM_ROOT; default / for a test binary of the host's architecture, the cache's rootfs/ARCH for another)")
	fs.StringVar(&init, "init", "", "the guest's init: a static vmexec built for the guest's architecture (env DRAIND_VM_INIT; default this binary, or vmexec-ARCH beside it)")
	fs.StringVar(&tmpfs, "tmpfs", "", "guest directories to mount a tmpfs on, comma-separated (env DRAIND_VM_TMPFS), e.g. containerd's root: overlayfs cannot stack on the overlay root")
	fs.BoolVar(&cgroup2, "cgroup2", false, "cgroup v2 only: boot with "+cgroup2Cmdline+" (env DRAIND_VM_CGROUP2=1)")
	fs.StringVar(&cmdline, "append", "", "added to the kernel command line, e.g. \"cgroup_no_v1=all\" (env DRAIND_VM_APPEND)")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: vmexec [flags] [--] /path/to/pkg.test [test flags]")
		fmt.Fprintln(fs.Output(), "Runs a test binary in a qemu VM; meant for go test -exec.")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("parse flags: %w", err)
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return nil, errors.New("missing the binary to run")
	}

	vm, rest := extractFlags(fs.Args(), vmFlags)
	pick := func(vals ...string) string {
		for _, v := range vals {
			if v != "" {
				return v
			}
		}
		return ""
	}
	cfg, err := loadVimtoConfig(cwd)
	if err != nil {
		return nil, err
	}

	o := &options{
		Kernel: pick(vm["vm.kernel"], kernel, getenv("DRAIND_VM_KERNEL"), cfg.usableKernel(), defaultKernel),
		Memory: pick(vm["vm.memory"], memory, cfg.Memory, defaultMemory),
		SMP:    pick(vm["vm.smp"], smp, cfg.SMP, defaultSMP),
		QEMU:   qemu,
		Root:   pick(root, getenv("DRAIND_VM_ROOT")),
		Init:   pick(init, getenv("DRAIND_VM_INIT")),
		Append: pick(cmdline, getenv("DRAIND_VM_APPEND")),
		Keep:   keep,
		Args:   rest,
	}
	o.Console = console || getenv("DRAIND_VM_CONSOLE") == "1"
	if cgroup2 || getenv("DRAIND_VM_CGROUP2") == "1" {
		o.Append = strings.TrimSpace(cgroup2Cmdline + " " + o.Append)
	}
	o.Modules = append([]string{}, defaultModules...)
	for _, m := range strings.Split(pick(modules, getenv("DRAIND_VM_MODULES")), ",") {
		if m = strings.TrimSpace(m); m != "" {
			o.Modules = append(o.Modules, m)
		}
	}
	for _, d := range strings.Split(pick(tmpfs, getenv("DRAIND_VM_TMPFS")), ",") {
		if d = strings.TrimSpace(d); d != "" {
			if !filepath.IsAbs(d) {
				return nil, fmt.Errorf("--tmpfs %s: not an absolute path", d)
			}
			o.Tmpfs = append(o.Tmpfs, filepath.Clean(d))
		}
	}
	if t := pick(vm["vm.timeout"], timeout, getenv("DRAIND_VM_TIMEOUT")); t != "" {
		if o.Timeout, err = time.ParseDuration(t); err != nil {
			return nil, fmt.Errorf("parse timeout: %w", err)
		}
	} else {
		o.Timeout = timeoutFor(rest)
	}
	return o, nil
}

// extractFlags removes the flags named in names (-NAME=VALUE or -NAME VALUE,
// one or two dashes, before any "--") from the command line of the test
// binary (args[0] is the binary) and returns their values; the last one wins,
// as with package flag.
func extractFlags(args []string, names map[string]bool) (map[string]string, []string) {
	found := map[string]string{}
	rest := []string{args[0]}
	for i := 1; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			rest = append(rest, args[i:]...)
			break
		}
		name := strings.TrimLeft(arg, "-")
		if !strings.HasPrefix(arg, "-") || len(arg)-len(name) > 2 {
			rest = append(rest, arg)
			continue
		}
		name, value, hasValue := strings.Cut(name, "=")
		if !names[name] {
			rest = append(rest, arg)
			continue
		}
		if !hasValue && i+1 < len(args) {
			i++
			value = args[i]
		}
		found[name] = value
	}
	return found, rest
}

// timeoutFor derives the VM's limit from the test binary's -test.timeout,
// which go test always passes (10m by default).
func timeoutFor(args []string) time.Duration {
	found, _ := extractFlags(args, map[string]bool{"test.timeout": true})
	d, err := time.ParseDuration(found["test.timeout"])
	if err != nil || d <= 0 {
		return defaultTimeout
	}
	return d + bootMargin
}

// vimtoConfig is the part of vimto's .vimto.toml that the runner uses.
// vimto's other keys (user, setup, teardown, ...) are left to vimto.
type vimtoConfig struct {
	Dir    string `toml:"-"` // where the file is
	Kernel string `toml:"kernel"`
	Memory string `toml:"memory"`
	SMP    string `toml:"smp"`
}

// usableKernel is the config's kernel when this runner can boot it: a local
// path (relative to the file) or a cache alias. vimto also takes OCI image
// references, which this runner skips.
func (c *vimtoConfig) usableKernel() string {
	k := c.Kernel
	switch {
	case k == "":
		return ""
	case kernelAlias.MatchString(k):
		return k
	case !filepath.IsAbs(k):
		k = filepath.Join(c.Dir, k)
	}
	if _, err := os.Stat(k); err != nil {
		return ""
	}
	return k
}

// loadVimtoConfig reads .vimto.toml from dir or from the root of the git
// repository around it, as vimto does. No file is no error.
func loadVimtoConfig(dir string) (*vimtoConfig, error) {
	candidates := []string{dir}
	if root := gitRoot(dir); root != "" && root != dir {
		candidates = append(candidates, root)
	}
	for _, d := range candidates {
		path := filepath.Join(d, ".vimto.toml")
		raw, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read vimto config: %w", err)
		}
		cfg := &vimtoConfig{Dir: d}
		if err := toml.Unmarshal(raw, cfg); err != nil {
			return nil, fmt.Errorf("parse %s: %w", path, err)
		}
		return cfg, nil
	}
	return &vimtoConfig{}, nil
}

// gitRoot walks up from dir to the directory holding .git.
func gitRoot(dir string) string {
	for d := dir; ; {
		if _, err := os.Stat(filepath.Join(d, ".git")); err == nil {
			return d
		}
		parent := filepath.Dir(d)
		if parent == d {
			return ""
		}
		d = parent
	}
}
