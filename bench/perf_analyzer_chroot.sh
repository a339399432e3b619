#!/usr/bin/env bash
# Installs Triton's perf_analyzer into a Debian 13 (trixie) chroot, once:
# PyPI's perf-analyzer wheels need glibc 2.38 and Debian 12 has 2.36.
# Root; the chroot is made with debootstrap from Debian's mirror and kept.
# Used by bench/perf_analyzer.sh and bench/serving_peers.sh.
#
#   bash bench/perf_analyzer_chroot.sh CHROOT_DIR
#   # then: chroot CHROOT_DIR /opt/perf_analyzer/bin/perf_analyzer ...
set -euo pipefail
chroot_dir=${1:?usage: perf_analyzer_chroot.sh CHROOT_DIR}
[[ -x "$chroot_dir/opt/perf_analyzer/bin/perf_analyzer" ]] && exit 0
command -v debootstrap >/dev/null || apt-get install -y debootstrap >&2
[[ -d "$chroot_dir/usr" ]] ||
  debootstrap --variant=minbase trixie "$chroot_dir" http://deb.debian.org/debian >&2
wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: \
  --platform manylinux_2_38_x86_64 --python-version 3.11 -d "$wheels" \
  perf-analyzer==2.60.0
python3 -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
  "$wheels"/perf_analyzer-*.whl "$chroot_dir/opt"
chmod +x "$chroot_dir/opt/perf_analyzer/bin/perf_analyzer"
