package node

import (
	"slices"
	"testing"

	"sigs.k8s.io/yaml"
)

// TestKubeletConfigClusterDNS: registered with an API server, the kubelet
// gives its pods the cluster's DNS; standalone, none.
func TestKubeletConfigClusterDNS(t *testing.T) {
	for _, tc := range []struct {
		name string
		api  *APIAccess
		want []string
	}{
		{"standalone", nil, nil},
		{"cluster", &APIAccess{KubeConfig: "/k", ClientCAFile: "/ca", NodeIP: "192.0.2.2", ClusterDNS: "198.18.128.10"}, []string{"198.18.128.10"}},
		{"cluster without DNS", &APIAccess{KubeConfig: "/k", ClientCAFile: "/ca", NodeIP: "192.0.2.2"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig("kubelet")
			c.API = tc.api
			var kc struct {
				Address       string   `json:"address"`
				ClusterDNS    []string `json:"clusterDNS"`
				ClusterDomain string   `json:"clusterDomain"`
			}
			if err := yaml.Unmarshal([]byte(c.kubeletConfig()), &kc); err != nil {
				t.Fatalf("kubelet config: %v\n%s", err, c.kubeletConfig())
			}
			if !slices.Equal(kc.ClusterDNS, tc.want) {
				t.Errorf("clusterDNS %q, want %q\n%s", kc.ClusterDNS, tc.want, c.kubeletConfig())
			}
			if tc.api != nil && (kc.ClusterDomain != "cluster.local" || kc.Address != tc.api.NodeIP) {
				t.Errorf("clusterDomain %q, address %q\n%s", kc.ClusterDomain, kc.Address, c.kubeletConfig())
			}
		})
	}
}
