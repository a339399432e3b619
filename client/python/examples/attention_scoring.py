"""The scoring-functions section's two heatmaps, from the server.

The toy case: two batch items of one query each, ten keys and values, valid
lengths [2, 6]. Additive attention (queries of size 20, keys of size 2, 8
hidden units, freshly initialised weights) and scaled dot-product attention
(queries of size 2) are computed by attnserve, and their (2, 1, 10) weights
drawn as the book does, reshaped to one 2 x 10 panel: only the first 2 and
the first 6 keys get any weight.

    python attention_scoring.py --target localhost:8001 --out docs/images
"""

import argparse
import os
from pathlib import Path

import attnserve
from attnserve import plot, textbook


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=os.environ.get("ATTNSERVE_TARGET",
                                                           "localhost:8001"))
    parser.add_argument("--out", default=".", help="folder for the PNGs")
    args = parser.parse_args()

    with attnserve.Client(args.target, timeout=30) as client:
        additive = client.additive_attention(
            **textbook.toy_attention(query_dim=20),
            weights=textbook.additive_weights(num_hiddens=8, query_dim=20, key_dim=2),
            return_weights=True)
        dot = client.scaled_dot_product_attention(**textbook.toy_attention(query_dim=2),
                                                  return_weights=True)
    for name, result in (("additive", additive), ("dot_product", dot)):
        out = Path(args.out) / f"chapter_{name}.png"
        plot.show_heatmaps(result.weights.reshape(1, 1, 2, 10), xlabel="Keys",
                           ylabel="Queries", save=out)
        print(out, result.weights.astype(float).round(3).reshape(2, 10).tolist())


if __name__ == "__main__":
    main()
