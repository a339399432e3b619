#!/usr/bin/env bash
# The pip-installable Python client (client/python) against the real attnserve:
# built and installed into a clean venv, then every Client method, the error
# mapping, the asyncio client, the plots (pixels checked), attnserve-plot and
# the chapter examples.
#
#   tests/python_package/run_test.sh ATTNSERVE VENV_DIR
#
# ATTNSERVE: the server binary (build/server/attnserve).
# VENV_DIR:  a cache (build/tests/pyclientvenv): a venv made once with
#            Debian's /usr/bin/python3, used only for its pip, and
#            VENV_DIR/wheelhouse, the wheels pinned by
#            client/python/constraints.txt, downloaded from PyPI once and again
#            when that file changes.
#
# Every run then builds the package for real, offline: client/python and
# proto/ are copied into a temporary tree (so the build writes nothing into
# the source tree), a fresh empty venv is made, and
#   pip install --no-index --find-links WHEELHOUSE <copy>/client/python
# runs with PIP_CONSTRAINT=constraints.txt, the documented install; pip builds
# it in an isolated environment (setuptools + grpcio-tools from the
# wheelhouse), which generates the stubs. The server runs on free loopback
# ports with a copy of deploy/models as its repository (fit_bandwidth's
# save_as writes there) and --max_request_elements=1048576 (the
# RESOURCE_EXHAUSTED case). Exit 0 when every test passed.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 ATTNSERVE VENV_DIR" >&2
  exit 64
fi
server_bin=$(realpath "$1")
cache=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
constraints=$repo/client/python/constraints.txt

source "$repo/tests/lib/server.sh"

workdir=$(mktemp -d -t attnserve-pyclient.XXXXXX)
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  stop_server
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ ! -x "$server_bin" ]]; then
  echo "run_test.sh: no server binary at $server_bin" >&2
  exit 1
fi
export PIP_DISABLE_PIP_VERSION_CHECK=1

# --- The cache: pip, and the pinned wheels. ----------------------------------
mkdir -p "$(dirname "$cache")"
(
  flock 9
  if [[ ! -x "$cache/bin/python" ]] || ! cmp -s "$constraints" "$cache/.constraints"; then
    echo "run_test.sh: making $cache (wheels from PyPI)"
    rm -rf "$cache"
    /usr/bin/python3 -m venv "$cache"
    "$cache/bin/python" -m pip download --quiet --only-binary=:all: \
      --dest "$cache/wheelhouse" -r "$constraints"
    cp "$constraints" "$cache/.constraints"
  fi
) 9>"$cache.lock"
pip=("$cache/bin/python" -m pip)

# --- Build and install from a clean venv, offline. ---------------------------
start=$(date +%s%N)
mkdir -p "$workdir/tree/client"
cp -r "$repo/proto" "$workdir/tree/proto"
cp -r "$repo/client/python" "$workdir/tree/client/python"
# A developer's in-tree build leftovers must not stand in for the build.
rm -rf "$workdir/tree/client/python/build" "$workdir/tree/client/python/src/attnserve/_generated" \
  "$workdir"/tree/client/python/src/*.egg-info
/usr/bin/python3 -m venv --without-pip "$workdir/venv"
python=$workdir/venv/bin/python
PIP_CONSTRAINT=$constraints "${pip[@]}" --python "$python" install --quiet --no-compile \
  --no-index --find-links "$cache/wheelhouse" "$workdir/tree/client/python"
"${pip[@]}" --python "$python" check
installed=$(date +%s%N)
echo "run_test.sh: built and installed into a clean venv in $(((installed - start) / 1000000)) ms"

# --- The server. -------------------------------------------------------------
mkdir -p "$workdir/models"
for model in "$repo"/deploy/models/*/; do cp -r "$model" "$workdir/models/"; done
# A stored memory for memory_name: the textbook's toy memory, keys (10, 2)
# and values (10, 4) (client_test.py rebuilds the same numbers).
/usr/bin/python3 - "$workdir/models" "$repo/deploy/models" <<'PY'
import sys
sys.path.insert(0, sys.argv[2])
import make_examples
keys = [(i % 5) * 0.5 - 1.0 for i in range(20)]
values = [0.25 * i for i in range(40)]
make_examples.write_model(sys.argv[1], "toy_memory", "attention_memory",
                          {"keys": ([10, 2], keys), "values": ([10, 4], values)})
PY
# Uploads (store_memory, the memory example) need explicit model control.
start_server "$server_bin" "$workdir/server.log" --kernel_threads=1 \
  --model_repository="$workdir/models" --max_request_elements=1048576 \
  --model_control_mode=explicit
echo "run_test.sh: attnserve pid $SERVER_PID on 127.0.0.1:$GRPC_PORT"

status=0
mkdir -p "$workdir/out"
(
  cd "$workdir/out"  # not the source tree: `import attnserve` must be the installed one
  # Headless, and no MPLBACKEND: attnserve.plot must not need a display.
  env -u DISPLAY -u WAYLAND_DISPLAY -u MPLBACKEND \
    "ATTNSERVE_TARGET=127.0.0.1:$GRPC_PORT" \
    "ATTNSERVE_MODEL_REPOSITORY=$workdir/models" \
    "ATTNSERVE_EXAMPLES=$repo/client/python/examples" \
    "ATTNSERVE_SOURCE_COPY=$workdir/tree/client/python" \
    "$python" "$here/client_test.py"
) || status=$?
echo "run_test.sh: tests ran in $((($(date +%s%N) - installed) / 1000000)) ms"

if ! kill -0 "$SERVER_PID" 2>/dev/null; then
  echo "run_test.sh: attnserve died during the test; its log:" >&2
  sed 's/^/  | /' "$workdir/server.log" >&2
  status=1
elif [[ $status -ne 0 ]]; then
  echo "run_test.sh: server log:" >&2
  sed 's/^/  | /' "$workdir/server.log" >&2
fi
exit "$status"
