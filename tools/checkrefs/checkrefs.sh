#!/usr/bin/env bash
# checkrefs: every path a comment or a doc names resolves to a file in this
# repository. Prints each reference that does not (file:line: token) and
# exits 1 if there is one; prints nothing when all resolve. `make check-refs`.
#
# A reference is a token in a tracked text file (in a .go file: in a //
# comment) that
#   - starts with a top-level entry of the tree (internal/flows/table.go,
#     docs/design.md, bpf/*.c, internal/probes/..., e2e/kubelet) or with ../,
#     and resolves from the naming file's directory or one above it, up to
#     the repository's root (globs allowed);
#   - or is another relative path to a .go, .c, .h, .sh or .md file
#     (relative to a script's own directory), resolved the same way, unless it is
#     in the kernel's or another project's tree ($extdirs);
#   - or is a bare file name ending in .go, .c, .h or .sh (tcpstate_linux.go),
#     or any name ending in .md, whatever its directory: a tracked
#     file must have that name.
# Not references to this tree: URLs, paths inside module paths
# (istio.io/istio/tools/...), absolute paths, #include <...>, and the other
# projects' file names listed in $external.
set -euo pipefail
cd "$(dirname "$0")/../.."

# File names of other projects that the sources name on purpose: libbpf's
# headers, the kernel's.
external='^(vmlinux\.h|bpf_helpers\.h|bpf_helper_defs\.h|bpf_tracing\.h|bpf_core_read\.h|bpf_endian\.h|tcp_states\.h)$'

# First directories of paths in other trees: the kernel's (include/linux/...,
# kernel/bpf/...), Istio's (pkg/envoy/..., pilot/cmd/...), build output (bin/).
extdirs='include|linux|uapi|kernel|fs|net|pkg|pilot|bin'

top=$(git ls-files | cut -d/ -f1 | sort -u | paste -sd'|' | sed 's/\./\\./g')
names=$(mktemp)
trap 'rm -f "$names"' EXIT
git ls-files | xargs -n1 basename | sort -u >"$names"

# grep exits 1 for a batch of files without a match: not an error here.
found=$({ git ls-files -z -- ':!*.o' ':!*.sum' ':!**/testdata/**' ':!*_bpfel.go' |
	xargs -0 grep -IHn --null -E "\.(go|md|c|h|sh)\b|\b($top)/|\.\./" || true; } |
	perl -ne '
		BEGIN { ($top, $ext, $extdirs) = splice @ARGV, 0, 3 }
		chomp; my ($file, $rest) = split /\0/, $_, 2;
		my ($line, $text) = split /:/, $rest, 2;
		$text =~ s{[a-z]+://\S+}{}g;          # URLs
		if ($file =~ /\.go$/) {               # Go: comments only
			next unless $text =~ s{^.*?//}{};
		}
		$text =~ s{#\s*include\s*<[^>]*>}{}g; # system headers
		# A path from the top of the tree, or up from here.
		while ($text =~ m{(?<![\w./~\$-])((?:(?:\.\./)+[\w.-]+|(?:$top))/[\w.*/-]*[\w*])}g) {
			print "$file\t$line\tpath\t$1\n";
		}
		# Any other relative path to a source file: from here, unless it
		# is in the kernel or another project ($extdirs).
		while ($text =~ m{(?<![\w./~\$-])([a-z][\w-]*/[\w./-]*\.(?:go|c|h|sh|md))(?![\w/-])}g) {
			my $p = $1;
			next if $p =~ m{^(?:$top|$extdirs)/};
			print "$file\t$line\tpath\t$p\n";
		}
		# A bare file name; any *.md.
		while ($text =~ m{(?<![\w./~\$*-])([\w-]{2,}(?:\.[\w-]+)*\.(?:go|c|h|sh))(?![\w/-])}g) {
			my $n = $1;
			print "$file\t$line\tname\t$n\n" unless $n =~ /$ext/;
		}
		while ($text =~ m{(?<![\w.~\$*-])([\w-]{2,}(?:\.[\w-]+)*\.md)(?![\w/-])}g) {
			print "$file\t$line\tname\t$1\n";
		}
	' "$top" "$external" "$extdirs" |
	while IFS=$'\t' read -r file line kind tok; do
		case $kind in
		path)
			p=${tok%/...}
			dir=$(dirname "$file")
			found=
			while :; do
				if compgen -G "$dir/$p" >/dev/null; then
					found=1
					break
				fi
				[ "$dir" = . ] && break
				dir=$(dirname "$dir")
			done
			[ -n "$found" ] && continue
			;;
		name)
			if grep -qxF -e "$tok" "$names"; then
				continue
			fi
			;;
		esac
		echo "$file:$line: $tok"
	done | sort -u)
if [ -n "$found" ]; then
	printf '%s\n' "$found"
	exit 1
fi
