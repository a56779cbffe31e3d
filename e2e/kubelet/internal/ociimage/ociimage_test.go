package ociimage

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/draind/draind/e2e/kubelet/internal/fcap"
)

// readTar returns an archive's regular files by name.
func readTar(t *testing.T, r io.Reader) (map[string][]byte, map[string]*tar.Header) {
	t.Helper()
	files, hdrs := map[string][]byte{}, map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, hdrs
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		files[h.Name], hdrs[h.Name] = b, h
	}
}

// The archive is an OCI layout named for ctr import, and the layer carries
// the file capabilities as a PAX xattr record.
func TestWriteArchive(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "draind")
	os.WriteFile(src, []byte("binary"), 0o644)
	out := filepath.Join(dir, "img.tar")
	spec := Spec{
		Ref:        "docker.io/draind/e2e-draind:dev",
		Files:      []File{{Src: src, Dst: "/usr/local/bin/draind", Caps: "cap_bpf,cap_perfmon+ep"}, {Data: []byte("x"), Dst: "/etc/x", Mode: 0o644}},
		Dirs:       []string{"/tmp"},
		Entrypoint: []string{"/usr/local/bin/draind"},
		User:       "1337",
	}
	if err := WriteArchive(out, spec, "amd64"); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files, _ := readTar(t, f)
	if _, ok := files["oci-layout"]; !ok {
		t.Fatal("no oci-layout")
	}
	var index struct {
		Manifests []struct {
			Digest      string
			Annotations map[string]string
		}
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v %s", err, files["index.json"])
	}
	m := index.Manifests[0]
	if m.Annotations["io.containerd.image.name"] != spec.Ref || m.Annotations["org.opencontainers.image.ref.name"] != "dev" {
		t.Errorf("annotations %v", m.Annotations)
	}
	blob := func(digest string) []byte { return files["blobs/"+strings.Replace(digest, ":", "/", 1)] }
	var manifest struct {
		Config struct{ Digest string }
		Layers []struct{ Digest string }
	}
	if err := json.Unmarshal(blob(m.Digest), &manifest); err != nil || len(manifest.Layers) != 1 {
		t.Fatalf("manifest: %v", err)
	}
	var config struct {
		Architecture string
		Config       struct {
			User       string
			Entrypoint []string
		}
	}
	json.Unmarshal(blob(manifest.Config.Digest), &config)
	if config.Architecture != "amd64" || config.Config.User != "1337" || config.Config.Entrypoint[0] != "/usr/local/bin/draind" {
		t.Errorf("config %+v", config)
	}
	zr, err := gzip.NewReader(strings.NewReader(string(blob(manifest.Layers[0].Digest))))
	if err != nil {
		t.Fatal(err)
	}
	layer, hdrs := readTar(t, zr)
	h := hdrs["usr/local/bin/draind"]
	if h == nil || string(layer["usr/local/bin/draind"]) != "binary" || h.Mode != 0o755 {
		t.Fatalf("draind in the layer: %+v", h)
	}
	set, err := fcap.Decode([]byte(h.PAXRecords[fcap.PAXRecord]))
	if err != nil || set.String() != "cap_perfmon,cap_bpf+ep" {
		t.Errorf("caps record: %v %v", set, err)
	}
	if hdrs["etc/x"] == nil || hdrs["etc/x"].PAXRecords[fcap.PAXRecord] != "" || hdrs["tmp/"] == nil || hdrs["tmp/"].Mode != 0o1777 {
		t.Errorf("other entries: %+v %+v", hdrs["etc/x"], hdrs["tmp/"])
	}
}
