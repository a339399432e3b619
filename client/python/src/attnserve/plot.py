"""The attention chapter's pictures: weight heatmaps and kernel regression.

Figures are made with matplotlib's object API (``matplotlib.figure.Figure``),
never through ``pyplot``: nothing here selects or needs a GUI backend, so it
runs headless and saves PNGs through Agg. Every function returns the Figure
(in Jupyter it displays as the cell's value) and saves it when given
``save=PATH``. To draw into a window instead, pass a pyplot figure
(``fig=plt.figure()``) or axes (``ax=``) and call ``plt.show()``.

A PNG is saved at exactly ``figsize * dpi`` pixels (no tight bounding box),
so a cell's place in the picture follows from the axes' data transform.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np
from matplotlib import colors as mcolors
from matplotlib.axes import Axes
from matplotlib.figure import Figure, SubFigure
from matplotlib.image import AxesImage
from matplotlib.ticker import MaxNLocator

PathLike = Union[str, "os.PathLike[str]"]

__all__ = ["show_heatmaps", "plot_kernel_regression", "plot_regression_comparison"]


def _as_grid(matrices: Any) -> np.ndarray:
    m = np.asarray(matrices, dtype=np.float64)
    if m.ndim == 2:
        return m[None, None]
    if m.ndim == 3:
        return m[None]
    if m.ndim == 4:
        return m
    raise ValueError(f"show_heatmaps: expected (rows, cols, Q, K), (cols, Q, K) or "
                     f"(Q, K) matrices, got shape {m.shape}")


def _norm(data: np.ndarray, vmin: Optional[float],
          vmax: Optional[float]) -> mcolors.Normalize:
    """0 at the low end for non-negative data (weights), so a zero weight is
    exactly the colormap's first color."""
    finite = data[np.isfinite(data)]
    lo = vmin if vmin is not None else min(0.0, float(finite.min()) if finite.size else 0.0)
    hi = vmax if vmax is not None else (float(finite.max()) if finite.size else 1.0)
    if hi <= lo:
        hi = lo + 1.0
    return mcolors.Normalize(vmin=lo, vmax=hi)


def _heatmap(ax: Axes, matrix: np.ndarray, norm: mcolors.Normalize,
             cmap: Union[str, mcolors.Colormap]) -> AxesImage:
    # Nearest neighbour, no resampling blur: each cell is one flat color.
    image = ax.imshow(matrix, cmap=cmap, norm=norm, interpolation="nearest")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    return image


def _grid_figsize(rows: int, cols: int, q: int, k: int,
                  titled: bool) -> Tuple[float, float]:
    """Panels about 2.4 inches on their long side, following the cells'
    aspect, plus room for labels and the colorbar."""
    side = 2.4
    width, height = (side, side * q / k) if k >= q else (side * k / q, side)
    width, height = max(width, 0.9), max(height, 0.9)
    return (round(0.9 + cols * (width + 0.15) + 0.9, 2),
            round(0.8 + rows * (height + 0.15) + (0.3 if titled else 0.0), 2))


def _root(fig: Union[Figure, SubFigure]) -> Figure:
    while not isinstance(fig, Figure):  # a SubFigure: the figure holding it
        fig = fig.figure
    return fig


def _save(fig: Union[Figure, SubFigure], save: Optional[PathLike],
          dpi: Optional[float]) -> None:
    if save is not None:
        root = _root(fig)
        root.savefig(save, dpi=dpi if dpi is not None else root.dpi)


def show_heatmaps(matrices: Any, xlabel: str = "Keys", ylabel: str = "Queries",
                  titles: Optional[Sequence[str]] = None,
                  figsize: Optional[Tuple[float, float]] = None,
                  cmap: Union[str, mcolors.Colormap] = "Reds", *,
                  vmin: Optional[float] = None, vmax: Optional[float] = None,
                  colorbar: bool = True, fig: Optional[Union[Figure, SubFigure]] = None,
                  save: Optional[PathLike] = None,
                  dpi: Optional[float] = 100) -> Figure:
    """Heatmaps of attention weights, laid out as the chapter's
    ``d2l.show_heatmaps``.

    Args:
        matrices: (rows, cols, Q, K): a grid of rows x cols heatmaps, queries
            down and keys across (e.g. weights (B, H, Lq, Lk) give a row per
            batch item and a column per head; the toy case's (2, 1, 10)
            weights reshaped to (1, 1, 2, 10) give one panel). (cols, Q, K)
            and (Q, K) are taken as one row / one panel.
        xlabel, ylabel: on the bottom row and the first column.
        titles: one per column.
        figsize: inches; default from the grid's size.
        cmap: a matplotlib colormap (name).
        vmin, vmax: the color scale, shared by every panel (one colorbar);
            default: min(0, data min) to data max, so a weight of exactly 0
            is the colormap's color for 0.
        colorbar: draw the shared colorbar.
        fig: draw into this (empty) Figure or SubFigure instead of a new one.
        save: write the figure there (PNG by the file name's suffix), at
            ``dpi``: figsize * dpi pixels.

    Returns:
        The Figure (when ``fig`` is a SubFigure, the figure holding it).
    """
    grid = _as_grid(matrices)
    rows, cols = grid.shape[:2]
    if titles is not None and len(titles) != cols:
        raise ValueError(f"show_heatmaps: {len(titles)} titles for {cols} columns")
    if fig is None:
        if figsize is None:
            figsize = _grid_figsize(rows, cols, grid.shape[2], grid.shape[3],
                                    titles is not None)
        fig = Figure(figsize=figsize, dpi=dpi or 100, layout="constrained")
    norm = _norm(grid, vmin, vmax)
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)
    image = None
    for i in range(rows):
        for j in range(cols):
            ax = axes[i, j]
            image = _heatmap(ax, grid[i, j], norm, cmap)
            if i == rows - 1:
                ax.set_xlabel(xlabel)
            if j == 0:
                ax.set_ylabel(ylabel)
            if titles is not None and i == 0:
                ax.set_title(titles[j])
    if colorbar and image is not None:
        # d2l's shrink 0.6, unless the panels are too flat for it to read.
        tall = fig.bbox.height / fig.dpi >= 2.4  # a Figure or a SubFigure
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6 if tall else 1.0)
    _save(fig, save, dpi)
    return _root(fig)


def plot_kernel_regression(x_train: Any, y_train: Any, x_query: Any, y_pred: Any,
                           y_truth: Optional[Any] = None, *,
                           title: Optional[str] = None, xlabel: str = "x",
                           ylabel: str = "y",
                           figsize: Tuple[float, float] = (3.5, 2.5),
                           ax: Optional[Axes] = None,
                           save: Optional[PathLike] = None,
                           dpi: Optional[float] = 100) -> Figure:
    """The chapter's regression plot: the training points, the prediction
    at the queries and (when given) the truth.

    Args:
        x_train, y_train: (n,) training pairs (drawn as dots).
        x_query: (m,) query points, sorted. y_pred: (m,) predictions.
        y_truth: (m,) noise-free values at the queries, or None.
        ax: draw into these axes (their figure is returned) instead of a new
            figure of ``figsize`` inches.
        save, dpi: as ``show_heatmaps``.

    Returns:
        The Figure.
    """
    x_query = np.asarray(x_query, dtype=np.float64).ravel()
    if ax is None:
        fig = Figure(figsize=figsize, dpi=dpi or 100, layout="constrained")
        ax = fig.subplots()
    else:
        fig = _root(ax.figure)
    if y_truth is not None:
        ax.plot(x_query, np.asarray(y_truth, dtype=np.float64).ravel(), label="Truth")
    ax.plot(x_query, np.asarray(y_pred, dtype=np.float64).ravel(), "--", label="Pred")
    ax.plot(np.asarray(x_train, dtype=np.float64).ravel(),
            np.asarray(y_train, dtype=np.float64).ravel(), "o", alpha=0.5,
            markersize=4, label="Training")
    ax.set_xlim(float(x_query.min()), float(x_query.max()))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize="small")
    if title:
        ax.set_title(title)
    _save(fig, save, dpi)
    return fig


def _output_and_weights(estimate: Any, what: str) -> Tuple[np.ndarray, np.ndarray]:
    if hasattr(estimate, "output"):
        output, weights = estimate.output, estimate.weights
    else:
        output, weights = estimate
    if weights is None:
        raise ValueError(f"plot_regression_comparison: {what} has no weights "
                         "(call nadaraya_watson with return_weights=True)")
    return np.asarray(output), np.asarray(weights)


def plot_regression_comparison(x_train: Any, y_train: Any, x_query: Any, *,
                               before: Any, after: Any,
                               y_truth: Optional[Any] = None,
                               titles: Tuple[str, str] = ("Nonparametric (w = 1)",
                                                          "Fitted"),
                               cmap: Union[str, mcolors.Colormap] = "Reds",
                               figsize: Tuple[float, float] = (8.0, 7.0),
                               save: Optional[PathLike] = None,
                               dpi: Optional[float] = 100) -> Figure:
    """The Nadaraya-Watson section's four pictures in one: the estimate and
    its weight matrix before and after the bandwidth is fitted, side by side.

    Args:
        x_train, y_train: (n,) training pairs, x_train sorted.
        x_query: (m,) sorted queries.
        before, after: ``nadaraya_watson(..., return_weights=True)`` results
            (or (y_pred (m,), weights (m, n)) pairs): left and right column.
        y_truth: (m,) noise-free values, or None.
        titles: of the two columns.
        save, dpi: as ``show_heatmaps``.

    Returns:
        The Figure: regression curves on top, weight heatmaps (sorted queries
        down, sorted training inputs across; each with its own colorbar,
        since a fitted bandwidth makes much sharper weights) below.
    """
    fig = Figure(figsize=figsize, dpi=dpi or 100, layout="constrained")
    axes = fig.subplots(2, 2)
    for column, (estimate, title) in enumerate(zip((before, after), titles)):
        y_pred, weights = _output_and_weights(estimate, title)
        plot_kernel_regression(x_train, y_train, x_query, y_pred, y_truth,
                               title=title, ax=axes[0, column])
        ax = axes[1, column]
        image = _heatmap(ax, weights, _norm(weights, None, None), cmap)
        ax.set_xlabel("Sorted training inputs")
        ax.set_ylabel("Sorted testing inputs")
        fig.colorbar(image, ax=ax, shrink=0.8)
    _save(fig, save, dpi)
    return fig
