"""The attention-cues section's first picture, from the server.

The book draws ``d2l.show_heatmaps(torch.eye(10).reshape((1, 1, 10, 10)))``:
the weights of ten queries that each attend only to their own key. Here the
server computes them: scaled dot-product attention of the one-hot vectors
e_0..e_9 against themselves with a large scale (1000), whose softmax rows
are exactly one-hot in float32 (exp(-1000) is 0).

    python attention_cues.py --target localhost:8001 --out docs/images
"""

import argparse
import os
from pathlib import Path

import numpy as np

import attnserve
from attnserve import plot


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=os.environ.get("ATTNSERVE_TARGET",
                                                           "localhost:8001"))
    parser.add_argument("--out", default=".", help="folder for the PNG")
    args = parser.parse_args()

    eye = np.eye(10, dtype=np.float32)[None]  # (1, 10, 10): one-hot queries and keys
    with attnserve.Client(args.target, timeout=30) as client:
        result = client.scaled_dot_product_attention(eye, eye, eye, scale=1000.0,
                                                     return_weights=True)
    weights = result.weights  # (1, 10, 10)
    print(f"weights equal the identity: {np.array_equal(weights[0], eye[0])} "
          f"({result.info.implementation})")
    out = Path(args.out) / "chapter_identity.png"
    plot.show_heatmaps(weights.reshape(1, 1, 10, 10), xlabel="Keys", ylabel="Queries",
                       save=out)
    print(out)


if __name__ == "__main__":
    main()
