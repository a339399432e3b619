"""``attnserve-plot``: the chapter's pictures drawn from a running attnserve.

    attnserve-plot heatmap [--rpc attention] [--input FILE] [-o heatmap.png]
    attnserve-plot regression [--epochs 5] [-o regression.png]

``heatmap`` calls the server (the textbook's toy case by default, or the
keyword arguments of the Client method in a JSON or .npz file) and draws the
attention weights it returns. ``regression`` fits the Nadaraya-Watson
bandwidth on the server and draws the nonparametric and the fitted estimates
side by side, each over its weight matrix. ``--target`` (default
$ATTNSERVE_TARGET, else localhost:8001) names the server.

Exit status: 0 success; 1 the call failed (``attnserve-plot: CODE: message``
on stderr); 2 a usage or input-file error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import textbook
from ._types import Error
from .client import Client

# Per --rpc: the Client method, its array arguments and its other options.
_RPCS: Dict[str, Tuple[str, Tuple[str, ...], Tuple[str, ...]]] = {
    "attention": ("scaled_dot_product_attention",
                  ("queries", "keys", "values", "valid_lens"),
                  ("causal", "scale", "score", "precision")),
    "additive": ("additive_attention",
                 ("queries", "keys", "values", "valid_lens", "w_q", "w_k", "w_v"),
                 ("weights_name",)),
    "masked_softmax": ("masked_softmax", ("x", "valid_lens"), ()),
    "nadaraya_watson": ("nadaraya_watson", ("x_train", "y_train", "x_query"),
                        ("kernel", "bandwidth")),
}


class InputError(Exception):
    """A bad command line or input file (exit status 2)."""


def _load(path: str) -> Dict[str, Any]:
    try:
        if path.endswith(".npz"):
            with np.load(path) as archive:
                return {name: archive[name] for name in archive.files}
        with (sys.stdin if path == "-" else open(path, encoding="utf-8")) as file:
            data = json.load(file)
    except (OSError, ValueError) as error:
        raise InputError(f"--input {path}: {error}") from error
    if not isinstance(data, dict):
        raise InputError(f"--input {path}: expected a JSON object of arguments")
    return data


def _scalar(value: Any) -> Any:
    return value.item() if isinstance(value, np.ndarray) and value.ndim == 0 else value


def _request_arguments(rpc: str, data: Optional[Dict[str, Any]],
                       seed: int) -> Dict[str, Any]:
    """The Client method's keyword arguments, from the file or the toy case."""
    _, arrays, options = _RPCS[rpc]
    if data is None:
        if rpc == "attention":
            data = dict(textbook.toy_attention(query_dim=2, seed=seed))
        elif rpc == "additive":
            data = dict(textbook.toy_attention(query_dim=20, seed=seed))
            w = textbook.additive_weights(seed=seed)
            data.update(w_q=w.w_q, w_k=w.w_k, w_v=w.w_v)
        elif rpc == "masked_softmax":
            data = dict(textbook.masked_softmax_input(seed=seed))
        else:
            d = textbook.regression_data(seed=seed)
            data = {"x_train": d.x_train, "y_train": d.y_train, "x_query": d.x_query}
    unknown = sorted(set(data) - set(arrays) - set(options))
    if unknown:
        raise InputError(f"--rpc {rpc} takes {', '.join(arrays + options)}; "
                         f"unknown: {', '.join(unknown)}")
    kwargs: Dict[str, Any] = {name: np.asarray(data[name]) for name in arrays
                              if name in data}
    kwargs.update({name: _scalar(data[name]) for name in options if name in data})
    if rpc == "additive" and "weights_name" not in kwargs:
        try:
            kwargs["weights"] = tuple(kwargs.pop(name) for name in ("w_q", "w_k", "w_v"))
        except KeyError as error:
            raise InputError(f"--rpc additive needs w_q, w_k, w_v or weights_name; "
                             f"missing {error}") from None
    return kwargs


def _layout(weights: np.ndarray, rpc: str) -> Tuple[np.ndarray, Optional[List[str]]]:
    """(rows, cols, Q, K) as the chapter shows them."""
    if rpc == "nadaraya_watson" or weights.ndim == 2:
        return weights[None, None], None
    if weights.ndim == 4:  # (B, H, Lq, Lk): a row per batch item, a column per head
        return weights, [f"head {h}" for h in range(weights.shape[1])]
    if weights.shape[1] == 1:  # the toy case: one query each, one panel (B, Lk)
        return weights.reshape(1, 1, weights.shape[0], weights.shape[2]), None
    return weights[None], [f"batch {b}" for b in range(weights.shape[0])]


def _heatmap(args: argparse.Namespace) -> int:
    from . import plot

    data = _load(args.input) if args.input else None
    kwargs = _request_arguments(args.rpc, data, args.seed)
    method = _RPCS[args.rpc][0]
    if args.rpc != "masked_softmax":
        kwargs["return_weights"] = True
    with Client(args.target, timeout=args.timeout) as client:
        result = getattr(client, method)(**kwargs)
    weights = result.output if args.rpc == "masked_softmax" else result.weights
    grid, titles = _layout(weights, args.rpc)
    if args.rpc == "nadaraya_watson":
        xlabel, ylabel = "Sorted training inputs", "Sorted testing inputs"
    else:
        xlabel, ylabel = "Keys", "Queries"
    fig = plot.show_heatmaps(grid, xlabel=args.xlabel or xlabel,
                             ylabel=args.ylabel or ylabel, titles=titles,
                             cmap=args.cmap, dpi=args.dpi)
    if args.title:
        fig.suptitle(args.title)
    fig.savefig(args.output, dpi=args.dpi)
    width, height = (fig.get_size_inches() * args.dpi).round().astype(int)
    print(f"{args.output}: {method} weights {tuple(weights.shape)} "
          f"({result.info.implementation}), {width}x{height} px")
    return 0


def _regression(args: argparse.Namespace) -> int:
    from . import plot

    if args.input:
        data = _load(args.input)
        missing = {"x_train", "y_train"} - set(data)
        if missing:
            raise InputError(f"--input needs x_train and y_train; missing "
                             f"{', '.join(sorted(missing))}")
        x_train = np.asarray(data["x_train"], dtype=np.float32)
        order = np.argsort(x_train, kind="stable")
        x_train = x_train[order]
        y_train = np.asarray(data["y_train"], dtype=np.float32)[order]
        x_query = np.sort(np.asarray(data.get("x_query", np.linspace(
            x_train.min(), x_train.max(), 50)), dtype=np.float32))
        y_truth = data.get("y_truth")
    else:
        d = textbook.regression_data(n_train=args.n_train, seed=args.seed)
        x_train, y_train, x_query, y_truth = d.x_train, d.y_train, d.x_query, d.y_truth
    with Client(args.target, timeout=args.timeout) as client:
        before = client.nadaraya_watson(x_train, y_train, x_query,
                                        bandwidth=args.initial_bandwidth,
                                        return_weights=True)
        fit = client.fit_bandwidth(x_train, y_train,
                                   initial_bandwidth=args.initial_bandwidth,
                                   learning_rate=args.learning_rate,
                                   epochs=args.epochs, save_as=args.save_as or "")
        after = client.nadaraya_watson(x_train, y_train, x_query,
                                       bandwidth=fit.bandwidth, return_weights=True)
    plot.plot_regression_comparison(
        x_train, y_train, x_query, before=before, after=after, y_truth=y_truth,
        titles=(f"Nonparametric (w = {args.initial_bandwidth:g})",
                f"Fitted (w = {abs(fit.bandwidth):.3g})"),
        save=args.output, dpi=args.dpi)
    losses = ", ".join(f"{loss:.4g}" for loss in fit.loss_per_epoch)
    print(f"{args.output}: bandwidth {args.initial_bandwidth:g} -> "
          f"{abs(fit.bandwidth):.6g} in {len(fit.loss_per_epoch)} epochs; loss per "
          f"epoch {losses}; final {fit.final_loss:.6g}")
    return 0


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--target",
                        default=os.environ.get("ATTNSERVE_TARGET", "localhost:8001"),
                        help="the server, host:port (default $ATTNSERVE_TARGET or "
                             "localhost:8001)")
    common.add_argument("--timeout", type=float, default=60.0,
                        help="deadline of each call in seconds (default 60)")
    common.add_argument("--dpi", type=float, default=100, help="PNG resolution")
    common.add_argument("--seed", type=int, default=0,
                        help="seed of the generated textbook data (default 0)")

    top = argparse.ArgumentParser(
        prog="attnserve-plot",
        description="Draw the attention chapter's pictures from a running attnserve.")
    commands = top.add_subparsers(dest="command", required=True)

    heatmap = commands.add_parser(
        "heatmap", parents=[common],
        help="attention weights from one call, as a heatmap",
        description="Calls the server and draws the weights it returns (queries "
                    "down, keys across). Without --input: the textbook's toy case.")
    heatmap.add_argument("--rpc", choices=sorted(_RPCS), default="attention",
                         help="attention (scaled dot product, default), additive, "
                              "masked_softmax (draws its output), nadaraya_watson")
    heatmap.add_argument("--input", metavar="FILE",
                         help="JSON object or .npz of the Client method's keyword "
                              "arguments, e.g. {\"queries\": [[[...]]], \"keys\": ..., "
                              "\"values\": ..., \"valid_lens\": [2, 6]}; additive "
                              "takes w_q, w_k, w_v or weights_name; '-' reads stdin")
    heatmap.add_argument("-o", "--output", default="heatmap.png", help="the PNG")
    heatmap.add_argument("--xlabel")
    heatmap.add_argument("--ylabel")
    heatmap.add_argument("--title")
    heatmap.add_argument("--cmap", default="Reds", help="matplotlib colormap")
    heatmap.set_defaults(run=_heatmap)

    regression = commands.add_parser(
        "regression", parents=[common],
        help="Nadaraya-Watson before and after fitting the bandwidth",
        description="Fits the Gaussian bandwidth on the server and draws the "
                    "nonparametric and the fitted estimates side by side, each "
                    "over its weight matrix. Without --input: the textbook's data.")
    regression.add_argument("--input", metavar="FILE",
                            help="JSON or .npz with x_train, y_train (n,) and "
                                 "optionally x_query, y_truth (m,)")
    regression.add_argument("--n-train", type=int, default=50,
                            help="training points of the generated data (50)")
    regression.add_argument("--epochs", type=int, default=5)
    regression.add_argument("--learning-rate", type=float, default=0.5)
    regression.add_argument("--initial-bandwidth", type=float, default=1.0)
    regression.add_argument("--save-as", metavar="NAME",
                            help="also save the fitted model in the server's "
                                 "repository under NAME")
    regression.add_argument("-o", "--output", default="regression.png", help="the PNG")
    regression.set_defaults(run=_regression)
    return top


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.run(args)
    except Error as error:
        print(f"attnserve-plot: {error}", file=sys.stderr)
        return 1
    except InputError as error:
        print(f"attnserve-plot: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
