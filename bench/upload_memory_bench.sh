#!/usr/bin/env bash
# What a model upload costs the server's memory: starts attnserve with an
# empty repository and --model_control_mode=explicit, then for each size
# uploads one attention memory (d = v = 64, float32) through KServe's
# RepositoryModelLoad over gRPC (`config` and `file:weights.safetensors`, as
# tritonclient's load_model sends them), with the server's peak resident
# memory (VmHWM) reset just before (/proc/PID/clear_refs); prints how much
# each upload raised the peak, in bytes and as a multiple of the file. Then
# the same for a refused upload (a NaN in the values: read and checked),
# and for one refused before its bytes are read (its config names another
# model): what receiving the message alone costs. Not part of the test
# suite (seconds); run as root or as the server's user.
#
# Usage: bench/upload_memory_bench.sh [N...]  (default 131072 524288: 64 and
#   256 MiB files; build first, and make test once for the Python venv)
set -euo pipefail
cd "$(dirname "$0")/.."
server=${ATTNSERVE:-build/server/attnserve}
ctl=${ATTNCTL:-build/client/attnctl}
python=${PYTHON:-build/tests/pyvenv/bin/python3}
sizes=("$@")
[[ ${#sizes[@]} -gt 0 ]] || sizes=(131072 524288)
[[ -x "$server" && -x "$ctl" ]] || { echo "build first: make build" >&2; exit 1; }
"$python" -c 'import grpc, grpc_tools, numpy' 2>/dev/null ||
  { echo "needs grpcio, grpcio-tools and numpy: PYTHON=... (make test makes build/tests/pyvenv)" >&2; exit 1; }
out=$(mktemp -d -t attnserve-upload.XXXXXX)
pid=""
cleanup() { [[ -n "$pid" ]] && kill -KILL "$pid" 2>/dev/null; rm -rf "$out"; }
trap cleanup EXIT
mkdir -p "$out/models" "$out/stubs"
"$python" -m grpc_tools.protoc -Iproto --python_out="$out/stubs" \
  --grpc_python_out="$out/stubs" inference/grpc_service.proto \
  inference/model_config.proto

# shellcheck source=bench/serve.sh
source bench/serve.sh

peak() { awk '/^VmHWM:/ {print $2 * 1024}' "/proc/$pid/status"; }
echo "| upload | file bytes | peak rise | x file |"
echo "|---|---:|---:|---:|"
# A fresh server for each upload: memory an earlier one freed, and the
# allocator kept, would make a later one look cheaper.
for n in "${sizes[@]}" refused unread; do
  rm -rf "$out/models" && mkdir "$out/models"
  START_TRIES=300 start_server --model_repository="$out/models" \
    --model_control_mode=explicit --max_message_bytes=1073741824 \
    --max_model_bytes=1073741824
  echo 5 > "/proc/$pid/clear_refs"
  before=$(peak)
  PYTHONPATH="$out/stubs" "$python" - "$grpc_port" "$n" "$out/size" <<'PY'
import struct, sys, json
import grpc, numpy as np
from inference import grpc_service_pb2 as pb, grpc_service_pb2_grpc as stubs

port, n, size_file = sys.argv[1], sys.argv[2], sys.argv[3]
refused = n in ("refused", "unread")
entries = 131072 if refused else int(n)
keys = np.ones((entries, 64), np.float32)
values = np.zeros((entries, 64), np.float32)
if n == "refused":
    values[-1, -1] = np.nan
header = {"keys": {"dtype": "F32", "shape": [entries, 64], "data_offsets": [0, keys.nbytes]},
          "values": {"dtype": "F32", "shape": [entries, 64],
                     "data_offsets": [keys.nbytes, keys.nbytes + values.nbytes]}}
text = json.dumps(header).encode()
text += b" " * (-len(text) % 8)
file = struct.pack("<Q", len(text)) + text + keys.tobytes() + values.tobytes()
del keys, values
open(size_file, "w").write(str(len(file)))
request = pb.RepositoryModelLoadRequest(model_name="upload")
request.parameters["config"].string_param = json.dumps(
    {"name": "other" if n == "unread" else "upload",
     "backend": "attention_memory"})
request.parameters["file:weights.safetensors"].bytes_param = file
del file
channel = grpc.insecure_channel(f"127.0.0.1:{port}", options=[
    ("grpc.max_send_message_length", 2**31 - 1)])
try:
    stubs.GRPCInferenceServiceStub(channel).RepositoryModelLoad(request, timeout=120)
    ok = True
except grpc.RpcError as e:
    ok = False
    print(f"  refused: {e.code().name}: {e.details()[:100]}", file=sys.stderr)
if ok == refused:
    sys.exit(f"upload {n}: expected {'a refusal' if refused else 'success'}")
PY
  after=$(peak)
  bytes=$(cat "$out/size")
  rise=$((after - before))
  echo "| $n | $bytes | $rise | $(awk -v r="$rise" -v b="$bytes" 'BEGIN {printf "%.2f", r / b}') |"
  stop_server
done
