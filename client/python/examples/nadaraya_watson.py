"""The Nadaraya-Watson section, before and after fitting, from the server.

The book's data (50 sorted x ~ U(0, 5), y = 2 sin(x) + x^0.8 + noise) is
regressed at the queries 0, 0.1, ..., 4.9 twice: with the nonparametric
Gaussian kernel (bandwidth 1), and with the bandwidth the server fits by
gradient descent on the leave-one-out loss (learning rate 0.5, 5 epochs, as
the book trains it). Each estimate is drawn over its attention weights.

    python nadaraya_watson.py --target localhost:8001 --out docs/images
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
    parser.add_argument("--out", default=".", help="folder for the PNG")
    args = parser.parse_args()

    data = textbook.regression_data(n_train=50)
    with attnserve.Client(args.target, timeout=60) as client:
        before = client.nadaraya_watson(data.x_train, data.y_train, data.x_query,
                                        return_weights=True)
        fit = client.fit_bandwidth(data.x_train, data.y_train, initial_bandwidth=1.0,
                                   learning_rate=0.5, epochs=5)
        after = client.nadaraya_watson(data.x_train, data.y_train, data.x_query,
                                       bandwidth=fit.bandwidth, return_weights=True)
    print(f"bandwidth 1 -> {abs(fit.bandwidth):.4g}; loss per epoch "
          f"{fit.loss_per_epoch.round(3).tolist()}, final {fit.final_loss:.4g}")
    out = Path(args.out) / "chapter_nadaraya_watson.png"
    plot.plot_regression_comparison(
        data.x_train, data.y_train, data.x_query, before=before, after=after,
        y_truth=data.y_truth,
        titles=("Nonparametric (w = 1)", f"Fitted (w = {abs(fit.bandwidth):.3g})"),
        save=out)
    print(out)


if __name__ == "__main__":
    main()
