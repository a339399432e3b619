"""Attention over a memory of key-value pairs, stored once on the server.

The chapter's view of attention: a memory of n key-value pairs, and each
query answered with the values weighted by how well it matches each key.
Here the memory is the Nadaraya-Watson section's training set (keys x_i,
values y_i), stored once as an ``attention_memory`` model with the Gaussian
score; the queries 0, 0.1, ..., 4.9 then travel alone, and the answer is the
section's nonparametric regression, exactly: attention pooling with the
Gaussian kernel is the softmax of -||q - k||^2 / 2. The weights are drawn as
the chapter draws them.

The server must accept uploads (``--model_control_mode=explicit``):

    python attention_memory.py --target localhost:8001 --out docs/images
"""

import argparse
import os
from pathlib import Path

import numpy as np

import attnserve
from attnserve import plot, textbook


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=os.environ.get("ATTNSERVE_TARGET",
                                                           "localhost:8001"))
    parser.add_argument("--out", default=".", help="folder for the PNG")
    parser.add_argument("--name", default="chapter_memory",
                        help="the model the memory is stored as")
    args = parser.parse_args()

    data = textbook.regression_data(n_train=50)
    keys, values = data.x_train.reshape(-1, 1), data.y_train.reshape(-1, 1)
    queries = data.x_query.reshape(1, -1, 1)  # one batch of 50 queries, d = 1
    with attnserve.Client(args.target, timeout=60) as client:
        client.store_memory(args.name, keys, values, score="gaussian")
        pooled = client.scaled_dot_product_attention(queries, memory_name=args.name,
                                                     return_weights=True)
        regression = client.nadaraya_watson(data.x_train, data.y_train, data.x_query,
                                            return_weights=True)
    same = np.allclose(pooled.output.ravel(), regression.output, atol=1e-5)
    print(f"memory {args.name}: {len(keys)} key-value pairs; queried with "
          f"{queries.shape[1]} queries alone")
    print(f"the memory's answer is the Nadaraya-Watson estimate: {same}")
    out = Path(args.out) / "chapter_memory.png"
    plot.show_heatmaps(pooled.weights, xlabel="Keys (training inputs, sorted)",
                       ylabel="Queries", save=out)
    print(out)


if __name__ == "__main__":
    main()
