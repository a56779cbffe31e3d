package kubelet_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/draind/draind/e2e/kubelet/internal/images"
	"github.com/draind/draind/e2e/kubelet/internal/node"
	"github.com/draind/draind/e2e/kubelet/internal/ociimage"
)

// The node tests run only under `make e2e-kubelet` (DRAIND_E2E_KUBELET=1,
// as root): they start containerd and a kubelet on this machine. The
// static checks (Dockerfile, manifests) always run.
const enableVar = "DRAIND_E2E_KUBELET"

var (
	theNode  *node.Node
	binDir   string // draind, envoysim, testapp, pause as built for the images
	nodeErr  error  // why the node is not there, when it was asked for
	report   = &reportLog{}
	repoRoot = mustAbs("../..")
)

// imageFileCaps are the root Dockerfile's DRAIND_FILE_CAPS, as every
// image of the suites carries them (images.FileCaps).
// TestDockerfileFileCapabilities keeps the two the same.
const imageFileCaps = images.FileCaps

// oldFileCaps is what the image had before draind raised its own
// capabilities (still built with --build-arg DRAIND_FILE_CAPS=...).
const oldFileCaps = "cap_bpf,cap_perfmon+ep"

// Image names: imported into containerd's k8s.io namespace, never pulled.
const (
	imgDraind       = "docker.io/draind/e2e-draind:dev"    // draind with the Dockerfile's file caps (imageFileCaps), envoysim as the proxy
	imgDraindEP     = "docker.io/draind/e2e-draind:ep"     // the old image: cap_bpf,cap_perfmon+ep (--build-arg DRAIND_FILE_CAPS)
	imgDraindNoCaps = "docker.io/draind/e2e-draind:nocaps" // the same binaries, no file capabilities
	imgApp          = "docker.io/draind/e2e-app:dev"
	imgPause        = "docker.io/draind/e2e-pause:dev"
	imgDraindTini   = "docker.io/draind/e2e-draind:tini" // root, ENTRYPOINT tini -- draind run -- envoysim, and posthook (owncontainer_test.go)
)

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		panic(err)
	}
	return a
}

func TestMain(m *testing.M) {
	code := func() int {
		if os.Getenv(clusterEnableVar) == "1" {
			return runWithCluster(m)
		}
		if os.Getenv(enableVar) != "1" {
			return m.Run()
		}
		if os.Geteuid() != 0 {
			nodeErr = fmt.Errorf("%s=1 needs root", enableVar)
			return m.Run()
		}
		ctx := context.Background()
		n, err := setUp(ctx)
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2e-kubelet: set-up:", err)
			return 1
		}
		theNode = n
		defer func() {
			t0 := time.Now()
			if err := n.Close(); err != nil {
				fmt.Fprintln(os.Stderr, "e2e-kubelet: teardown:", err)
			}
			report.add("phase", "teardown", time.Since(t0).Round(time.Millisecond).String())
			report.print(os.Stdout, n.Phases)
			os.RemoveAll(binDir)
		}()
		return m.Run()
	}()
	os.Exit(code)
}

// setUp builds the binaries and images, starts containerd, imports the
// images and starts the kubelet.
func setUp(ctx context.Context) (*node.Node, error) {
	kubelet := os.Getenv("KUBELET")
	if kubelet == "" {
		out, err := exec.Command("bash", "hack/build-kubelet.sh").Output()
		if err != nil {
			return nil, fmt.Errorf("build kubelet: %w", err)
		}
		kubelet = strings.TrimSpace(string(out))
	}
	cfg := node.DefaultConfig(kubelet)
	cfg.Logf = func(format string, args ...any) { fmt.Printf("e2e-kubelet: "+format+"\n", args...) }
	var err error
	if binDir, err = os.MkdirTemp("", "draind-e2e-bin-"); err != nil {
		return nil, err
	}
	t0 := time.Now()
	archives, err := buildImages(ctx, binDir)
	if err != nil {
		return nil, err
	}
	report.add("phase", "binaries and images", time.Since(t0).Round(time.Millisecond).String())
	n, err := node.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := n.Import(ctx, archives...); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	if err := n.StartKubelet(ctx); err != nil {
		return nil, errors.Join(err, n.Close())
	}
	return n, nil
}

func buildImages(ctx context.Context, dir string) ([]string, error) {
	bin := func(n string) string { return filepath.Join(dir, n) }
	builds := []struct{ dir, pkg, out string }{
		{repoRoot, "./cmd/draind", bin("draind")},
		{repoRoot, "./internal/testenv/envoysim/cmd/envoysim", bin("envoysim")},
		{".", "./cmd/testapp", bin("testapp")},
		{".", "./cmd/pause", bin("pause")},
		{".", "./cmd/posthook", bin("posthook")},
	}
	for _, b := range builds {
		if err := images.GoBuild(ctx, b.dir, b.pkg, b.out); err != nil {
			return nil, err
		}
	}
	draindImage := func(ref, caps string) ociimage.Spec {
		return ociimage.Spec{
			Ref: ref,
			Files: []ociimage.File{
				{Src: bin("draind"), Dst: "/usr/local/bin/draind", Caps: caps},
				{Src: bin("envoysim"), Dst: "/usr/local/bin/envoysim"},
			},
			Dirs:       []string{"/tmp"},
			Entrypoint: []string{"/usr/local/bin/draind", "run", "--", "/usr/local/bin/envoysim"},
			Cmd:        []string{"-c", "/work/envoysim.json"},
			User:       "1337",
		}
	}
	istio, err := istioProxyImage(dir)
	if err != nil {
		return nil, err
	}
	specs := []ociimage.Spec{
		draindImage(imgDraind, imageFileCaps),
		draindImage(imgDraindEP, oldFileCaps),
		draindImage(imgDraindNoCaps, ""),
		{Ref: imgApp, Files: []ociimage.File{{Src: bin("testapp"), Dst: "/usr/local/bin/testapp"}}, Dirs: []string{"/tmp"}, Entrypoint: []string{"/usr/local/bin/testapp"}, User: "1000"},
		{Ref: imgPause, Files: []ociimage.File{{Src: bin("pause"), Dst: "/pause"}}, Entrypoint: []string{"/pause"}, User: "65535"},
	}
	if tini, ok := tiniImage(bin); ok {
		specs = append(specs, tini)
	}
	if istio != nil { // istio_test.go: only with the pilot-agent peer built
		specs = append(specs, *istio)
	}
	var archives []string
	for i, s := range specs {
		out := filepath.Join(dir, fmt.Sprintf("image-%d.tar", i))
		if err := ociimage.WriteArchive(out, s, runtime.GOARCH); err != nil {
			return nil, err
		}
		archives = append(archives, out)
	}
	return archives, nil
}

// requireNode skips a test that needs the node when make e2e-kubelet did
// not ask for one, and fails it when the node was asked for but is broken.
func requireNode(t *testing.T) *node.Node {
	t.Helper()
	if nodeErr != nil {
		t.Fatal(nodeErr)
	}
	if theNode == nil {
		t.Skipf("needs a kubelet: run `sudo make e2e-kubelet` (%s=1)", enableVar)
	}
	return theNode
}

// reportLog collects the figures printed at the end of the run.
type reportLog struct {
	mu    sync.Mutex
	lines [][3]string
}

func (r *reportLog) add(kind, name, value string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, [3]string{kind, name, value})
}

func (r *reportLog) print(w *os.File, phases []node.Phase) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintln(w, "\n==== e2e-kubelet report ====")
	for _, p := range phases {
		fmt.Fprintf(w, "phase    %-34s %s\n", p.Name, p.Took.Round(time.Millisecond))
	}
	for _, l := range r.lines {
		fmt.Fprintf(w, "%-8s %-34s %s\n", l[0], l[1], l[2])
	}
}
