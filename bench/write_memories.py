#!/usr/bin/env python3
"""Writes stored models for the benchmarks into a model repository.

Usage: write_memories.py ROOT KIND N...
  KIND memory: attention memories memory_N, keys and values [N, 64] float32,
  N(0, 1)-like (a block of Gaussian draws, tiled: the kernel's time does not
  depend on the values).
  KIND memory16: the same memories stored as BF16 (memory16_N: the float
  values rounded to bfloat16, to nearest even).
  KIND regression: fitted Nadaraya-Watson models regression_N holding a 1-D
  training set of N points (the textbook's data over [0, 5)), bandwidth 4.
Standard library only.
"""
import array, json, math, os, random, struct, sys
root, kind, sizes = sys.argv[1], sys.argv[2], [int(n) for n in sys.argv[3:]]
rng = random.Random(7)
block = array.array("f", (rng.gauss(0, 1) for _ in range(1 << 16)))
def tensor(count):
    data = array.array("f", block) * (count // len(block) + 1)
    return data[:count].tobytes()
def bfloat16_block():
    words = array.array("I", block.tobytes())
    return array.array("H", ((w + 0x7FFF + ((w >> 16) & 1)) >> 16 for w in words))
def tensor16(count):
    # The block rounded once and tiled (rounding each tile again would cost
    # a Python loop over every element: minutes at a million entries).
    data = bfloat16_block() * (count // len(block) + 1)
    return data[:count].tobytes()
def write(name, backend, tensors, dtype="F32"):
    folder = os.path.join(root, name)
    os.makedirs(folder)
    header, data = {}, b""
    for tensor_name, shape, blob in tensors:
        header[tensor_name] = {"dtype": dtype, "shape": shape,
                               "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(folder, "weights.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
    with open(os.path.join(folder, "config.pbtxt"), "w") as f:
        f.write('name: "%s"\nbackend: "%s"\n' % (name, backend))
d = 64
for n in sizes:
    if kind == "memory":
        write("memory_%d" % n, "attention_memory",
              [("keys", [n, d], tensor(n * d)), ("values", [n, d], tensor(n * d))])
    elif kind == "memory16":
        write("memory16_%d" % n, "attention_memory",
              [("keys", [n, d], tensor16(n * d)),
               ("values", [n, d], tensor16(n * d))], "BF16")
    else:  # the textbook's data, spread over [0, 5)
        x = array.array("f", (rng.uniform(0, 5) for _ in range(n)))
        y = array.array("f", (2 * math.sin(v) + v ** 0.8 for v in x))
        write("regression_%d" % n, "nadaraya_watson",
              [("bandwidth", [1], array.array("f", [4.0]).tobytes()),
               ("x_train", [n], x.tobytes()), ("y_train", [n], y.tobytes())])
