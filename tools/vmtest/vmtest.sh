#!/usr/bin/env bash
# Run Go test packages inside qemu VMs, one VM per kernel and package, on a
# matrix of Debian kernels. See docs/vmtest.md.
#
#   bash tools/vmtest/vmtest.sh [--kernels "5.10 6.1 6.12"] [--arch amd64|arm64]
#        [--cgroup2] [-v] [--run REGEX] [--timeout 10m] [--fetch] PKG...
#
# Prints one line per kernel and package, the output of failed runs, a
# closing "N passed, N failed, N skipped" line and the total wall time; exits
# non-zero when a run failed.
set -euo pipefail
# Bash reads a script as it runs it: the braces make it read all of it first,
# so that editing or checking out this file during a long run is harmless.
{

# --- Pinned kernels: the only place to change when bumping (docs/vmtest.md).
# alias | architecture | Debian suite | package | exact version
KERNEL_PINS=(
	"5.10|amd64|bullseye|linux-image-5.10.0-32-amd64|5.10.223-1"
	"6.1|amd64|bookworm|linux-image-6.1.0-50-amd64|6.1.176-1"
	"6.12|amd64|bookworm-security|linux-image-6.12.117+deb12-amd64|6.12.117-1~deb12u1"
	"6.1|arm64|bookworm|linux-image-6.1.0-50-arm64|6.1.176-1"
	"6.12|arm64|bookworm-security|linux-image-6.12.117+deb12-arm64|6.12.117-1~deb12u1"
)
# The root filesystem of a guest that is not of the host's architecture
# (host programs would not run there): these Debian packages and what they
# depend on, for the programs tests run (sh, sleep, python3, iptables, ip).
ROOTFS_SUITE=bookworm
ROOTFS_LAYOUT=2 # bump when fetch_rootfs changes what it makes: the cache is rebuilt
ROOTFS_PACKAGES=(base-files base-passwd dash bash coreutils util-linux procps kmod iproute2 iptables python3 nginx-light)

DEBIAN_MIRROR=${DRAIND_VM_MIRROR:-http://deb.debian.org/debian}
DEBIAN_SECURITY_MIRROR=${DRAIND_VM_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
DEBIAN_KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
# Module directories no test of ours needs, dropped from the cache to save disk.
PRUNE_MODULES=(sound drivers/gpu drivers/media drivers/net/wireless drivers/infiniband drivers/staging)

CACHE=${DRAIND_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/draind-vm}
export DRAIND_VM_CACHE=$CACHE

usage() {
	sed -n '2,11s/^# \{0,1\}//p' "$0"
	echo
	echo "Pinned kernels:"
	local pin alias parch suite pkg ver
	for pin in "${KERNEL_PINS[@]}"; do
		IFS='|' read -r alias parch suite pkg ver <<<"$pin"
		printf '  %-5s %-5s %s=%s (%s)\n' "$alias" "$parch" "$pkg" "$ver" "$suite"
	done
}

kernels="5.10 6.1 6.12"
host_arch=$(dpkg --print-architecture)
arch=$host_arch cgroup2=0
verbose=0 fetch_only=0 run_regex="" test_timeout=10m
pkgs=()
while (($#)); do
	case $1 in
	--kernels) kernels=$2; shift 2 ;;
	--kernels=*) kernels=${1#*=}; shift ;;
	--arch) arch=$2; shift 2 ;;
	--arch=*) arch=${1#*=}; shift ;;
	--cgroup2) cgroup2=1; shift ;;
	--run) run_regex=$2; shift 2 ;;
	--run=*) run_regex=${1#*=}; shift ;;
	--timeout) test_timeout=$2; shift 2 ;;
	--timeout=*) test_timeout=${1#*=}; shift ;;
	-v | --verbose) verbose=1; shift ;;
	--fetch) fetch_only=1; shift ;;
	-h | --help) usage; exit 0 ;;
	--) shift; pkgs+=("$@"); break ;;
	-*) echo "vmtest: unknown flag $1" >&2; usage >&2; exit 2 ;;
	*) pkgs+=("$1"); shift ;;
	esac
done
case $arch in
amd64) qemu=qemu-system-x86_64 qemu_pkg=qemu-system-x86 ;;
arm64) qemu=qemu-system-aarch64 qemu_pkg=qemu-system-arm ;;
*) echo "vmtest: --arch $arch: amd64 or arm64" >&2; exit 2 ;;
esac
if ((!fetch_only && ${#pkgs[@]} == 0)); then
	echo "vmtest: no packages given" >&2
	usage >&2
	exit 2
fi

orig=$PWD
cd "$(dirname "$0")/../.."
started=$(date +%s)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/draind-vmtest.XXXXXX")
child=""

cleanup() {
	if [[ -n $child ]]; then
		# The runner stops its qemu itself; go build's compilers would
		# outlive the go command, so they are stopped too.
		local grandchildren
		grandchildren=$(pgrep -P "$child" || true)
		kill -TERM "$child" 2>/dev/null || true
		wait "$child" 2>/dev/null || true
		[[ -z $grandchildren ]] || kill -TERM $grandchildren 2>/dev/null || true
		child=""
	fi
	rm -rf "$tmp"
}
# The trap may run while a command's output is redirected to a log: fd 3 is
# the script's own stderr.
exec 3>&2
trap cleanup EXIT
trap 'echo "vmtest: interrupted" >&3; cleanup; trap - EXIT; exit 130' INT TERM

# bg runs a command in the background and waits for it, so that a signal to
# this script is handled at once (the trap then stops the command).
bg() {
	"$@" &
	child=$!
	local rc=0
	wait "$child" || rc=$?
	child=""
	return "$rc"
}

# --- Host tools ----------------------------------------------------------------

need_tools() {
	local missing=() t
	command -v "$qemu" >/dev/null || missing+=("$qemu_pkg")
	command -v depmod >/dev/null || missing+=(kmod)
	command -v xz >/dev/null || missing+=(xz-utils)
	command -v dpkg-deb >/dev/null || missing+=(dpkg)
	command -v apt-get >/dev/null || { echo "vmtest: needs apt-get (Debian or Ubuntu host)" >&2; exit 1; }
	((${#missing[@]} == 0)) && return
	if [[ $(id -u) != 0 ]]; then
		echo "vmtest: missing ${missing[*]}: sudo apt-get install --no-install-recommends ${missing[*]}" >&2
		exit 1
	fi
	echo "vmtest: installing ${missing[*]}" >&2
	if ! apt-get install -y -q --no-install-recommends "${missing[@]}" >"$tmp/apt-install.log" 2>&1; then
		apt-get update -q >>"$tmp/apt-install.log" 2>&1 || true
		apt-get install -y -q --no-install-recommends "${missing[@]}" >>"$tmp/apt-install.log" 2>&1 ||
			{ cat "$tmp/apt-install.log" >&2; exit 1; }
	fi
	for t in "$qemu" depmod xz dpkg-deb; do
		command -v "$t" >/dev/null || { echo "vmtest: $t still missing" >&2; exit 1; }
	done
}

# --- Kernels -------------------------------------------------------------------

pin_for() { # alias arch -> "suite|pkg|version", or nothing
	local pin alias rest
	for pin in "${KERNEL_PINS[@]}"; do
		alias=${pin%%|*} rest=${pin#*|}
		[[ $alias == "$1" && ${rest%%|*} == "$2" ]] && { echo "${rest#*|}"; return; }
	done
}

# cache_alias ALIAS: the name of a kernel in the cache (and vmexec's
# --kernel): the alias for the host's architecture, ALIAS-ARCH for another.
cache_alias() {
	if [[ $arch == "$host_arch" ]]; then echo "$1"; else echo "$1-$arch"; fi
}

# private_apt SUITE ARGS...: apt-get with a sources list, lists and cache of
# its own under the cache directory, for packages of $arch; the host's apt
# configuration and state are left alone.
private_apt() {
	local suite=$1 dir="$CACHE/apt/$1" mirror=$DEBIAN_MIRROR
	shift
	[[ $arch == "$host_arch" ]] || dir+="-$arch"
	[[ $suite == *-security ]] && mirror=$DEBIAN_SECURITY_MIRROR
	mkdir -p "$dir/lists/partial" "$dir/cache/archives/partial" "$dir/sources.list.d" "$dir/preferences.d"
	echo "deb [arch=$arch signed-by=$DEBIAN_KEYRING] $mirror $suite main" >"$dir/sources.list"
	apt-get -q \
		-o APT::Architecture="$arch" \
		-o APT::Architectures="$arch" \
		-o Dir::Etc::SourceList="$dir/sources.list" \
		-o Dir::Etc::SourceParts="$dir/sources.list.d" \
		-o Dir::Etc::Preferences="$dir/preferences" \
		-o Dir::Etc::PreferencesParts="$dir/preferences.d" \
		-o Dir::State::Lists="$dir/lists" \
		-o Dir::Cache="$dir/cache" \
		-o Acquire::Languages=none \
		-o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false \
		-o Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false \
		-o APT::Sandbox::User=root \
		"$@"
}

# download_deb SUITE PKG VERSION DIR: the host's apt first (bookworm hosts have
# bookworm and bookworm-security), then the private configuration,
# updating its lists when they lack the version.
download_deb() {
	local suite=$1 pkg=$2 ver=$3 dir=$4 log="$tmp/apt-download.log"
	: >"$log"
	if [[ $arch == "$host_arch" ]]; then
		(cd "$dir" && apt-get -q -o APT::Sandbox::User=root download "$pkg=$ver") >"$log" 2>&1 && return
	fi
	(cd "$dir" && private_apt "$suite" download "$pkg=$ver") >>"$log" 2>&1 && return
	echo "vmtest: updating the private apt lists for $suite" >&2
	private_apt "$suite" update >>"$log" 2>&1 || { cat "$log" >&2; return 1; }
	(cd "$dir" && private_apt "$suite" download "$pkg=$ver") >>"$log" 2>&1 && return
	cat "$log" >&2
	echo "vmtest: $pkg=$ver is not in $suite any more: bump KERNEL_PINS in $0 (docs/vmtest.md)" >&2
	return 1
}

# fetch_kernel ALIAS: makes $CACHE/kernels/ALIAS point at the extracted,
# depmod-ed package of the pinned version, downloading it if needed.
fetch_kernel() {
	local alias=$1 pin suite pkg ver name dest work deb release
	pin=$(pin_for "$alias" "$arch")
	[[ -n $pin ]] || { echo "vmtest: no pinned $arch kernel $alias (have: $(printf '%s ' "${KERNEL_PINS[@]%%|*}"))" >&2; return 1; }
	IFS='|' read -r suite pkg ver <<<"$pin"
	name="${pkg}_${ver}"
	dest="$CACHE/kernels/$name"
	if [[ ! -e $dest/.complete ]]; then
		echo "vmtest: fetching $pkg=$ver ($suite)" >&2
		work=$(mktemp -d "$CACHE/kernels/.fetch.XXXXXX")
		download_deb "$suite" "$pkg" "$ver" "$work" || { rm -rf "$work"; return 1; }
		deb=$(ls "$work"/*.deb)
		dpkg-deb -x "$deb" "$work/root"
		rm -f "$deb"
		release=$(basename "$(ls -d "$work"/root/lib/modules/* "$work"/root/usr/lib/modules/* 2>/dev/null | head -1)")
		[[ -n $release && -f $work/root/boot/vmlinuz-$release ]] || { echo "vmtest: $pkg has no kernel or modules" >&2; rm -rf "$work"; return 1; }
		local moddir
		moddir=$(ls -d "$work"/root/lib/modules/"$release" "$work"/root/usr/lib/modules/"$release" 2>/dev/null | head -1)
		for d in "${PRUNE_MODULES[@]}"; do rm -rf "${moddir:?}/kernel/$d"; done
		ln -s "vmlinuz-$release" "$work/root/boot/vmlinuz"
		depmod -b "$work/root" "$release"
		echo "$pkg=$ver" >"$work/root/.complete"
		rm -rf "$dest"
		mv "$work/root" "$dest"
		rm -rf "$work"
	fi
	ln -sfn "$name" "$CACHE/kernels/$(cache_alias "$alias")"
}

# kernel_dir K: a pinned alias (fetched on demand) or a path to a kernel.
kernel_dir() {
	if [[ -e $1 ]]; then
		realpath "$1"
	else
		fetch_kernel "$1" >&2 && echo "$CACHE/kernels/$(cache_alias "$1")"
	fi
}

# fetch_rootfs: makes $CACHE/rootfs/$arch, the root filesystem vmexec gives
# a guest of another architecture than the host's: ROOTFS_PACKAGES and their
# dependencies, unpacked (no maintainer scripts run; none of the programs
# tests use needs them), with the host's users and groups.
fetch_rootfs() {
	local dest="$CACHE/rootfs/$arch" want work deb log="$tmp/apt-rootfs.log"
	want="layout $ROOTFS_LAYOUT: $ROOTFS_SUITE ${ROOTFS_PACKAGES[*]}"
	[[ -e $dest/.complete && $(cat "$dest/.complete") == "$want" ]] && return
	echo "vmtest: building the $arch root filesystem ($want)" >&2
	mkdir -p "$CACHE/rootfs"
	work=$(mktemp -d "$CACHE/rootfs/.fetch.XXXXXX")
	mkdir -p "$work/debs/partial" "$work/root"
	# An empty dpkg status: apt resolves every dependency from scratch.
	: >"$work/status"
	private_apt "$ROOTFS_SUITE" update >"$log" 2>&1 || { cat "$log" >&2; rm -rf "$work"; return 1; }
	private_apt "$ROOTFS_SUITE" -o Dir::State::status="$work/status" -o Dir::Cache::archives="$work/debs" \
		-o Debug::NoLocking=1 install --download-only -y --no-install-recommends "${ROOTFS_PACKAGES[@]}" >>"$log" 2>&1 ||
		{ cat "$log" >&2; rm -rf "$work"; return 1; }
	for deb in "$work"/debs/*.deb; do dpkg-deb -x "$deb" "$work/root"; done
	# What iptables' postinst does through update-alternatives: the nft variant.
	local t
	for t in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
		ln -sfn xtables-nft-multi "$work/root/usr/sbin/$t"
	done
	cp /etc/passwd /etc/group /etc/hosts "$work/root/etc/"
	mkdir -p "$work/root/root"
	echo "$want" >"$work/root/.complete"
	rm -rf "$dest"
	mv "$work/root" "$dest"
	rm -rf "$work"
}

need_tools
mkdir -p "$CACHE/kernels"
exec 9>"$CACHE/.lock"
flock 9 # one fetch at a time; runs only read the cache
rm -rf "$CACHE"/kernels/.fetch.* "$CACHE"/rootfs/.fetch.* # left by an interrupted fetch
declare -A kdir
for k in $kernels; do
	kdir[$k]=$(kernel_dir "$k") || exit 1
done
if [[ $arch != "$host_arch" ]]; then
	fetch_rootfs || exit 1
fi
exec 9>&-
if ((fetch_only)); then
	for k in $kernels; do echo "$k $arch -> ${kdir[$k]}"; done
	[[ $arch == "$host_arch" ]] || echo "root filesystem -> $CACHE/rootfs/$arch"
	exit 0
fi

# --- Runs ----------------------------------------------------------------------

mkdir -p "$tmp/bin" "$tmp/logs"
CGO_ENABLED=0 bg go -C tools build -o "$tmp/vmexec" ./vmtest/vmexec
# The guest's init: vmexec built for the guest, found beside the runner.
if [[ $arch != "$host_arch" ]]; then
	CGO_ENABLED=0 GOARCH=$arch bg go -C tools build -o "$tmp/vmexec-$arch" ./vmtest/vmexec
fi
# Test binaries are built for the guest; cgo is off when cross-compiling.
export GOARCH=$arch
# The label of a run: the kernel, its architecture when not the host's, and
# the cgroup mode when cgroup v2 only.
label() {
	local l=$1
	[[ $arch == "$host_arch" ]] || l+="/$arch"
	((!cgroup2)) || l+="/cg2"
	echo "$l"
}
# --cgroup2: vmexec boots with cgroup_no_v1=all; vmcheck checks it got that.
vmexec_args=()
((!cgroup2)) || vmexec_args+=(--cgroup2)

passed=0 failed=0 skipped=0 retried=0
line() { # status kernel pkg detail
	printf '%-5s %-14s %-28s (%s)\n' "$1" "$2" "$3" "$4"
}
show() { sed 's/^/    /' "$1"; }
# tcg_patch_crash: the guest's console in log shows a CPU caught at a call
# site under re-patching: "Oops: int3", or a soft lockup whose Code line marks
# (<..>) a 5-byte NOP (66 66 66 66 90) or an int3 (cc) as the stuck instruction.
tcg_patch_crash() {
	grep -q 'Oops: int3' "$1" && return 0
	grep -q 'watchdog: BUG: soft lockup' "$1" &&
		grep -Eq 'Code: .*(<66> 66 66 66 90|<cc>)' "$1"
}

for pkg in "${pkgs[@]}"; do
	# Paths are relative to where the script was started; show them from the root.
	if [[ $pkg != /* && -d $orig/$pkg ]]; then pkg=./$(realpath --relative-to=. "$orig/$pkg"); fi
	if [[ ! -d $pkg ]]; then
		line SKIP - "$pkg" "no such directory"
		skipped=$((skipped + 1))
		continue
	fi
	# go -C: the package is listed and built in its own module (the
	# product's, or the tools module for ./tools/vmtest/vmcheck).
	if ! info=$(go -C "$pkg" list -f '{{.Dir}} {{len .TestGoFiles}} {{len .XTestGoFiles}}' . 2>"$tmp/list.log"); then
		if grep -q 'no Go files' "$tmp/list.log"; then
			line SKIP - "$pkg" "no Go files"
			skipped=$((skipped + 1))
			continue
		fi
		line FAIL - "$pkg" "go list failed"
		show "$tmp/list.log"
		failed=$((failed + 1))
		continue
	fi
	read -r dir ntest nxtest <<<"$info"
	if ((ntest + nxtest == 0)); then
		line SKIP - "$pkg" "no test files"
		skipped=$((skipped + 1))
		continue
	fi
	name=$(echo "${pkg#./}" | tr '/.' '__')
	bin="$tmp/bin/$name.test"
	if ! bg go -C "$pkg" test -c -o "$bin" . >"$tmp/logs/$name.build" 2>&1; then
		line FAIL - "$pkg" "build failed"
		show "$tmp/logs/$name.build"
		failed=$((failed + 1))
		continue
	fi
	args=(-test.timeout="$test_timeout")
	((verbose)) && args+=(-test.v)
	[[ -n $run_regex ]] && args+=(-test.run="$run_regex")
	for k in $kernels; do
		log="$tmp/logs/$name-${k//\//_}.log" # k may be a path
		t0=$(date +%s)
		# go test runs a test binary in its package directory; env -C does
		# the same without a subshell, so that the runner is our direct child.
		cmd=(env -C "$dir" VMTEST_EXPECT_KERNEL="$k" VMTEST_EXPECT_CGROUP2="$cgroup2" "$tmp/vmexec" --kernel "${kdir[$k]}" "${vmexec_args[@]}" -- "$bin" "${args[@]}")
		for attempt in 1 2; do
			rc=0
			if ((verbose)); then
				echo "=== $k $pkg"
				bg "${cmd[@]}" > >(tee "$log") 2>&1 || rc=$?
			else
				bg "${cmd[@]}" >"$log" 2>&1 || rc=$?
			fi
			# One retry, for one known crash of the emulated machine only:
			# a CPU at a call site the kernel re-patches (a tracepoint's
			# static key or call, when a BPF program attaches or detaches)
			# after the patch was done. It shows as "Oops: int3" (the
			# breakpoint the patcher puts in; once, 6.12) or as a soft
			# lockup whose stuck instruction is the site itself, a 5-byte
			# NOP or that int3 (once, 5.10: do_exit's sched_process_exit
			# tracepoint, 12 min). Both under qemu's TCG (docs/vmtest.md);
			# any other failure or oops fails at once.
			if ((rc == 0 || rc == 130 || attempt == 2)) || ! tcg_patch_crash "$log"; then
				break
			fi
			line RETRY "$(label "$k")" "$pkg" "guest kernel stuck at a re-patched call site (text patching under TCG); its log:"
			show "$log"
			retried=$((retried + 1))
		done
		secs=$(($(date +%s) - t0))
		if ((rc == 130)); then # the runner was interrupted with us
			echo "vmtest: interrupted" >&2
			exit 130
		elif ((rc == 0)); then
			line PASS "$(label "$k")" "$pkg" "${secs}s"
			passed=$((passed + 1))
		else
			line FAIL "$(label "$k")" "$pkg" "${secs}s, exit $rc"
			((verbose)) || show "$log"
			failed=$((failed + 1))
		fi
	done
done

summary="$passed passed, $failed failed, $skipped skipped"
((retried)) && summary+=", $retried retried after a TCG text-patching oops"
echo "$summary"
echo "total wall time: $(($(date +%s) - started))s"
((failed == 0)) && exit 0
exit 1
}
