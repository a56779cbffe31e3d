// Package vmcheck holds a test that checks the VM test environment built by
// tools/vmtest/vmexec: kernel, architecture, cgroup mode, mounts, sock_diag,
// host programs, root, cwd.
// Outside a VM (no DRAIND_VM_GUEST=1) its tests skip.
package vmcheck
