// Package kubeevents records a drain's start and end as Kubernetes Events
// on draind's own pod, where `kubectl describe pod` and `kubectl get
// events` show them.
//
// # What is posted
//
// Two core/v1 Events per drain (POST /api/v1/namespaces/NS/events), each
// with involvedObject {v1, Pod, name, namespace, uid}: kubectl describe
// lists a pod's Events by involvedObject.uid, so the pod's UID is needed
// (the downward API's metadata.uid, [PodUIDEnv]). Their text is a pure
// function of the machine's [drain.State]: [BeganText] (DrainStarted:
// trigger, pod shape, deadline) and [EndedText] (Drained, or DrainCut /
// DrainIncomplete as Warnings: how long, what held and for how long,
// what the deadline cut, how the proxy stopped).
//
// # The API server
//
// Reached as client-go's in-cluster configuration reaches it, with
// net/http and encoding/json only (draind runs in every pod: no client
// library's size or memory): KUBERNETES_SERVICE_HOST and _PORT, the
// service account's token, CA and namespace files ([LoadInCluster]). The
// token is read again for each request (the kubelet rotates it), the last
// one read kept when the file cannot be read.
//
// # Never in the drain's way
//
// [Reporter] is a drain.Reporter: DrainBegan and DrainEnded enqueue and
// return, never blocking the machine; a full queue drops the event and
// counts it. One goroutine, started by [Start] and stopped by
// [Reporter.Close], first asks the API server whether the pod may create
// Events (a SelfSubjectAccessReview, which any authenticated service
// account may post), then posts what is queued, each request bounded by
// its own timeout. Denied: one warning, and nothing is ever posted.
// Unreachable: one warning, and the drain's Events are still tried. At
// exit [Reporter.Flush] gives the last Event a short, bounded wait.
//
// # Errors and logs
//
// Errors are wrapped with %w; [ErrNoAPIServer] and [ErrNoToken] say why a
// pod is not in a cluster draind can post to. The package logs only
// through the *zap.Logger it is given, its lines marked with
// logevent.KubeEventsUnavailable and logevent.KubeEventPostFailed.
package kubeevents
