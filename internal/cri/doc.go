// Package cri finds a node's pods through its container runtime's CRI
// socket (containerd's, CRI-O's): which pods run here, their network
// namespaces and their containers' processes. It serves draind's node
// commands (`draind pods`, `--pod` of conns and watch); `draind run`
// never imports it.
//
// # Endpoints
//
// [Locate] says which socket to dial and why: the one given (a flag, or
// CONTAINER_RUNTIME_ENDPOINT as crictl reads it), else the one the node's
// kubelet names (its --container-runtime-endpoint flag, or its --config
// file's containerRuntimeEndpoint), else the first of [DefaultEndpoints]
// that exists. A kubelet counts only in the PID and mount namespaces and
// the root of /proc's PID 1 (with hostPID, the node's init): a tenant's
// process named kubelet never does, and two that count are an error.
// The paths it names are reached under the node's root (/proc/1/root
// when this process's is another: a debug pod's), never under the
// kubelet's own, and its --config is read there with internal/rootfs's
// bounds.
//
// # Pods
//
// A [Client] ([Dial]) lists the ready sandboxes ([Client.Pods]) or finds
// one by namespace and name ([Client.FindPod]). A [Pod] carries what the
// runtime's verbose status says of its sandbox: the sandbox process's PID
// on the node and the network namespace's path (the node's paths, as the
// runtime names them). [Client.Containers] lists a pod's running
// containers with their PIDs, argv and environment (the OCI runtime spec
// the runtime created them with).
//
// # Errors
//
// Errors are lowercase, one line, and wrap their cause (%w). Callers
// branch on [ErrPodNotFound] (no ready sandbox of that name on this node),
// [ErrPodNotReady] (its sandbox exists and is not ready) and
// [ErrNoRuntime] (no socket at the endpoint, or nothing answers on it).
// The package logs nothing.
package cri
