package main

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// kernelImage is a kernel to boot and, optionally, its module tree.
type kernelImage struct {
	Vmlinuz string
	Release string
	// ModDir is the host directory holding modules.dep and kernel/ for
	// Release; empty when the kernel comes without modules.
	ModDir string
}

// cacheDir is where tools/vmtest/vmtest.sh keeps the kernels it fetched.
func cacheDir() string {
	if d := os.Getenv("DRAIND_VM_CACHE"); d != "" {
		return d
	}
	if d := os.Getenv("XDG_CACHE_HOME"); d != "" {
		return filepath.Join(d, "draind-vm")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return filepath.Join(os.TempDir(), "draind-vm-cache")
	}
	return filepath.Join(home, ".cache", "draind-vm")
}

// kernelAlias names a kernel of the cache: "6.1" (amd64) or "6.1-arm64".
var kernelAlias = regexp.MustCompile(`^[0-9]+\.[0-9]+(-arm64)?$`)

// resolveKernel accepts a vmlinuz file, a directory laid out like an
// extracted Debian linux-image package (boot/vmlinuz*, lib/modules/RELEASE),
// or a version alias such as "6.1" or "6.1-arm64" naming a directory of the
// cache.
func resolveKernel(spec string) (*kernelImage, error) {
	if spec == "" {
		return nil, errors.New("no kernel: pass --kernel (a directory, a vmlinuz, or an alias like 6.1 fetched by tools/vmtest/vmtest.sh)")
	}
	st, err := os.Stat(spec)
	if err != nil && kernelAlias.MatchString(spec) {
		dir := filepath.Join(cacheDir(), "kernels", spec)
		if st, err = os.Stat(dir); err != nil {
			return nil, fmt.Errorf("kernel %s is not in the cache %s: fetch it with `bash tools/vmtest/vmtest.sh --fetch --kernels %s`", spec, cacheDir(), spec)
		}
		spec = dir
	}
	if err != nil {
		return nil, fmt.Errorf("kernel %q: %w", spec, err)
	}
	if !st.IsDir() {
		name := spec
		if real, err := filepath.EvalSymlinks(spec); err == nil {
			name = real
		}
		return &kernelImage{Vmlinuz: spec, Release: strings.TrimPrefix(filepath.Base(name), "vmlinuz-")}, nil
	}
	return kernelFromDir(spec)
}

func kernelFromDir(dir string) (*kernelImage, error) {
	k := &kernelImage{}
	var modDirs []string
	for _, base := range []string{"lib/modules", "usr/lib/modules"} {
		m, _ := filepath.Glob(filepath.Join(dir, base, "*", "modules.dep"))
		for _, dep := range m {
			modDirs = append(modDirs, filepath.Dir(dep))
		}
	}
	switch len(modDirs) {
	case 0:
	case 1:
		k.ModDir = modDirs[0]
		k.Release = filepath.Base(k.ModDir)
	default:
		return nil, fmt.Errorf("kernel %s: more than one module tree: %v", dir, modDirs)
	}

	candidates := []string{filepath.Join(dir, "boot", "vmlinuz")}
	if k.Release != "" {
		candidates = append(candidates, filepath.Join(dir, "boot", "vmlinuz-"+k.Release))
	}
	globbed, _ := filepath.Glob(filepath.Join(dir, "boot", "vmlinuz-*"))
	if len(globbed) == 1 {
		candidates = append(candidates, globbed[0])
	}
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			k.Vmlinuz = c
			break
		}
	}
	if k.Vmlinuz == "" {
		return nil, fmt.Errorf("kernel %s: no boot/vmlinuz or single boot/vmlinuz-RELEASE", dir)
	}
	if k.Release == "" {
		if r, err := filepath.EvalSymlinks(k.Vmlinuz); err == nil {
			k.Release = strings.TrimPrefix(filepath.Base(r), "vmlinuz-")
		}
	}
	return k, nil
}

// moduleIndex is a parsed modules.dep (as written by depmod) and modules.builtin.
type moduleIndex struct {
	dir     string
	deps    map[string][]string // path relative to dir -> its dependencies
	byName  map[string]string   // module name -> path relative to dir
	builtin map[string]bool
}

// moduleName turns "kernel/net/9p/9pnet_virtio.ko.xz" into "9pnet_virtio".
func moduleName(p string) string {
	base := filepath.Base(p)
	if i := strings.Index(base, ".ko"); i >= 0 {
		base = base[:i]
	}
	return strings.ReplaceAll(base, "-", "_")
}

func loadModuleIndex(dir string) (*moduleIndex, error) {
	ix := &moduleIndex{dir: dir, deps: map[string][]string{}, byName: map[string]string{}, builtin: map[string]bool{}}
	f, err := os.Open(filepath.Join(dir, "modules.dep"))
	if err != nil {
		return nil, fmt.Errorf("module index: %w (generate it with depmod -b ROOT RELEASE)", err)
	}
	defer f.Close()
	if err := ix.parseDep(f); err != nil {
		return nil, err
	}
	if b, err := os.ReadFile(filepath.Join(dir, "modules.builtin")); err == nil {
		ix.parseBuiltin(bytes.NewReader(b))
	}
	return ix, nil
}

func (ix *moduleIndex) parseDep(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		mod, deps, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		mod = strings.TrimSpace(mod)
		ix.deps[mod] = strings.Fields(deps)
		ix.byName[moduleName(mod)] = mod
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("read modules.dep: %w", err)
	}
	return nil
}

func (ix *moduleIndex) parseBuiltin(r io.Reader) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if line := strings.TrimSpace(sc.Text()); line != "" {
			ix.builtin[moduleName(line)] = true
		}
	}
}

// resolve returns the module files (relative to the index's directory) to
// load for names, dependencies first, each once. Built-in modules need no
// file; names found nowhere are returned in missing.
func (ix *moduleIndex) resolve(names []string) (files, missing []string) {
	seen := map[string]bool{}
	var visit func(rel string)
	visit = func(rel string) {
		if seen[rel] {
			return
		}
		seen[rel] = true
		for _, d := range ix.deps[rel] {
			visit(d)
		}
		files = append(files, rel)
	}
	for _, n := range names {
		n = strings.ReplaceAll(strings.TrimSpace(n), "-", "_")
		if n == "" {
			continue
		}
		if rel, ok := ix.byName[n]; ok {
			visit(rel)
		} else if !ix.builtin[n] {
			missing = append(missing, n)
		}
	}
	return files, missing
}

// readModule returns a module's ELF object, decompressing .ko.xz, .ko.zst and
// .ko.gz (the kernel's finit_module takes only plain objects before 6.x's
// optional in-kernel decompression).
func readModule(ctx context.Context, path string) ([]byte, error) {
	switch {
	case strings.HasSuffix(path, ".ko"):
		return os.ReadFile(path)
	case strings.HasSuffix(path, ".gz"):
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("decompress %s: %w", path, err)
		}
		return io.ReadAll(zr)
	case strings.HasSuffix(path, ".xz"):
		return decompressWith(ctx, "xz", path)
	case strings.HasSuffix(path, ".zst"):
		return decompressWith(ctx, "zstd", path)
	default:
		return nil, fmt.Errorf("module %s: unknown compression", path)
	}
}

func decompressWith(ctx context.Context, tool, path string) ([]byte, error) {
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, tool, "-dc", path)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("decompress %s with %s: %w: %s", path, tool, err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// moduleFiles resolves names and returns the initramfs entries for them, in
// load order, named /modules/NN-name.ko.
func moduleFiles(ctx context.Context, k *kernelImage, names []string, warn io.Writer) ([]initramfsFile, error) {
	if k.ModDir == "" {
		// A kernel without a module tree must have what it needs built in.
		return nil, nil
	}
	ix, err := loadModuleIndex(k.ModDir)
	if err != nil {
		return nil, err
	}
	rels, missing := ix.resolve(names)
	if len(missing) > 0 {
		sort.Strings(missing)
		fmt.Fprintf(warn, "vmexec: kernel %s has no module %s (neither file nor built-in); continuing\n", k.Release, strings.Join(missing, ", "))
	}
	files := make([]initramfsFile, 0, len(rels))
	for i, rel := range rels {
		data, err := readModule(ctx, filepath.Join(k.ModDir, rel))
		if err != nil {
			return nil, err
		}
		files = append(files, initramfsFile{
			Name: fmt.Sprintf("/modules/%02d-%s.ko", i, moduleName(rel)),
			Perm: 0o644,
			Data: data,
		})
	}
	return files, nil
}
