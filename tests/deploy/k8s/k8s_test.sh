#!/usr/bin/env bash
# The Kubernetes manifests (deploy/k8s) test.
#
#   tests/deploy/k8s/k8s_test.sh VENV_DIR [ATTNSERVE ATTNCTL]
#
# VENV_DIR:  where to keep the test's virtual environment
#            (build/tests/k8svenv). It is made once with Debian's
#            /usr/bin/python3 -m venv and the pins of tests/deploy/k8s/
#            requirements.txt from PyPI, and made again when that file
#            changes.
# ATTNSERVE, ATTNCTL: optional; the server and client binaries
#            (build/server/attnserve, build/client/attnctl). Given, the
#            rendered manifests are also run for real (below).
#
# 1. yamllint over deploy/k8s (tests/deploy/k8s/yamllint.yaml).
# 2. check_manifests.py: renders deploy/k8s as shipped, with
#    components/writable-repository and with components/http-readiness
#    (kustomize_lite.py, and `kubectl kustomize` too when a kubectl is
#    installed: both must agree), validates every object strictly against
#    the Kubernetes schemas, and checks the invariants (ports, the front
#    door's listens and upstreams, probes, drain arithmetic, security, model
#    files).
# 3. With the binaries: attnserve started with the Deployment's args (ports
#    and host made loopback ones) on the ConfigMap volume as the kubelet
#    lays it out: both models load, a call by weights_name works, health is
#    SERVING and /v2/health/ready 200, on the HTTP port and (where nginx is
#    installed) through deploy/nginx/front-door.conf, as the http-readiness
#    component's probe asks; on SIGTERM health says NOT_SERVING and
#    /v2/health/ready 503 at once, on both paths, while calls are still
#    served, and the process exits 0 after the drain notice and within
#    terminationGracePeriodSeconds. Then the writable component: its init
#    script seeds an empty "claim" from the ConfigMap volume (twice: the
#    second run copies nothing), and FitBandwidth's save_as writes there.
#
# Exit 0 when every check passed; the last line is "N passed, M failed".
# Run from anywhere; paths in the repository are found from this file.
# ~6-9 s with the cached venv (most of it the 5 s drain notice); the first
# run also installs the pinned wheels from PyPI (~10 s more).
set -euo pipefail

if [[ $# -ne 1 && $# -ne 3 ]]; then
  echo "usage: $0 VENV_DIR [ATTNSERVE ATTNCTL]" >&2
  exit 64
fi
venv=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
requirements=$here/requirements.txt
server_bin=""
attnctl=""
if [[ $# -eq 3 ]]; then
  server_bin=$(realpath "$2")
  attnctl=$(realpath "$3")
  for binary in "$server_bin" "$attnctl"; do
    [[ -x "$binary" ]] || { echo "k8s_test.sh: no binary at $binary" >&2; exit 1; }
  done
fi

source "$repo/tests/lib/server.sh"
source "$repo/tests/lib/front_door.sh"
source "$repo/tests/lib/venv.sh"

workdir=$(mktemp -d -t attnserve-k8s.XXXXXX)
nginx_pid=""
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  if [[ -n "$nginx_pid" ]]; then
    kill "$nginx_pid" 2>/dev/null || true
    wait "$nginx_pid" 2>/dev/null || true
  fi
  stop_server
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

passed=0
failed=0
pass() { passed=$((passed + 1)); }
fail() {
  failed=$((failed + 1))
  echo "FAIL $*" >&2
}
check() {  # check NAME COMMAND...: one named check
  local name=$1
  shift
  if "$@"; then pass; else fail "$name"; fi
}
# Adds check_manifests.py's "N passed, M failed" line to the totals.
add_counts() {
  local line
  line=$(tail -n 1 "$1")
  if [[ $line =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed$ ]]; then
    passed=$((passed + BASH_REMATCH[1]))
    failed=$((failed + BASH_REMATCH[2]))
  else
    fail "$2 did not finish (no summary line)"
  fi
}

# --- The virtual environment, made once and cached. ------------------------
ensure_venv "$venv" "$requirements"
python=$venv/bin/python
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the source tree

# --- 1. yamllint. ------------------------------------------------------------
if "$python" -m yamllint --strict -c "$here/yamllint.yaml" "$repo/deploy/k8s"; then
  pass
else
  fail "yamllint: deploy/k8s is not clean YAML (findings above)"
fi

# --- 2. Render, validate, invariants. ---------------------------------------
kubectl_flag=()
if command -v kubectl >/dev/null && kubectl kustomize --help >/dev/null 2>&1; then
  kubectl_flag=(--kubectl "$(command -v kubectl)")
  echo "k8s_test.sh: cross-checking the rendering with" \
    "$(kubectl version --client 2>/dev/null | tr '\n' ' ')"
else
  echo "k8s_test.sh: no kubectl with kustomize here; kustomize_lite.py alone renders"
fi
"$python" "$here/check_manifests.py" "$repo" "$workdir" "${kubectl_flag[@]}" \
  | tee "$workdir/check.out" || true
add_counts "$workdir/check.out" check_manifests.py

# --- 3. The real server on the rendered manifests. --------------------------
if [[ -n "$server_bin" && -f "$workdir/base/args" ]]; then
  mapfile -t args <"$workdir/base/args"
  # shellcheck source=/dev/null  # written by check_manifests.py
  source "$workdir/base/settings"
  repository=$workdir/base/repository
  echo "k8s_test.sh: attnserve ${args[*]} on the ConfigMap volume layout"
  ctl() { "$attnctl" --target="127.0.0.1:$GRPC_PORT" --deadline=10s "$@"; }
  health_is() {  # health_is STATUS: attnctl health prints {"status": "STATUS"}
    local out
    out=$(ctl health 2>&1 || true)
    [[ $out == *"\"$1\""* ]]
  }
  ready_path=/v2/health/ready
  if [[ -f "$workdir/http-readiness/settings" ]]; then
    # shellcheck source=/dev/null  # written by check_manifests.py
    source "$workdir/http-readiness/settings"
    # shellcheck disable=SC2153  # READY_PATH: from the settings file
    ready_path=$READY_PATH
  fi
  http_is() {  # http_is CODE HOST:PORT: GET $ready_path answers CODE
    local code
    code=$(curl -sS --max-time 2 -o /dev/null -w '%{http_code}' "http://$2$ready_path" 2>&1) || true
    [[ $code == "$1" ]] || { echo "GET http://$2$ready_path: $code, not $1" >&2; return 1; }
  }
  if start_server "$server_bin" "$workdir/server.log" \
      --model_repository="$repository" "${args[@]}"; then
    pass
    for model in additive_attention nadaraya_watson_fitted; do
      check "runtime: the server loads $model from the ConfigMap volume" \
        grep -q "model repository: $model\$" "$workdir/server.log"
    done
    check "runtime: health is SERVING" health_is SERVING
    check "runtime: $ready_path is 200 on the server's HTTP port" \
      http_is 200 "127.0.0.1:$HTTP_PORT"
    # The front door as deployed, in front of it: the path the
    # http-readiness component's probe takes.
    door_http=""
    nginx_bin=$(command -v nginx || true)
    if [[ -n "$nginx_bin" ]]; then
      mkdir -p "$workdir/nginx"
      if front_door_conf "$repo/deploy/nginx/front-door.conf" "$workdir/front-door.conf" \
          "127.0.0.1:$GRPC_PORT" "127.0.0.1:$HTTP_PORT" "$workdir/nginx"; then
        "$nginx_bin" -c "$workdir/front-door.conf" -e "$workdir/nginx/error.log" \
          -g 'daemon off;' >"$workdir/nginx.log" 2>&1 &
        nginx_pid=$!
        door_http=127.0.0.1:$DOOR_HTTP_PORT
        for ((i = 0; i < 50; i++)); do
          http_is 200 "$door_http" 2>/dev/null && break
          sleep 0.1
        done
        check "runtime: $ready_path is 200 through the front door's HTTP port" \
          http_is 200 "$door_http"
      else
        fail "runtime: deploy/nginx/front-door.conf could not be made runnable (above)"
      fi
    else
      echo "k8s_test.sh: no nginx here; the HTTP probe is checked on the server's port only"
    fi
    echo '{"weights_name": "additive_attention"}' >"$workdir/weights.json"
    check "runtime: AdditiveAttention by weights_name uses the mounted weights" \
      ctl additive-attention --input "$workdir/weights.json" --summary \
      --shape queries=2x1x20,keys=2x10x2,values=2x10x4

    # The drain the manifests' arithmetic relies on.
    # The clock starts before the signal, so the time measured to the exit
    # is never shorter than the server's own.
    start_ns=$(date +%s%N)
    kill -TERM "$SERVER_PID"
    sleep 0.2
    check "runtime: NOT_SERVING right after SIGTERM (readiness fails)" \
      health_is NOT_SERVING
    check "runtime: $ready_path is 503 right after SIGTERM (HTTP readiness fails)" \
      http_is 503 "127.0.0.1:$HTTP_PORT"
    if [[ -n "$door_http" ]]; then
      check "runtime: $ready_path is 503 through the front door right after SIGTERM" \
        http_is 503 "$door_http"
    fi
    check "runtime: still serving calls during the drain notice" \
      ctl masked-softmax --summary
    exit_status=0
    wait "$SERVER_PID" || exit_status=$?
    elapsed_ms=$((($(date +%s%N) - start_ns) / 1000000))
    SERVER_PID=""
    echo "k8s_test.sh: attnserve exited $exit_status ${elapsed_ms} ms after SIGTERM"
    check "runtime: exit status 0 after the drain" test "$exit_status" -eq 0
    name="kept serving for the drain notice (${elapsed_ms} >= ${DRAIN_NOTICE_MS} ms)"
    check "runtime: $name" test "$elapsed_ms" -ge "$DRAIN_NOTICE_MS"
    name="exited within terminationGracePeriodSeconds (${elapsed_ms} ms, ${TERMINATION_GRACE_S} s)"
    check "runtime: $name" test "$elapsed_ms" -le $((TERMINATION_GRACE_S * 1000))
    if [[ -n "$nginx_pid" ]]; then
      kill "$nginx_pid" 2>/dev/null || true
      wait "$nginx_pid" 2>/dev/null || true
      nginx_pid=""
    fi
  else
    fail "runtime: attnserve did not start with the Deployment's args (log above)"
  fi

  if [[ -f "$workdir/writable/seed.sh" ]]; then
    claim=$workdir/writable/claim
    mkdir "$claim"
    seed() {
      SEED_DIR=$workdir/writable/seed MODELS_DIR=$claim HOSTNAME=k8s-test \
        /bin/sh "$workdir/writable/seed.sh"
    }
    check "runtime: the seed script runs" seed
    for model in additive_attention nadaraya_watson_fitted; do
      check "runtime: the seed copied $model into the claim" \
        cmp -s "$claim/$model/weights.safetensors" \
        "$repo/deploy/models/$model/weights.safetensors"
    done
    check "runtime: the seed leaves no partial copies" \
      test -z "$(find "$claim" -maxdepth 1 -name '.*' ! -name . -print -quit)"
    touch "$claim/nadaraya_watson_fitted/config.pbtxt.kept"
    check "runtime: a second seed run copies nothing (saved models survive)" \
      test -z "$(seed)"
    check "runtime: a second seed run leaves existing models alone" \
      test -e "$claim/nadaraya_watson_fitted/config.pbtxt.kept"
    rm "$claim/nadaraya_watson_fitted/config.pbtxt.kept"
    filtered=()
    for arg in "${args[@]}"; do
      [[ $arg == --drain_notice_ms=* ]] || filtered+=("$arg")
    done
    if start_server "$server_bin" "$workdir/server-writable.log" \
        --model_repository="$claim" "${filtered[@]}" --drain_notice_ms=0; then
      pass
      echo '{"save_as": "k8s_test_fit"}' >"$workdir/save.json"
      check "runtime: FitBandwidth save_as succeeds on the claim" \
        ctl fit-bandwidth --input "$workdir/save.json" --summary \
        --shape x_train=50,y_train=50
      check "runtime: the fit is saved in the claim" \
        test -s "$claim/k8s_test_fit/weights.safetensors"
      stop_server
    else
      fail "runtime: attnserve did not start on the seeded claim (log above)"
    fi
  fi
elif [[ -z "$server_bin" ]]; then
  echo "k8s_test.sh: no ATTNSERVE/ATTNCTL given; runtime checks not run"
fi

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
