package cri

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// fakeRuntime answers the CRI calls Pods makes, at the message level:
// sandboxes by id, and a status error for those named in failStatus.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	sandboxes  []*runtimeapi.PodSandbox
	failStatus map[string]error
}

func (f *fakeRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "fake", RuntimeVersion: "1"}, nil
}

func (f *fakeRuntime) ListPodSandbox(_ context.Context, r *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	var items []*runtimeapi.PodSandbox
	for _, sb := range f.sandboxes {
		match := true
		for k, v := range r.GetFilter().GetLabelSelector() {
			match = match && sb.GetLabels()[k] == v
		}
		if match {
			items = append(items, sb)
		}
	}
	return &runtimeapi.ListPodSandboxResponse{Items: items}, nil
}

func (f *fakeRuntime) PodSandboxStatus(_ context.Context, r *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	if err := f.failStatus[r.GetPodSandboxId()]; err != nil {
		return nil, err
	}
	return &runtimeapi.PodSandboxStatusResponse{
		Status: &runtimeapi.PodSandboxStatus{Network: &runtimeapi.PodSandboxNetworkStatus{Ip: "10.0.0." + r.GetPodSandboxId()}},
		Info:   map[string]string{"info": `{"pid": 42}`},
	}, nil
}

// serveFake serves f on a unix socket and dials it.
func serveFake(t *testing.T, f *fakeRuntime) *Client {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "cri.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, f)
	go srv.Serve(ln) // ends with srv.Stop
	t.Cleanup(srv.Stop)
	c, err := Dial(context.Background(), "unix://"+sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func sandbox(id, ns, name string) *runtimeapi.PodSandbox {
	return &runtimeapi.PodSandbox{Id: id, Metadata: &runtimeapi.PodSandboxMetadata{Namespace: ns, Name: name},
		State:  runtimeapi.PodSandboxState_SANDBOX_READY,
		Labels: map[string]string{"io.kubernetes.pod.namespace": ns, "io.kubernetes.pod.name": name}}
}

// TestPodsOneStatusFails: a sandbox whose status errors is listed with
// its error, the others whole; one that vanished since the listing is
// left out; FindPod on the failing one returns its error.
func TestPodsOneStatusFails(t *testing.T) {
	f := &fakeRuntime{
		sandboxes: []*runtimeapi.PodSandbox{sandbox("1", "a", "ok"), sandbox("2", "a", "wedged"), sandbox("3", "a", "gone")},
		failStatus: map[string]error{
			"2": status.Error(codes.DeadlineExceeded, "sandbox busy"),
			"3": status.Error(codes.NotFound, "no such sandbox"),
		},
	}
	c := serveFake(t, f)
	pods, err := c.Pods(context.Background())
	if err != nil {
		t.Fatalf("Pods: %v", err)
	}
	if len(pods) != 2 {
		t.Fatalf("Pods: %d pods, want 2 (the vanished one left out): %+v", len(pods), pods)
	}
	if p := pods[0]; p.Name != "ok" || p.StatusErr != nil || p.IP != "10.0.0.1" || p.PID != 42 {
		t.Errorf("pods[0] = %+v, want a/ok with its status read", p)
	}
	if p := pods[1]; p.Name != "wedged" || status.Code(errors.Unwrap(p.StatusErr)) != codes.DeadlineExceeded {
		t.Errorf("pods[1] = %+v (StatusErr %v), want a/wedged with its status error", p, p.StatusErr)
	}
	if _, err := c.FindPod(context.Background(), "a", "wedged"); status.Code(errors.Unwrap(err)) != codes.DeadlineExceeded {
		t.Errorf("FindPod(a/wedged) = %v, want its status error", err)
	}
	if p, err := c.FindPod(context.Background(), "a", "ok"); err != nil || p.IP != "10.0.0.1" {
		t.Errorf("FindPod(a/ok) = %+v, %v", p, err)
	}
}
