"""The inputs of Dive into Deep Learning's attention chapter, as numpy.

Seeded, so that a figure redrawn from them is the same figure every time.
The values are drawn as the book draws them (its PyTorch code), not the
book's exact random numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict

import numpy as np

from ._types import AdditiveWeights


def toy_attention(query_dim: int = 2, seed: int = 0) -> Dict[str, np.ndarray]:
    """The scoring-functions section's toy case, as keyword arguments of
    ``Client.scaled_dot_product_attention`` (query_dim 2) or
    ``additive_attention`` (query_dim 20): queries (2, 1, query_dim), keys
    (2, 10, 2) and values (2, 10, 4) from N(0, 1), valid_lens [2, 6]."""
    rng = np.random.default_rng(seed)
    return {
        "queries": rng.standard_normal((2, 1, query_dim)).astype(np.float32),
        "keys": rng.standard_normal((2, 10, 2)).astype(np.float32),
        "values": rng.standard_normal((2, 10, 4)).astype(np.float32),
        "valid_lens": np.array([2, 6], dtype=np.int32),
    }


def additive_weights(num_hiddens: int = 8, query_dim: int = 20, key_dim: int = 2,
                     seed: int = 0) -> AdditiveWeights:
    """Freshly initialised parameters of the section's AdditiveAttention
    (num_hiddens 8): uniform in +-1/sqrt(fan_in), as PyTorch's Linear."""
    rng = np.random.default_rng(seed)

    def linear(out_dim: int, in_dim: int) -> np.ndarray:
        bound = 1.0 / np.sqrt(in_dim)
        return rng.uniform(-bound, bound, (out_dim, in_dim)).astype(np.float32)

    return AdditiveWeights(w_q=linear(num_hiddens, query_dim),
                           w_k=linear(num_hiddens, key_dim),
                           w_v=linear(1, num_hiddens)[0])


def masked_softmax_input(seed: int = 0) -> Dict[str, np.ndarray]:
    """``masked_softmax(torch.rand(2, 2, 4), torch.tensor([2, 3]))``."""
    rng = np.random.default_rng(seed)
    return {"x": rng.random((2, 2, 4)).astype(np.float32),
            "valid_lens": np.array([2, 3], dtype=np.int32)}


def regression_truth(x: np.ndarray) -> np.ndarray:
    """The Nadaraya-Watson section's function, 2 sin(x) + x^0.8."""
    return 2 * np.sin(x) + x ** 0.8


@dataclass(frozen=True, eq=False)
class RegressionData:
    """Training pairs (x_train sorted, (n,)), queries x_query (m,) and the
    noise-free truth at the queries, y_truth (m,); float32."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_query: np.ndarray
    y_truth: np.ndarray


def regression_data(n_train: int = 50, seed: int = 0,
                    noise: float = 0.5) -> RegressionData:
    """The section's data: x ~ U(0, 5) sorted, y = 2 sin(x) + x^0.8 + N(0,
    noise^2); queries 0, 0.1, ..., 4.9."""
    rng = np.random.default_rng(seed)
    x_train = np.sort(rng.random(n_train) * 5).astype(np.float32)
    y_train = (regression_truth(x_train) +
               rng.normal(0.0, noise, n_train)).astype(np.float32)
    x_query = np.arange(0, 5, 0.1, dtype=np.float32)
    return RegressionData(x_train, y_train, x_query,
                          regression_truth(x_query).astype(np.float32))
