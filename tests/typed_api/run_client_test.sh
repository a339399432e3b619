#!/usr/bin/env bash
# The Python client test: a client in another language, written from the
# .proto alone, against the real attnserve binary.
#
#   tests/typed_api/run_client_test.sh ATTNSERVE VENV_DIR
#
# ATTNSERVE: the server binary (build/server/attnserve).
# VENV_DIR:  where to keep the test's virtual environment (build/tests/pyvenv).
#            It is made once with Debian's /usr/bin/python3 -m venv and the
#            pins of tests/typed_api/requirements.txt from PyPI, and made again
#            when that file changes.
#
# Generates the Python stubs of proto/attention/v1/attention.proto into a
# temporary folder, starts attnserve on free loopback ports, runs
# client_test.py and always stops the server. Exit 0 when every test passed.
# Run from anywhere; paths in the repository are found from this file.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 ATTNSERVE VENV_DIR" >&2
  exit 64
fi
server_bin=$(realpath "$1")
venv=$2
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
requirements=$here/requirements.txt

source "$repo/tests/lib/server.sh"
source "$repo/tests/lib/venv.sh"

workdir=$(mktemp -d -t attnserve-pytest.XXXXXX)
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  stop_server
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

if [[ ! -x "$server_bin" ]]; then
  echo "run_client_test.sh: no server binary at $server_bin" >&2
  exit 1
fi

# --- The virtual environment, made once and cached. ------------------------
ensure_venv "$venv" "$requirements"
python=$venv/bin/python

# --- Stubs from the .proto. -------------------------------------------------
"$python" -m grpc_tools.protoc --proto_path="$repo/proto" \
  --python_out="$workdir" --grpc_python_out="$workdir" \
  "$repo/proto/attention/v1/attention.proto"

# --- The server. -------------------------------------------------------------
start_server "$server_bin" "$workdir/server.log" --kernel_threads=1
echo "run_client_test.sh: attnserve pid $SERVER_PID on 127.0.0.1:$GRPC_PORT"

status=0
PYTHONPATH=$workdir ATTNSERVE_TARGET=127.0.0.1:$GRPC_PORT \
  "$python" "$here/client_test.py" || status=$?

if ! kill -0 "$SERVER_PID" 2>/dev/null; then
  echo "run_client_test.sh: attnserve died during the test; its log:" >&2
  sed 's/^/  | /' "$workdir/server.log" >&2
  status=1
elif [[ $status -ne 0 ]]; then
  echo "run_client_test.sh: server log:" >&2
  sed 's/^/  | /' "$workdir/server.log" >&2
fi
exit "$status"
