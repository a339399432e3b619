#!/usr/bin/env python3
"""Writes the example model repository (standard library only):
  additive_attention/       W_q (8, 20), W_k (8, 2), w_v (8,): the additive-attention
                            example of Dive into Deep Learning (queries of size 20,
                            keys of size 2, 8 hidden units), N(0, 0.1) weights, seed 0
  nadaraya_watson_fitted/   bandwidth 16.09: `attnctl fit-bandwidth` on the textbook
                            data (seed 0, 5 epochs, learning rate 0.5)
Run from the repository root: python3 deploy/models/make_examples.py"""
import json
import os
import random
import struct


def write_safetensors(path, tensors):
    header, data = {}, b""
    for name, (shape, values) in tensors.items():
        blob = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape,
                        "data_offsets": [len(data), len(data) + len(blob)]}
        data += blob
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def write_model(root, name, backend, tensors):
    folder = os.path.join(root, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.pbtxt"), "w") as f:
        f.write('name: "%s"\nplatform: "attnserve"\nbackend: "%s"\n' % (name, backend))
    write_safetensors(os.path.join(folder, "weights.safetensors"), tensors)


def main():
    root = os.path.dirname(os.path.abspath(__file__))
    rng = random.Random(0)
    normal = lambda n: [rng.gauss(0.0, 0.1) for _ in range(n)]
    h, q, k = 8, 20, 2
    write_model(root, "additive_attention", "additive_attention",
                {"W_q": ([h, q], normal(h * q)), "W_k": ([h, k], normal(h * k)),
                 "w_v": ([h], normal(h))})
    write_model(root, "nadaraya_watson_fitted", "nadaraya_watson",
                {"bandwidth": ([1], [16.089725])})


if __name__ == "__main__":
    main()
