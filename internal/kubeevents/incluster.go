package kubeevents

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// ServiceAccountDir is where the kubelet mounts a pod's service account:
// token, ca.crt, namespace.
const ServiceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// The variables the kubelet sets in every container for the API server's
// Service.
const (
	ServiceHostEnv = "KUBERNETES_SERVICE_HOST"
	ServicePortEnv = "KUBERNETES_SERVICE_PORT"
)

// Why a pod cannot post: not in a cluster, or no credentials.
var (
	ErrNoAPIServer = errors.New("no " + ServiceHostEnv + ": not in a Kubernetes pod")
	ErrNoToken     = errors.New("no service account token (automountServiceAccountToken: false?)")
)

// InCluster is how a pod reaches its API server.
type InCluster struct {
	// Server is https://host:port.
	Server string
	// TokenFile is read for each request; Token is its content at load.
	TokenFile string
	Token     []byte
	// Namespace is the service account's (the pod's) namespace.
	Namespace string
	// CAs verify the API server's certificate.
	CAs *x509.CertPool
}

// LoadInCluster reads the in-cluster configuration as client-go does:
// KUBERNETES_SERVICE_HOST and _PORT from lookup (nil: os.LookupEnv), the
// token, ca.crt and namespace from dir ("": ServiceAccountDir). Its errors
// wrap ErrNoAPIServer or ErrNoToken when that is why.
func LoadInCluster(lookup func(string) (string, bool), dir string) (InCluster, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	if dir == "" {
		dir = ServiceAccountDir
	}
	host, _ := lookup(ServiceHostEnv)
	port, _ := lookup(ServicePortEnv)
	if host == "" || port == "" {
		return InCluster{}, ErrNoAPIServer
	}
	ic := InCluster{Server: "https://" + net.JoinHostPort(host, port), TokenFile: filepath.Join(dir, "token")}
	var err error
	ic.Token, err = readToken(ic.TokenFile)
	if errors.Is(err, os.ErrNotExist) {
		return InCluster{}, fmt.Errorf("%w: %s", ErrNoToken, ic.TokenFile)
	}
	if err != nil {
		return InCluster{}, err
	}
	pem, err := os.ReadFile(filepath.Join(dir, "ca.crt"))
	if err != nil {
		return InCluster{}, fmt.Errorf("service account CA: %w", err)
	}
	ic.CAs = x509.NewCertPool()
	if !ic.CAs.AppendCertsFromPEM(pem) {
		return InCluster{}, fmt.Errorf("service account CA %s: no certificate in it", filepath.Join(dir, "ca.crt"))
	}
	ns, err := os.ReadFile(filepath.Join(dir, "namespace"))
	if err != nil {
		return InCluster{}, fmt.Errorf("service account namespace: %w", err)
	}
	ic.Namespace = string(bytes.TrimSpace(ns))
	return ic, nil
}

func readToken(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("service account token: %w", err)
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, fmt.Errorf("%w: %s is empty", ErrNoToken, path)
	}
	return b, nil
}

// tokenSource reads the token for each request (the kubelet rotates a
// projected token's file), keeping the last one read when the file
// cannot be read.
type tokenSource struct {
	file string
	mu   sync.Mutex
	last []byte
}

func (s *tokenSource) token() []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.file != "" {
		if b, err := readToken(s.file); err == nil {
			s.last = b
		}
	}
	return s.last
}

// transport is the client's: the API server's CA, nothing from the
// environment's proxy settings (the API server is the pod's own
// Service), and few idle connections (two requests a drain).
func (ic InCluster) transport() *http.Transport {
	return &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: ic.CAs, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout: 5 * time.Second,
		MaxIdleConnsPerHost: 1,
		IdleConnTimeout:     30 * time.Second,
		ForceAttemptHTTP2:   true,
	}
}
