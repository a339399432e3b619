#!/usr/bin/env bash
# Makes the two Debian base images the Dockerfile starts FROM, as root file
# system tarballs, without any registry: this machine reaches Debian's apt
# mirror but no container registry (no Docker Hub), so `FROM debian:bookworm`
# can only be satisfied by an image made here.
#
#   deploy/container/make_base_image.sh [CACHE_DIR]
#
# CACHE_DIR (default ${ATTN_CONTAINER_CACHE:-/var/cache/attnserve-container})
# gets a folder per mirror, printed on stdout as the last line, holding:
#   bookworm.tar       `debootstrap --variant=minbase bookworm` from the
#                      mirror this machine's apt uses (debian_sources.py), its
#                      apt sources pointing at that same mirror (updates and
#                      security included, as on this machine), and otherwise
#                      like Docker Hub's debian:bookworm: apt's lists and
#                      downloaded .debs removed (so the Dockerfile's apt-get
#                      update is needed, as it is there), and debuerreotype's
#                      minimizing config (apt deletes the .debs it installs,
#                      so the image sizes measured here are the ones a docker
#                      build from Docker Hub's images gives);
#   bookworm-slim.tar  the same, slimmed the way Docker Hub's -slim images are
#                      (debuerreotype's slimify): no docs but copyrights, no
#                      man pages, info or locales, and a dpkg config that keeps
#                      them out of later installs too.
# Import them under the names the Dockerfile uses, e.g.
#   podman import --change 'CMD ["bash"]' bookworm.tar docker.io/library/debian:bookworm
#
# A folder younger than ATTN_CONTAINER_BASE_MAX_AGE_DAYS (default 30) is
# reused (the debootstrap takes ~45 s cold on 2 cores); an older one is made
# again, so the base does not drift far behind Debian's point releases. Made
# under a lock, in a temporary folder renamed into place, so concurrent or
# interrupted runs never leave a half-made base behind. ATTN_DEBIAN_MIRROR
# overrides the mirror. Needs root, debootstrap and /usr/bin/python3.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
cache=${1:-${ATTN_CONTAINER_CACHE:-/var/cache/attnserve-container}}
max_age_days=${ATTN_CONTAINER_BASE_MAX_AGE_DAYS:-30}
suite=bookworm
log() { echo "make_base_image: $*" >&2; }

if ((EUID != 0)); then
  log "needs root (debootstrap)"
  exit 1
fi

# --- Which mirror, and the apt sources the image gets. -------------------
mirror=${ATTN_DEBIAN_MIRROR:-$(ATTN_DEBIAN_SUITE=$suite /usr/bin/python3 \
  "$here/debian_sources.py" mirror)}
if [[ -n "${ATTN_DEBIAN_MIRROR:-}" ]]; then
  sources="Types: deb
URIs: $mirror
Suites: $suite $suite-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg"
else
  sources=$(ATTN_DEBIAN_SUITE=$suite /usr/bin/python3 \
    "$here/debian_sources.py" deb822)
fi
# An apt proxy of this machine (Acquire::http::Proxy) is the container's
# way out too: debootstrap gets it as http_proxy, the image as an apt.conf.
proxy=""
eval "$(apt-config shell proxy Acquire::http::Proxy)"

# The folder is named after everything that goes into the base, so a
# changed mirror or slimming recipe never reuses an old one.
key=$(printf '%s\n' "$suite" "$sources" "$proxy" "$(sha256sum "$0")" |
  sha256sum | cut -c1-12)
dir=$cache/$suite-$key

mkdir -p "$cache"
exec 9>"$cache/.lock"
flock 9

if [[ -f "$dir/bookworm.tar" && -f "$dir/bookworm-slim.tar" ]] &&
  [[ -z "$(find "$dir/bookworm.tar" -mtime +"$max_age_days")" ]]; then
  log "cached base $dir"
  echo "$dir"
  exit 0
fi

tmp=$(mktemp -d "$cache/.make.XXXXXX")
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  # An interrupted debootstrap can leave /proc etc. mounted in the target.
  local mount
  while read -r _ mount _; do
    if [[ "$mount" == "$tmp"/* ]]; then umount -l "$mount" || true; fi
  done < <(sort -r -k2 /proc/mounts)
  rm -rf "$tmp"
}
trap cleanup EXIT

log "debootstrap --variant=minbase $suite from $mirror (about a minute)"
start=$SECONDS
rootfs=$tmp/rootfs
if ! http_proxy=$proxy debootstrap --variant=minbase "$suite" "$rootfs" \
  "$mirror" >"$tmp/debootstrap.log" 2>&1; then
  log "debootstrap failed; its log:"
  sed 's/^/  | /' "$tmp/debootstrap.log" >&2
  exit 1
fi
log "debootstrap took $((SECONDS - start)) s"

# Docker Hub's layout: sources in deb822 form, no lists, no .debs, and the
# apt/dpkg settings of debuerreotype-minimizing-config.
rm -f "$rootfs/etc/apt/sources.list"
apt_conf=$rootfs/etc/apt/apt.conf.d
cat >"$apt_conf/docker-clean" <<'END'
# Installed packages' .debs and apt's binary caches stay out of image layers.
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
END
echo 'Acquire::Languages "none";' >"$apt_conf/docker-no-languages"
echo 'Acquire::GzipIndexes "true";' >"$apt_conf/docker-gzip-indexes"
echo 'Apt::AutoRemove::SuggestsImportant "false";' \
  >"$apt_conf/docker-autoremove-suggests"
echo 'force-unsafe-io' >"$rootfs/etc/dpkg/dpkg.cfg.d/docker-apt-speedup"
printf '%s\n' "$sources" >"$rootfs/etc/apt/sources.list.d/debian.sources"
if [[ -n "$proxy" ]]; then
  printf 'Acquire::http::Proxy "%s";\n' "$proxy" \
    >"$rootfs/etc/apt/apt.conf.d/01proxy"
fi
rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin \
  "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/debootstrap
mkdir -p "$rootfs/var/lib/apt/lists/partial"
tar --numeric-owner -C "$rootfs" -cf "$tmp/bookworm.tar" .

# The -slim variant (debuerreotype-slimify's excludes).
cat >"$rootfs/etc/dpkg/dpkg.cfg.d/docker" <<'EOF'
# Docs, man pages and locales stay out of the image (as in Docker Hub's -slim).
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/groff/*
path-exclude /usr/share/info/*
path-exclude /usr/share/linda/*
path-exclude /usr/share/lintian/overrides/*
path-exclude /usr/share/locale/*
path-exclude /usr/share/man/*
EOF
find "$rootfs/usr/share/doc" -mindepth 1 ! -type d ! -name copyright -delete
find "$rootfs/usr/share/doc" -mindepth 1 -depth -type d -empty -delete
rm -rf "$rootfs"/usr/share/{groff,info,linda,lintian/overrides,locale,man}/*
tar --numeric-owner -C "$rootfs" -cf "$tmp/bookworm-slim.tar" .

rm -rf "$rootfs"
# Bases of another mirror or recipe go: one base per cache.
find "$cache" -mindepth 1 -maxdepth 1 -type d -name "$suite-*" \
  ! -name "${dir##*/}" -exec rm -rf {} +
rm -rf "$dir"
mv "$tmp" "$dir"
trap - EXIT
log "made $dir ($(du -sh "$dir/bookworm.tar" | cut -f1) + $(du -sh \
  "$dir/bookworm-slim.tar" | cut -f1))"
echo "$dir"
