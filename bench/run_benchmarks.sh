#!/usr/bin/env bash
# Runs the kernel benchmarks and the PyTorch peer (float32 and bfloat16, full
# work and with valid lengths) in one go and prints one table (markdown)
# comparing them, headed by the CPU's name. Not part of the test suite.
#
# Usage: bench/run_benchmarks.sh [threads]   (default 2; build first: make build)
# Needs PyTorch 2.x from PyPI for the peer; installs it if missing.
set -euo pipefail
cd "$(dirname "$0")/.."
threads="${1:-2}"
out="$(mktemp -d)"
binary=build/bench/attention_benchmark
[[ -x "$binary" ]] || { echo "build first: make build" >&2; exit 1; }
if ! python3 -c 'import torch, numpy' 2>/dev/null; then
  python3 -m pip install --quiet torch numpy
fi
peer="${ATTN_PEER_SCRIPT:-bench/torch_attention_bench.py}"
echo "== attnserve kernels (OMP_NUM_THREADS=$threads)" >&2
OMP_NUM_THREADS="$threads" "$binary" --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true \
  --benchmark_out="$out/ours.json" --benchmark_out_format=json >&2
echo "== PyTorch peer ($peer)" >&2
python3 "$peer" --threads "$threads" --repeats 15 --json "$out/peer.json" >&2
python3 bench/compare.py "$out/ours.json" "$out/peer.json" "$threads"
