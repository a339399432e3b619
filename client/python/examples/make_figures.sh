#!/usr/bin/env bash
# Redraws the attention chapter's figures (docs/images/chapter_*.png) from a
# real attnserve, with the example scripts beside this file.
#
#   client/python/examples/make_figures.sh [ATTNSERVE]
#
# ATTNSERVE: the server binary (default build/server/attnserve, from
#            `make build`); it is started on free loopback ports and always
#            stopped.
# Python:    $PYTHON if set (an interpreter with attnserve installed);
#            otherwise a venv at $VENV (default /tmp/attnserve-figures-venv)
#            into which client/python is installed (pip, with the pins of
#            client/python/constraints.txt; the first run downloads them).
# Output:    $OUT (default docs/images).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
server_bin=$(realpath "${1:-$repo/build/server/attnserve}")
out=${OUT:-$repo/docs/images}

source "$repo/tests/lib/server.sh"
workdir=$(mktemp -d -t attnserve-figures.XXXXXX)
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  stop_server
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
mkdir -p "$workdir/models"

if [[ -z "${PYTHON:-}" ]]; then
  venv=${VENV:-/tmp/attnserve-figures-venv}
  [[ -x "$venv/bin/python" ]] || /usr/bin/python3 -m venv "$venv"
  # Built from a copy, so the build leaves nothing in the source tree.
  mkdir -p "$workdir/tree/client"
  cp -r "$repo/proto" "$workdir/tree/proto"
  cp -r "$repo/client/python" "$workdir/tree/client/python"
  PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_CONSTRAINT=$repo/client/python/constraints.txt \
    "$venv/bin/python" -m pip install --quiet "$workdir/tree/client/python"
  PYTHON=$venv/bin/python
fi

# Explicit model control: attention_memory.py stores its memory (an upload).
start_server "$server_bin" "$workdir/server.log" --kernel_threads=1 \
  --model_repository="$workdir/models" --model_control_mode=explicit
mkdir -p "$out"
for example in attention_cues masked_softmax attention_scoring nadaraya_watson \
  attention_memory; do
  echo "== $example.py"
  "$PYTHON" "$here/$example.py" --target "127.0.0.1:$GRPC_PORT" --out "$out"
done
