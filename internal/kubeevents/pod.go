package kubeevents

import "os"

// The downward API's variables that name draind's pod: each fact is read
// from here and nowhere else. Istio's injected sidecar sets POD_NAME and
// POD_NAMESPACE, and the node as ISTIO_META_NODE_NAME; the manifests of
// deploy/ set all four.
const (
	PodNameEnv      = "POD_NAME"      // metadata.name
	PodNamespaceEnv = "POD_NAMESPACE" // metadata.namespace
	PodUIDEnv       = "POD_UID"       // metadata.uid
	NodeNameEnv     = "NODE_NAME"     // spec.nodeName
	// IstioNodeNameEnv is Istio's name for spec.nodeName, read when
	// NodeNameEnv is unset.
	IstioNodeNameEnv = "ISTIO_META_NODE_NAME"
)

// Pod is the pod the Events are about.
type Pod struct {
	Name, Namespace, UID string
	// Node is the node's name, the Events' source host ("": unknown).
	Node string
}

// PodFromEnv reads the pod from the downward API's variables (lookup nil:
// os.LookupEnv). A name left unset is the host name (a pod's, unless its
// spec sets hostname); a namespace left unset is the service account's
// (LoadInCluster's, the same namespace).
func PodFromEnv(lookup func(string) (string, bool)) Pod {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	get := func(names ...string) string {
		for _, n := range names {
			if v, ok := lookup(n); ok && v != "" {
				return v
			}
		}
		return ""
	}
	p := Pod{Name: get(PodNameEnv), Namespace: get(PodNamespaceEnv), UID: get(PodUIDEnv), Node: get(NodeNameEnv, IstioNodeNameEnv)}
	if p.Name == "" {
		p.Name, _ = os.Hostname()
	}
	return p
}
