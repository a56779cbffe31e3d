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
// that exists. A kubelet found in /proc is reached through
// /proc/PID/root: the paths it names are its own root's, which is not
// this process's in a debug pod whose host is at /host.
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
