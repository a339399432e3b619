#!/usr/bin/env bash
# The command blocks the documentation shows as real output are run
# (tests/docs/readme_commands.py): every `$ ` line of README.md is one a
# test runs (its curl lines: e2e_http_defences_test; its attnctl lines:
# here), and the `$ build/client/attnctl` lines of README.md and
# docs/api.md, run against a real attnserve started as `make run` starts it
# (with the example model repository), print what they show.
#
#   tests/docs/readme_commands_test.sh ATTNSERVE ATTNCTL
set -uo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 ATTNSERVE ATTNCTL" >&2
  exit 64
fi
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
source "$repo/tests/lib/server.sh"
resolve_binaries readme_commands_test "$repo" "$1" "$2"

workdir=$(mktemp -d -t attnserve-readme.XXXXXX)
# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  stop_server
  rm -rf "$workdir"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

status=0
/usr/bin/python3 "$here/readme_commands.py" static "$repo/README.md" || status=1
start_server "$server_bin" "$workdir/server.log" \
  --model_repository="$repo/deploy/models" ||
  { echo "readme_commands_test: FATAL: attnserve did not start" >&2; exit 1; }
/usr/bin/python3 "$here/readme_commands.py" run "$attnctl" \
  "127.0.0.1:$GRPC_PORT" "$repo/README.md" "$repo/docs/api.md" || status=1
kill -0 "$SERVER_PID" 2>/dev/null || { echo "FAIL the server died"; status=1; }
[[ $status -eq 0 ]] || sed 's/^/  | /' "$workdir/server.log" >&2
echo "readme_commands_test: $([[ $status -eq 0 ]] && echo passed || echo FAILED)"
exit "$status"
