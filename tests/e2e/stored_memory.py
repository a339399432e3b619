"""The stored-memory end-to-end test's data and checks (stored_memory_test.sh).

  stored_memory.py write ROOT          a model repository with one
                                       attention_memory model, `memory`
  stored_memory.py request FILE        attnctl's --input: two queries
  stored_memory.py check RESPONSE      attnctl's printed response against a
                                       plain reference in double precision

The memory's keys and values and the queries are a fixed function of their
indices, so every step recomputes them. Standard library only.
"""

import array
import json
import math
import os
import struct
import sys

N, D, DV = 300, 8, 3
BATCH, LQ = 1, 2


def keys():
    return [[math.sin(0.37 * j + 1.3 * c) for c in range(D)] for j in range(N)]


def values():
    return [[math.cos(0.11 * j - 0.7 * c) for c in range(DV)] for j in range(N)]


def queries():
    return [[math.sin(0.5 * i - 0.9 * c) for c in range(D)] for i in range(LQ)]


def as_f32(rows):
    return [struct.unpack("f", struct.pack("f", x))[0] for row in rows for x in row]


def write(root):
    folder = os.path.join(root, "memory")
    os.makedirs(folder)
    blobs = [("keys", [N, D], array.array("f", as_f32(keys())).tobytes()),
             ("values", [N, DV], array.array("f", as_f32(values())).tobytes())]
    header, offset = {}, 0
    for name, shape, blob in blobs:
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(folder, "weights.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for _, _, blob in blobs:
            f.write(blob)
    with open(os.path.join(folder, "config.pbtxt"), "w") as f:
        f.write('name: "memory"\nbackend: "attention_memory"\n')


def request(path):
    with open(path, "w") as f:
        json.dump({"memory_name": "memory", "return_weights": True,
                   "queries": {"shape": [BATCH, LQ, D],
                               "values": as_f32(queries())}}, f)


def reference():
    k, v, q = as_f32(keys()), as_f32(values()), as_f32(queries())
    weights, output = [], []
    for i in range(LQ):
        scores = [sum(q[i * D + c] * k[j * D + c] for c in range(D)) / math.sqrt(D)
                  for j in range(N)]
        top = max(scores)
        e = [math.exp(s - top) for s in scores]
        total = sum(e)
        w = [x / total for x in e]
        weights.append(w)
        output.append([sum(w[j] * v[j * DV + c] for j in range(N))
                       for c in range(DV)])
    return output, weights


def tensor(response, name):
    t = response[name]
    return t.get("shape", []), t.get("values", [])


def check(path):
    with open(path) as f:
        response = json.load(f)
    out_shape, out = tensor(response, "output")
    w_shape, w = tensor(response, "weights")
    failures = []
    if [int(x) for x in out_shape] != [BATCH, LQ, DV]:
        failures.append(f"output shape {out_shape}, want {[BATCH, LQ, DV]}")
    if [int(x) for x in w_shape] != [BATCH, LQ, N]:
        failures.append(f"weights shape {w_shape}, want {[BATCH, LQ, N]}")
    want_out, want_w = reference()
    flat_out = [x for row in want_out for x in row]
    flat_w = [x for row in want_w for x in row]
    # float32 arithmetic over N = 300 terms: far inside 1e-4.
    if len(out) != len(flat_out) or any(
            abs(a - b) > 1e-4 for a, b in zip(out, flat_out)):
        failures.append(f"output {out[:4]}... differs from the reference "
                        f"{flat_out[:4]}...")
    if len(w) != len(flat_w) or any(abs(a - b) > 1e-5 for a, b in zip(w, flat_w)):
        failures.append("weights differ from the reference")
    for failure in failures:
        print("stored_memory.py:", failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    command, argument = sys.argv[1], sys.argv[2]
    if command == "write":
        write(argument)
    elif command == "request":
        request(argument)
    elif command == "check":
        sys.exit(check(argument))
    else:
        sys.exit(f"unknown command {command}")
