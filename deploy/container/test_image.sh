#!/usr/bin/env bash
# Builds the repository's Dockerfile as it is and runs the image, so the
# Dockerfile cannot rot unnoticed.
#
#   deploy/container/test_image.sh ATTNCTL [VENV_DIR]
#
# ATTNCTL:  the host's attnctl (build/client/attnctl); every check of the
#           running container is made from outside it, as a client would.
# VENV_DIR: the Python venv of tests/kserve/requirements.txt (tritonclient,
#           numpy), made once and cached (default: in the cache below; CTest
#           passes the KServe test's build/tests/tritonvenv, so both share it).
#
# This machine has no Docker engine and reaches no container registry, only
# Debian's apt mirror. So the test:
#  1. installs what it needs that is missing (buildah, podman, runc,
#     debootstrap, ...), checked with dpkg-query like deploy/install_deps.sh;
#  2. makes the Debian bases the Dockerfile's FROM lines name
#     (make_base_image.sh: debootstrap from the mirror this machine's apt uses,
#     cached in ${ATTN_CONTAINER_CACHE:-/var/cache/attnserve-container}) and
#     imports them as docker.io/library/debian:bookworm and :bookworm-slim;
#  3. builds the Dockerfile from a copy of the working tree (tracked and
#     untracked-but-not-ignored files, as git sees them; no build/), with
#     buildah --format docker (the default OCI format silently drops
#     HEALTHCHECK), --isolation chroot and --pull=never;
#  4. runs the image with podman on free loopback ports that are NOT the
#     defaults (--grpc_port/--http_port/--metrics_port passed to the
#     entrypoint), and
#     checks it from outside: health SERVING, a typed-API call and a KServe v2
#     call against float64 references, the example model repository, /metrics,
#     the server's uid (10001, not root), the front door (nginx and its
#     exporter from the same image, non-root on a read-only root) serving
#     gRPC and HTTP in front of it, the image's HEALTHCHECK run by hand
#     (podman's timers need systemd, which these machines lack), AVX code only
#     inside the kernels' per-ISA copies (so the image runs on AMD EPYC and
#     Intel Xeon alike), `podman stop` (SIGTERM) exiting 0 within the grace
#     period, and, in a second container, the HEALTHCHECK turning unhealthy
#     while the server drains after SIGTERM;
#  5. removes the containers and images it made (all of its container
#     storage, which is private to the run), keeping only the cached base.
#
# Storage is containers/storage's vfs driver in a private folder (buildah and
# podman must agree on it; overlay needs kernel support these VMs may lack);
# podman runs containers with runc (crun fails on these machines' cgroups),
# host networking and explicit ulimits (see ../../../shared/FACTS.md,
# "Containers").
#
# Prints one "PASS name: ..." or "FAIL name: ..." line per check, timings and
# the image size; exits 0 when every check passed, 1 otherwise, 77 (CTest's
# skip) when not run as root. ATTN_CONTAINER_KEEP=1 keeps the run's storage,
# image and container for debugging (their commands are printed).
# About 6 minutes cold on 2 cores (base ~70 s: debootstrap and tarballs;
# apt in the build ~25 s; compiling attnserve and attnctl ~3.5 min; the
# checks ~15 s), a minute less with the cached base; more on a busy machine.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 ATTNCTL [VENV_DIR]" >&2
  exit 64
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
attnctl=$(realpath "$1")
cache=${ATTN_CONTAINER_CACHE:-/var/cache/attnserve-container}
venv=${2:-$cache/tritonvenv}
log() { echo "test_image: $*"; }

if ((EUID != 0)); then
  # buildah/podman here run rootful: vfs storage, runc and debootstrap need
  # it. Not a reason to skip: through sudo when it needs no password (as
  # deploy/install_deps.sh does), else a failure that says so.
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    exec sudo -n -E bash "${BASH_SOURCE[0]}" "$@"
  fi
  log "FAIL: needs root, or sudo without a password (buildah, podman, debootstrap)"
  exit 1
fi
if [[ ! -x "$attnctl" ]]; then
  log "no attnctl at $attnctl"
  exit 64
fi

t_total=$SECONDS

# --- 1. Packages. ----------------------------------------------------------
# runc is named because podman would otherwise pull in crun, which fails here;
# binutils (objdump) serves the ISA check, python3-venv the KServe client.
readonly PACKAGES=(
  buildah podman runc debootstrap
  python3 python3-venv curl binutils git
)
is_installed() {
  dpkg-query -W -f='${db:Status-Status}\n' "$1" 2>/dev/null | grep -qx installed
}
missing=()
for pkg in "${PACKAGES[@]}"; do
  is_installed "$pkg" || missing+=("$pkg")
done
if ((${#missing[@]} > 0)); then
  log "installing ${missing[*]}"
  if ! apt_log=$(export DEBIAN_FRONTEND=noninteractive && {
    apt-get update -q &&
      apt-get install -y -q --no-install-recommends "${missing[@]}"
  } 2>&1); then
    echo "$apt_log"
    log "apt-get failed; install by hand: ${missing[*]}"
    exit 1
  fi
fi

# --- The run's private container storage, and cleanup. ---------------------
work=$(mktemp -d /var/tmp/attnserve-image-test.XXXXXX)
store=(--storage-driver vfs --root "$work/storage" --runroot "$work/runroot")
buildah_cmd=(buildah "${store[@]}")
podman_cmd=(podman "${store[@]}" --runtime runc --cgroup-manager cgroupfs
  --events-backend file --tmpdir "$work/libpod")
image=localhost/attnserve-image-test:$$
container=attnserve-image-test-$$

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  set +e
  if [[ "${ATTN_CONTAINER_KEEP:-0}" == 1 ]]; then
    log "kept $work (ATTN_CONTAINER_KEEP=1); use: ${podman_cmd[*]} ..."
    return
  fi
  if [[ -d "$work/storage" ]]; then
    "${podman_cmd[@]}" rm -a -f -t 0 >/dev/null 2>&1
    "${buildah_cmd[@]}" rm --all >/dev/null 2>&1
    "${podman_cmd[@]}" rmi -a -f >/dev/null 2>&1
  fi
  local mount
  while read -r _ mount _; do
    if [[ "$mount" == "$work"/* ]]; then umount -l "$mount"; fi
  done < <(sort -r -k2 /proc/mounts)
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- Checks. -----------------------------------------------------------------
failures=0
checks=0
# pass NAME WORDS...; fail NAME WORDS...
pass() {
  checks=$((checks + 1))
  echo "PASS $1: ${*:2}"
}
fail() {
  checks=$((checks + 1))
  failures=$((failures + 1))
  echo "FAIL $1: ${*:2}"
}
# check NAME COMMAND...: PASS with the command's last output line, or FAIL
# with all of its output.
check() {
  local name=$1 out rc=0
  shift
  out=$("$@" 2>&1) || rc=$?
  if ((rc == 0)); then
    pass "$name" "$(tail -n 1 <<<"$out")"
  else
    fail "$name" "exit $rc"
    # shellcheck disable=SC2001  # indents every line
    sed 's/^/  | /' <<<"$out"
  fi
}

# The venv for the Python checks (made once, cached, under a lock).
# shellcheck source=SCRIPTDIR/../../tests/lib/venv.sh
source "$repo/tests/lib/venv.sh"
ensure_venv "$venv" "$repo/tests/kserve/requirements.txt"
python=$venv/bin/python

# --- 2. The base images. ----------------------------------------------------
t_base=$SECONDS
# Its progress goes to stderr; stdout is the folder of the two tarballs.
if ! base=$(bash "$here/make_base_image.sh" "$cache"); then
  fail "base" "make_base_image.sh failed (its log is above)"
  exit 1
fi
t_base=$((SECONDS - t_base))
t_import=$SECONDS
# The names the Dockerfile's FROM lines use (stage names excluded).
mapfile -t froms < <(awk 'toupper($1) == "FROM" {
  for (i = 2; i <= NF; i++) if ($i !~ /^--/) { print $i; break } }' \
  "$repo/Dockerfile")
declare -A stages=()
while read -r stage; do stages[$stage]=1; done < <(awk \
  'toupper($1) == "FROM" && toupper($(NF-1)) == "AS" { print $NF }' \
  "$repo/Dockerfile")
for from in "${froms[@]}"; do
  [[ -n "${stages[$from]:-}" ]] && continue
  case "$from" in
    debian:bookworm | docker.io/library/debian:bookworm) tarball=bookworm.tar ;;
    debian:bookworm-slim | docker.io/library/debian:bookworm-slim)
      tarball=bookworm-slim.tar ;;
    *)
      fail "base" "the Dockerfile starts FROM $from; this test makes only" \
        "debian:bookworm and debian:bookworm-slim (make_base_image.sh)"
      exit 1
      ;;
  esac
  name=docker.io/library/${from#docker.io/library/}
  if ! "${podman_cmd[@]}" image exists "$name"; then
    "${podman_cmd[@]}" import --change 'CMD ["bash"]' "$base/$tarball" \
      "$name" >/dev/null
  fi
done
t_import=$((SECONDS - t_import))
pass "base" "$(printf '%s ' "${froms[@]}")from $base (${t_base} s, import ${t_import} s)"

# --- 3. The build, from the working tree. ------------------------------------
context=$work/context
mkdir -p "$context"
if git -C "$repo" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  # What git sees: tracked files that still exist, and untracked files that
  # are not ignored (new sources not yet added); never build/.
  git -C "$repo" ls-files -z --cached --others --exclude-standard |
    while IFS= read -r -d '' file; do
      if [[ -e "$repo/$file" || -L "$repo/$file" ]]; then
        printf '%s\0' "$file"
      fi
    done | tar -C "$repo" --null -T - -cf - | tar -C "$context" -xf -
else
  # Not a git checkout (an unpacked release): .dockerignore keeps build
  # outputs out of the context.
  cp -a "$repo/." "$context/"
fi

log "buildah bud --format docker (log: $work/build.log)"
t_build=$SECONDS
set +e
"${buildah_cmd[@]}" bud --isolation chroot --pull=never --format docker \
  --layers=false -t "$image" -f "$context/Dockerfile" "$context" 2>&1 |
  tee "$work/build.log" |
  while IFS= read -r line; do
    # Each step, with the build's elapsed seconds when it began.
    if [[ "$line" =~ ^\[[0-9]+/[0-9]+\]\ (STEP|COMMIT) ]]; then
      printf '  %4d s  %s\n' $((SECONDS - t_build)) "${line:0:140}"
    fi
  done
build_rc=${PIPESTATUS[0]}
set -e
t_build=$((SECONDS - t_build))
if ((build_rc != 0)); then
  fail "build" "buildah bud exited $build_rc after ${t_build} s; the log's end:"
  tail -n 60 "$work/build.log" | sed 's/^/  | /'
  exit 1
fi
if grep -qi 'HEALTHCHECK is not supported' "$work/build.log"; then
  fail "build" "buildah dropped the HEALTHCHECK (not --format docker?)"
else
  pass "build" "$image in ${t_build} s"
fi
size_bytes=$("${podman_cmd[@]}" image inspect --format '{{.Size}}' "$image")
slim_bytes=$("${podman_cmd[@]}" image inspect --format '{{.Size}}' \
  docker.io/library/debian:bookworm-slim 2>/dev/null || echo 0)
size_mb=$((size_bytes / 1000000))
echo "image size: ${size_mb} MB (its base debian:bookworm-slim:" \
  "$((slim_bytes / 1000000)) MB)"

# --- 4. Run it. ------------------------------------------------------------------
# shellcheck source=SCRIPTDIR/../../tests/lib/server.sh
source "$repo/tests/lib/server.sh"  # free_port
# shellcheck source=SCRIPTDIR/../../tests/lib/front_door.sh
source "$repo/tests/lib/front_door.sh"  # front_door_conf
grace_ms=5000
drain_ms=1000

# start_container NAME [ATTNSERVE FLAGS...]: runs the image as NAME on fresh
# free loopback ports (never the defaults 8000/8001/8002) and waits, at most
# 60 s, for attnctl health to say SERVING from outside. Sets grpc_port,
# http_port, metrics_port and target. A port taken between the pick and the
# bind makes the server exit at boot; then it tries again with new ports,
# three times in all. Returns 1 (the container's log printed) when it never
# came up.
start_container() {
  local name=$1 attempt i state
  shift
  for attempt in 1 2 3; do
    grpc_port=$(free_port)
    metrics_port=$(free_port)
    while [[ "$metrics_port" == "$grpc_port" ]]; do metrics_port=$(free_port); done
    http_port=$(free_port)
    while [[ "$http_port" == "$grpc_port" || "$http_port" == "$metrics_port" ]]; do
      http_port=$(free_port)
    done
    target=127.0.0.1:$grpc_port
    # podman logs "unable to get systemd connection to add healthchecks"
    # here: it cannot set up its healthcheck timer without systemd.
    # Harmless; the HEALTHCHECK is run by hand below.
    "${podman_cmd[@]}" rm -f -t 0 "$name" >/dev/null 2>&1 || true
    if ! "${podman_cmd[@]}" run -d --name "$name" --pull never \
      --network host --log-driver k8s-file \
      --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 \
      "$image" --host=127.0.0.1 --grpc_port="$grpc_port" --http_port="$http_port" \
      --metrics_port="$metrics_port" "$@" >"$work/podman-run.log" 2>&1; then
      echo "podman run failed:"
      sed 's/^/  | /' "$work/podman-run.log"
      return 1
    fi
    for ((i = 0; i < 600; i++)); do
      if "$attnctl" health --target "$target" --deadline 1s >/dev/null 2>&1
      then
        return 0
      fi
      state=$("${podman_cmd[@]}" inspect --format '{{.State.Status}}' "$name")
      [[ "$state" == running ]] || break
      sleep 0.1
    done
    "${podman_cmd[@]}" logs "$name" >"$work/server.log" 2>&1 || true
    # Only a lost port race is worth another try.
    grep -q -e "cannot listen" -e "cannot serve metrics" "$work/server.log" ||
      break
    echo "attempt $attempt: a port was taken; again with new ports"
  done
  echo "$name never reported SERVING on $target; its log:"
  "${podman_cmd[@]}" logs "$name" 2>&1 | sed 's/^/  | /'
  return 1
}

t_start=$SECONDS
if ! start_container "$container" --drain_notice_ms="$drain_ms" \
  --grace_period_ms="$grace_ms"; then
  fail "health" "the container did not start (see above)"
  exit 1
fi
t_start=$((SECONDS - t_start))
pass "health" "attnctl health --target $target: SERVING ${t_start} s after" \
  "podman run (non-default ports: gRPC $grpc_port, HTTP $http_port, metrics $metrics_port)"

t_checks=$SECONDS
check typed-api "$python" "$here/check_image.py" typed-api --target "$target" \
  --attnctl "$attnctl"
check kserve "$python" "$here/check_image.py" kserve --target "$target"
check models "$python" "$here/check_image.py" models --target "$target" \
  --attnctl "$attnctl" --models "$repo/deploy/models"

# /metrics answers, and counts the calls just made.
check_metrics() {
  local metrics served
  metrics=$(curl -fsS --max-time 5 \
    "http://127.0.0.1:$metrics_port/metrics") || return 1
  served=$(awk '/^attnserve_requests_total\{/ { sum += $NF } END { print sum + 0 }' \
    <<<"$metrics")
  if ((served < 1)); then
    echo "attnserve_requests_total counts no call: $(grep -c . <<<"$metrics")" \
      "lines, none with a count"
    return 1
  fi
  echo "http://127.0.0.1:$metrics_port/metrics: $(grep -c '^attnserve_' \
    <<<"$metrics") attnserve_ samples, attnserve_requests_total $served"
}
check metrics check_metrics

# The server process (PID 1 in the container) runs as uid 10001, not root:
# its real and effective uid and gid, read from the host's /proc.
check_user() {
  local pid uids gids comm
  pid=$("${podman_cmd[@]}" inspect --format '{{.State.Pid}}' \
    "$container") || return 1
  comm=$(cat "/proc/$pid/comm") || return 1
  uids=$(awk '/^Uid:/ { print $2, $3 }' "/proc/$pid/status")
  gids=$(awk '/^Gid:/ { print $2, $3 }' "/proc/$pid/status")
  echo "pid $pid ($comm): uid $uids, gid $gids"
  [[ "$comm" == attnserve && "$uids" == "10001 10001" &&
    "$gids" == "10001 10001" ]]
}
check non-root check_user

# The image's HEALTHCHECK as docker would run it, inside the container. The
# server listens on neither localhost:8001 nor a wildcard, so only a check
# that follows --grpc_port and --host passes.
check_healthcheck() {
  local test
  test=$("${podman_cmd[@]}" image inspect --format \
    '{{json .HealthCheck.Test}}' "$image") || return 1
  if [[ -z "$test" || "$test" == null ]]; then
    echo "the image has no HEALTHCHECK (built without --format docker?)"
    return 1
  fi
  "${podman_cmd[@]}" healthcheck run "$container" || {
    echo "podman healthcheck run: unhealthy ($test)"
    return 1
  }
  echo "podman healthcheck run: healthy ($test)"
}
check healthcheck check_healthcheck

# The front door from the same image, as the Kubernetes pod and the Compose
# stack run it: nginx as the image's user on a read-only root with a tmpfs
# for its scratch, on the image's front-door.conf (ports and upstreams
# rewritten to this run's free ones by tests/lib/front_door.sh, as the
# shared host network needs), in front of the server above; then its
# exporter. A gRPC call and an HTTP request through the door must reach the
# server, and the exporter must see nginx up.
check_front_door() {
  local door http_door status exporter conf=$work/front-door.conf ok=1 i code
  "${podman_cmd[@]}" cp "$container:/etc/attnserve/front-door.conf" "$conf.image" || return 1
  front_door_conf "$conf.image" "$conf" "$target" "127.0.0.1:$http_port" || return 1
  door=$DOOR_GRPC_PORT; http_door=$DOOR_HTTP_PORT; status=$DOOR_STATUS_PORT
  exporter=$(free_port)
  "${podman_cmd[@]}" run -d --name "$container-door" --pull never --network host \
    --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 --read-only --tmpfs /tmp/nginx:rw,mode=1777 -v "$conf:/etc/attnserve/front-door.conf:ro" \
    --entrypoint /usr/sbin/nginx "$image" \
    -c /etc/attnserve/front-door.conf -e stderr -g 'daemon off;' >/dev/null || return 1
  "${podman_cmd[@]}" run -d --name "$container-exporter" --pull never --network host \
    --ulimit nofile=1024:1024 --ulimit nproc=1024:1024 --read-only --entrypoint /usr/bin/prometheus-nginx-exporter "$image" \
    "-nginx.scrape-uri=http://127.0.0.1:$status/stub_status" \
    -nginx.retries=60 -nginx.retry-interval=200ms \
    "-web.listen-address=127.0.0.1:$exporter" >/dev/null || return 1
  for ((i = 0; i < 100; i++)); do
    "$attnctl" health --target "127.0.0.1:$door" --deadline 1s 2>/dev/null | grep -q SERVING && break
    sleep 0.1
  done
  "$attnctl" health --target "127.0.0.1:$door" --deadline 2s || ok=0
  code=$(curl -sS --max-time 2 -o /dev/null -w '%{http_code}' \
    "http://127.0.0.1:$http_door/v2/health/ready") || true
  echo "GET :$http_door/v2/health/ready through the door: $code"
  [[ $code == 200 ]] || ok=0
  # A KServe v2 REST inference through the door (its body read whole by
  # nginx first, then sent on its keepalive upstream).
  curl -fsS --max-time 5 -X POST "http://127.0.0.1:$http_door/v2/models/masked_softmax/infer" \
    -d '{"inputs":[{"name":"X","shape":[1,2,3],"datatype":"FP32","data":[1,2,3,4,5,6]}]}' |
    grep '"outputs"' || ok=0
  for ((i = 0; i < 50; i++)); do
    curl -fsS "http://127.0.0.1:$exporter/metrics" 2>/dev/null | grep -q '^nginx_up 1' && break
    sleep 0.1
  done
  curl -fsS "http://127.0.0.1:$exporter/metrics" | grep '^nginx_up' || ok=0
  ((ok)) || "${podman_cmd[@]}" logs "$container-door" 2>&1 | tail -5
  "${podman_cmd[@]}" rm -f -t 0 "$container-door" "$container-exporter" >/dev/null 2>&1
  ((ok))
}
check front-door check_front_door

# The binary in the image is the portable one: AVX code only inside the CPU
# kernels' per-ISA copies, chosen at run time (no -march flag in the build).
check_isa() {
  "${podman_cmd[@]}" cp "$container:/usr/local/bin/attnserve" \
    "$work/attnserve" || return 1
  /usr/bin/python3 "$repo/tests/isa/check_isa_objects.py" --program \
    "$work/attnserve"
}
check isa check_isa
t_checks=$((SECONDS - t_checks))

# podman stop: SIGTERM, drain, exit 0 well before podman's SIGKILL at -t.
stop_timeout=$(((drain_ms + grace_ms) / 1000 + 10))
stop_began_ns=$(date +%s%N)
"${podman_cmd[@]}" stop -t "$stop_timeout" "$container" >/dev/null 2>&1 || true
stop_ms=$((($(date +%s%N) - stop_began_ns) / 1000000))
t_stop=$(((stop_ms + 500) / 1000))
exit_code=$("${podman_cmd[@]}" inspect --format '{{.State.ExitCode}}' \
  "$container")
if [[ "$exit_code" == 0 ]] && ((stop_ms <= drain_ms + grace_ms + 1000)); then
  pass "stop" "podman stop -t $stop_timeout: exit 0 after $stop_ms ms" \
    "(drain notice $drain_ms ms + grace $grace_ms ms)"
else
  fail "stop" "podman stop -t $stop_timeout: exit code $exit_code after" \
    "$stop_ms ms (drain notice $drain_ms ms + grace $grace_ms ms)"
fi

# The HEALTHCHECK talks to this very server: it turns unhealthy while the
# server drains. In a second container, since podman refuses
# `healthcheck run` once `podman stop` has begun: SIGTERM by `podman kill`,
# then the HEALTHCHECK by hand during the drain notice (health NOT_SERVING),
# then exit 0.
check_drain_health() {
  local name=$container-drain i out rc exit_code
  start_container "$name" --drain_notice_ms=4000 --grace_period_ms=1000 ||
    return 1
  "${podman_cmd[@]}" healthcheck run "$name" >/dev/null || {
    echo "$name: not healthy before SIGTERM"
    return 1
  }
  "${podman_cmd[@]}" kill --signal TERM "$name" >/dev/null || return 1
  for ((i = 0; i < 20; i++)); do
    rc=0
    out=$("${podman_cmd[@]}" healthcheck run "$name" 2>&1) || rc=$?
    ((rc == 1)) && break
    sleep 0.1
  done
  exit_code=$(timeout 30 "${podman_cmd[@]}" wait "$name") || return 1
  echo "after SIGTERM: podman healthcheck run: exit $rc ($out); the" \
    "server exited $exit_code"
  [[ "$rc" == 1 && "$out" == *unhealthy* && "$exit_code" == 0 ]]
}
t_drain=$SECONDS
check healthcheck-drain check_drain_health
t_drain=$((SECONDS - t_drain))

if ((failures > 0)); then
  log "the container's log:"
  "${podman_cmd[@]}" logs "$container" 2>&1 | sed 's/^/  | /'
fi

echo "timings: base ${t_base} s, import ${t_import} s, build ${t_build} s," \
  "start to SERVING ${t_start} s, checks ${t_checks} s, stop ${t_stop} s," \
  "drain test ${t_drain} s, total $((SECONDS - t_total)) s"
echo "image size: ${size_mb} MB"
echo "$((checks - failures)) passed, $failures failed"
((failures == 0))
