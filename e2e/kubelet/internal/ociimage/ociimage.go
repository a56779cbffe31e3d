// Package ociimage writes OCI image archives (an OCI image layout in a tar,
// the form `ctr images import` reads) from static binaries and small
// files, with no Docker engine and no registry. A file can carry file
// capabilities: the security.capability xattr travels in the layer tar as
// the PAX record SCHILY.xattr.security.capability, which containerd's
// unpacker applies to the snapshot.
package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/draind/draind/e2e/kubelet/internal/fcap"
)

// File is one file of the image's single layer.
type File struct {
	Src  string      // host path of the content
	Data []byte      // or the content itself
	Dst  string      // absolute path in the image
	Mode fs.FileMode // permission bits; 0 means 0755
	Caps string      // file capabilities in setcap's text form, e.g. "cap_bpf,cap_perfmon+ep"; empty for none
}

// Spec describes an image.
type Spec struct {
	Ref        string // e.g. docker.io/draind/e2e-draind:dev
	Files      []File
	Dirs       []string // extra empty directories (mode 0777, e.g. a writable /tmp)
	Entrypoint []string
	Cmd        []string
	User       string
	Env        []string
	Labels     map[string]string
}

// epoch is every file's mtime: the same inputs give the same digests.
var epoch = time.Unix(0, 0).UTC()

// Image builds the image (linux/amd64 or the running GOARCH's platform).
func Image(spec Spec, arch string) (v1.Image, error) {
	layerTar, err := layerBytes(spec)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = spec.Entrypoint
	cf.Config.Cmd = spec.Cmd
	cf.Config.User = spec.User
	cf.Config.Env = append([]string{"PATH=/usr/local/bin:/usr/bin:/bin"}, spec.Env...)
	cf.Config.Labels = spec.Labels
	return mutate.ConfigFile(img, cf)
}

// WriteArchive writes the image as an OCI layout tar at out, named by
// spec.Ref for `ctr images import` (annotation io.containerd.image.name)
// and for OCI tools (org.opencontainers.image.ref.name).
func WriteArchive(out string, spec Spec, arch string) error {
	ref, err := name.ParseReference(spec.Ref)
	if err != nil {
		return fmt.Errorf("image %q: %w", spec.Ref, err)
	}
	img, err := Image(spec, arch)
	if err != nil {
		return fmt.Errorf("image %s: %w", spec.Ref, err)
	}
	dir, err := os.MkdirTemp("", "ociimage-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	tag := ref.Identifier()
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		// As given: name.Reference's Name() would say index.docker.io.
		"io.containerd.image.name":          spec.Ref,
		"org.opencontainers.image.ref.name": tag,
	})); err != nil {
		return err
	}
	return tarDir(dir, out)
}

// layerBytes is the layer: parent directories, then the files, sorted.
func layerBytes(spec Spec) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]fs.FileMode{}
	for _, d := range spec.Dirs {
		dirs[path.Clean(d)] = 0o777 | fs.ModeSticky
	}
	for _, f := range spec.Files {
		for d := path.Dir(path.Clean(f.Dst)); d != "/"; d = path.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	names := make([]string, 0, len(dirs))
	for d := range dirs {
		names = append(names, d)
	}
	slices.Sort(names)
	for _, d := range names {
		mode := int64(dirs[d].Perm())
		if dirs[d]&fs.ModeSticky != 0 {
			mode |= 0o1000
		}
		hdr := &tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: mode, ModTime: epoch, Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	files := slices.Clone(spec.Files)
	slices.SortFunc(files, func(a, b File) int { return strings.Compare(a.Dst, b.Dst) })
	for _, f := range files {
		data := f.Data
		if f.Src != "" {
			var err error
			if data, err = os.ReadFile(f.Src); err != nil {
				return nil, err
			}
		}
		mode := f.Mode.Perm()
		if mode == 0 {
			mode = 0o755
		}
		hdr := &tar.Header{
			Typeflag: tar.TypeReg, Name: strings.TrimPrefix(path.Clean(f.Dst), "/"),
			Mode: int64(mode), Size: int64(len(data)), ModTime: epoch, Format: tar.FormatPAX,
		}
		if f.Caps != "" {
			set, err := fcap.Parse(f.Caps)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", f.Dst, err)
			}
			hdr.PAXRecords = map[string]string{fcap.PAXRecord: string(set.Encode())}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarDir writes dir's tree (regular files and directories) as a tar.
func tarDir(dir, out string) (err error) {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	tw := tar.NewWriter(f)
	werr := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname, hdr.ModTime = 0, 0, "", "", epoch
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	return errors.Join(werr, tw.Close())
}
