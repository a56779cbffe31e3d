package cluster

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// pki is the cluster's certificates, made by crypto/x509 as
// kubernetes' local-up-cluster script makes them with cfssl: one CA signs
// the API server's serving certificate and every component's client
// certificate (the user is the CN, the groups the O); the service-account
// tokens have their own RSA key.
type pki struct {
	dir    string
	caCert *x509.Certificate
	caKey  *ecdsa.PrivateKey
}

// identity is a client certificate's: its file name, CN (the user) and O
// (the groups).
type identity struct {
	file, user string
	groups     []string
}

// clientIdentities are the cluster's clients, each with a certificate and
// a kubeconfig: the administrator, the components, and the node's kubelet.
func clientIdentities(nodeName string) []identity {
	return []identity{
		{"admin", "kubernetes-admin", []string{"system:masters"}},
		{"controller-manager", "system:kube-controller-manager", nil},
		{"scheduler", "system:kube-scheduler", nil},
		{"kube-proxy", "system:kube-proxy", nil},
		// The API server's client to the kubelets (logs, exec): the
		// kubelet's webhook authorizer asks RBAC, and system:masters may.
		{"apiserver-kubelet-client", "kube-apiserver-kubelet-client", []string{"system:masters"}},
		{"kubelet", "system:node:" + nodeName, []string{"system:nodes"}},
	}
}

func (p *pki) path(name string) string { return filepath.Join(p.dir, name) }

// makePKI writes ca.{crt,key}, apiserver.{crt,key}, sa.{key,pub}, and a
// client pair per identity and for the kubelet (system:node:NODE).
func makePKI(dir, nodeName string, apiIPs []net.IP, apiNames []string) (*pki, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	p := &pki{dir: dir}
	var err error
	if p.caKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader); err != nil {
		return nil, err
	}
	now := time.Now().Add(-time.Hour)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "draind-cluster-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &p.caKey.PublicKey, p.caKey)
	if err != nil {
		return nil, err
	}
	if p.caCert, err = x509.ParseCertificate(der); err != nil {
		return nil, err
	}
	if err := writeCert(p.path("ca.crt"), der); err != nil {
		return nil, err
	}
	if err := writeECKey(p.path("ca.key"), p.caKey); err != nil {
		return nil, err
	}
	serial := int64(2)
	leaf := func(name string, subj pkix.Name, usage x509.ExtKeyUsage, ips []net.IP, dns []string) error {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return err
		}
		serial++
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      subj,
			NotBefore:    now,
			NotAfter:     now.Add(365 * 24 * time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  ips,
			DNSNames:     dns,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, p.caCert, &key.PublicKey, p.caKey)
		if err != nil {
			return fmt.Errorf("certificate %s: %w", name, err)
		}
		return errors.Join(writeCert(p.path(name+".crt"), der), writeECKey(p.path(name+".key"), key))
	}
	if err := leaf("apiserver", pkix.Name{CommonName: "kube-apiserver"}, x509.ExtKeyUsageServerAuth, apiIPs, apiNames); err != nil {
		return nil, err
	}
	for _, id := range clientIdentities(nodeName) {
		if err := leaf(id.file, pkix.Name{CommonName: id.user, Organization: id.groups}, x509.ExtKeyUsageClientAuth, nil, nil); err != nil {
			return nil, err
		}
	}
	// The service-account signing key: RSA, as the API server's
	// --service-account-signing-key-file takes it.
	sa, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return nil, err
	}
	pub, err := x509.MarshalPKIXPublicKey(&sa.PublicKey)
	if err != nil {
		return nil, err
	}
	return p, errors.Join(
		os.WriteFile(p.path("sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(sa)}), 0o600),
		os.WriteFile(p.path("sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644),
	)
}

func writeCert(path string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644)
}

func writeECKey(path string, key *ecdsa.PrivateKey) error {
	b, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: b}), 0o600)
}

// kubeconfig writes a kubeconfig for one client certificate.
func (p *pki) kubeconfig(path, server, name string) error {
	s := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: draind
  cluster:
    server: %[1]s
    certificate-authority: %[2]s
users:
- name: %[3]s
  user:
    client-certificate: %[4]s
    client-key: %[5]s
contexts:
- name: draind
  context: {cluster: draind, user: %[3]s}
current-context: draind
`, server, p.path("ca.crt"), name, p.path(name+".crt"), p.path(name+".key"))
	return os.WriteFile(path, []byte(s), 0o600)
}
