"""The Nadaraya-Watson section, before and after fitting, from the server.

The book's data (50 sorted x ~ U(0, 5), y = 2 sin(x) + x^0.8 + noise) is
regressed at the queries 0, 0.1, ..., 4.9 twice: with the nonparametric
Gaussian kernel (bandwidth 1), and with the bandwidth the server fits by
gradient descent on the leave-one-out loss (learning rate 0.5, 5 epochs, as
the book trains it). Each estimate is drawn over its attention weights.

With --save_as NAME (a server with a model repository), the fit is saved
with its training set, and the fitted estimate comes from the saved model
by name with the queries alone: the book's net(x_test, keys, values).

    python nadaraya_watson.py --target localhost:8001 --out docs/images
    python nadaraya_watson.py --target localhost:8001 --save_as chapter_net
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
    parser.add_argument("--save_as", default="",
                        help="save the fit as this model and query it by name")
    args = parser.parse_args()

    data = textbook.regression_data(n_train=50)
    with attnserve.Client(args.target, timeout=60) as client:
        before = client.nadaraya_watson(data.x_train, data.y_train, data.x_query,
                                        return_weights=True)
        fit = client.fit_bandwidth(data.x_train, data.y_train, initial_bandwidth=1.0,
                                   learning_rate=0.5, epochs=5, save_as=args.save_as)
        if args.save_as:
            # The saved model holds the bandwidth and the training set (its
            # keys and values): the queries alone, as net(x_test, ...).
            after = client.nadaraya_watson(x_query=data.x_query,
                                           model_name=args.save_as,
                                           return_weights=True)
            print(f"saved as {args.save_as}; queried by name")
        else:
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
