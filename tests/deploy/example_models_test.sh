#!/usr/bin/env bash
# The example model repository (deploy/models) is what its generator makes:
# deploy/models/make_examples.py, run on a copy of itself in a temp folder,
# must write byte-identical config.pbtxt and weights.safetensors files, so the
# committed binaries can always be regenerated and reviewed from source.
# (The image, the Kubernetes ConfigMap and the KServe tests serve them.)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
workdir=$(mktemp -d -t attnserve-models.XXXXXX)
trap 'rm -rf "$workdir"' EXIT
cp "$repo/deploy/models/make_examples.py" "$workdir/"
/usr/bin/python3 "$workdir/make_examples.py"
failures=0
while IFS= read -r -d '' file; do
  relative=${file#"$workdir"/}
  if cmp -s "$file" "$repo/deploy/models/$relative"; then
    echo "ok   $relative regenerates byte for byte"
  else
    echo "FAIL $relative differs from what make_examples.py writes"
    failures=$((failures + 1))
  fi
done < <(find "$workdir" -type f ! -name make_examples.py -print0)
committed=$(cd "$repo/deploy/models" && find . -type f ! -name make_examples.py | wc -l)
generated=$(cd "$workdir" && find . -type f ! -name make_examples.py | wc -l)
if [[ "$committed" != "$generated" ]]; then
  echo "FAIL deploy/models has $committed files, make_examples.py writes $generated"
  failures=$((failures + 1))
fi
echo "example models: $failures failed"
((failures == 0))
