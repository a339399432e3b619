"""The scoring-functions section's masked softmax, drawn from the server.

The book prints ``masked_softmax(torch.rand(2, 2, 4), torch.tensor([2, 3]))``
and the same with per-row lengths ``[[1, 3], [2, 4]]``; here both are drawn:
one row of panels per form of valid lengths, one panel per batch item. Masked
keys get exactly zero weight (the colormap's lightest color).

    python masked_softmax.py --target localhost:8001 --out docs/images
"""

import argparse
import os
from pathlib import Path

from matplotlib.figure import Figure

import attnserve
from attnserve import plot, textbook


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=os.environ.get("ATTNSERVE_TARGET",
                                                           "localhost:8001"))
    parser.add_argument("--out", default=".", help="folder for the PNG")
    args = parser.parse_args()

    x = textbook.masked_softmax_input()["x"]  # (2, 2, 4) from U(0, 1)
    forms = {"valid_lens = [2, 3]": [2, 3],
             "valid_lens = [[1, 3], [2, 4]]": [[1, 3], [2, 4]]}
    fig = Figure(figsize=(6.4, 4.6), layout="constrained")
    with attnserve.Client(args.target, timeout=30) as client:
        for panel, (title, lens) in zip(fig.subfigures(2, 1), forms.items()):
            weights = client.masked_softmax(x, valid_lens=lens).output  # (2, 2, 4)
            print(title, weights.astype(float).round(3).tolist())
            plot.show_heatmaps(weights[None], titles=["batch 0", "batch 1"],
                               vmin=0.0, vmax=1.0, fig=panel)
            panel.suptitle(title)
    out = Path(args.out) / "chapter_masked_softmax.png"
    fig.savefig(out, dpi=100)
    print(out)


if __name__ == "__main__":
    main()
