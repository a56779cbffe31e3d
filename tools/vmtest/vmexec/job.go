package main

// The host and the guest share this description of one run. The host writes
// it as JSON into the initramfs (jobPath); the init reads it back.

const (
	jobPath = "/job.json"

	// Names of the virtio-serial ports, as the guest sees them in
	// /sys/class/virtio-ports/*/name.
	portStdout  = "draind.stdout"
	portStderr  = "draind.stderr"
	portControl = "draind.control"

	// 9p mount tag of the host's root directory.
	tagHostRoot = "hostroot"

	// guestEnv is set to 1 in the environment of the test binary, so that
	// tests can tell they run inside the VM.
	guestEnv = "DRAIND_VM_GUEST"
	// kernelEnv carries the release of the booted kernel (uname -r).
	kernelEnv = "DRAIND_VM_KERNEL_RELEASE"
)

// job is what the init inside the VM must do.
type job struct {
	// Args is the command line of the test binary; Args[0] is an absolute path.
	Args []string `json:"args"`
	// Env is the complete environment of the test binary.
	Env []string `json:"env"`
	// Dir is the working directory of the test binary.
	Dir string `json:"dir"`
	// Modules are paths inside the initramfs, in load order.
	Modules []string `json:"modules"`
	// Shares are host directories mounted over 9p, in mount order.
	Shares []share `json:"shares"`
	// ModulesDir, when set, is where the kernel's module tree is mounted
	// (/lib/modules/RELEASE) so that modprobe works inside the VM.
	ModulesDir string `json:"modulesDir,omitempty"`
	// Tmpfs are directories given a tmpfs each, after the shares.
	Tmpfs []string `json:"tmpfs,omitempty"`
	// Hostname of the VM.
	Hostname string `json:"hostname"`
}

// share is a host directory exported over virtio-9p.
type share struct {
	Tag      string `json:"tag"`
	HostPath string `json:"hostPath"`
	// GuestPath is where the init mounts it.
	GuestPath string `json:"guestPath"`
	ReadOnly  bool   `json:"readOnly"`
}
