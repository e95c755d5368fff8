"""Neighbourhood alignment between layers: mutual k-NN and CKNNA, on a seeded sample of rows.

Pure tensor functions, as platonic-rep (Huh et al. 2024, ``metrics.py``) defines them, on L2-normalised features
(cosine similarity ``K = X X^T``):

- **mutual k-NN**: with ``N_k^a(i)`` the k rows nearest to row i in layer a (itself excluded),
  ``(1/n) sum_i |N_k^a(i) ∩ N_k^b(i)| / k``; 1 when the two layers give every row the same neighbours.
- **CKNNA** (centred kernel nearest-neighbour alignment): Song et al.'s unbiased HSIC of the two kernels restricted
  to the pairs (i, j) that are among the k nearest in both layers, ``M = 1[N_k^a] * 1[N_k^b]`` (row i's
  neighbours, so not symmetric), ``HSIC_1(M * K_a, M * K_b) / (sqrt(HSIC_1(M_a * K_a, M_a * K_a)
  HSIC_1(M_b * K_b, M_b * K_b)) + 1e-6)``; platonic-rep's ``1e-6`` kept (so CKNNA(a, a) is a hair below 1).

Neither is a function of second moments: they read the rows themselves. Which rows: the ``size`` rows whose seeded
key :func:`sample_keys` of the global sample index is lowest (ties, which a 64-bit hash makes vanishingly rare,
broken by the index), ordered by index: the same rows for any batch size and number of processes
(:class:`~layerwise.metrics.LayerRowSample`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Optional

import numpy as np
import torch
from torch import Tensor

NEIGHBOUR_MEASURES = ("mutual_knn", "cknna")
_MASK64 = (1 << 64) - 1


def sample_keys(index: np.ndarray, seed: int) -> np.ndarray:
    """The seeded key (uint64) of each global sample index: splitmix64 of ``index + seed * 0x9E3779B97F4A7C15``.

    A bijection of the 64-bit integers for a given seed, so distinct indices never share a key.
    """
    with np.errstate(over="ignore"):
        z = np.asarray(index, dtype=np.uint64) + np.uint64((int(seed) * 0x9E3779B97F4A7C15) & _MASK64)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def lowest_keys(keys: np.ndarray, index: np.ndarray, size: int) -> np.ndarray:
    """Positions of the ``size`` rows of lowest (key, index), in that order."""
    return np.lexsort((index, keys))[:size]


def neighbour_masks(rows: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The cosine kernels ``K`` (L, n, n) of L2-normalised rows (L, n, d) and each row's k nearest (bool, self out)."""
    x = torch.nn.functional.normalize(rows.double(), p=2, dim=-1)
    kernel = x @ x.transpose(1, 2)
    hat = kernel.clone()
    hat.diagonal(dim1=1, dim2=2).fill_(float("-inf"))
    nearest = torch.topk(hat, k, dim=2).indices
    mask = torch.zeros_like(kernel, dtype=torch.bool).scatter_(2, nearest, True)
    return kernel, mask


def hsic_unbiased(k: Tensor, m: Tensor) -> Tensor:
    """Song et al.'s unbiased HSIC of two (n, n) kernels, not assumed symmetric (platonic-rep's form)."""
    n = k.shape[0]
    kt, lt = k.clone(), m.clone()
    kt.fill_diagonal_(0)
    lt.fill_diagonal_(0)
    value = (kt * lt.T).sum() + kt.sum() * lt.sum() / ((n - 1) * (n - 2)) - 2 * (kt.sum(0) @ lt.sum(1)) / (n - 2)
    return value / (n * (n - 3))


def mutual_knn(mask_a: Tensor, mask_b: Tensor, k: int) -> float:
    """Mean fraction of each row's k nearest neighbours shared by the two layers."""
    return float((mask_a & mask_b).sum(dim=1).double().div(k).mean())


def cknna(kernel_a: Tensor, kernel_b: Tensor, mask_a: Tensor, mask_b: Tensor, self_a: Tensor, self_b: Tensor) -> float:
    """CKNNA from the kernels, the neighbour masks and each layer's own ``HSIC_1(M_l K_l, M_l K_l)``."""
    both = (mask_a & mask_b).double()
    return float(hsic_unbiased(both * kernel_a, both * kernel_b) / (torch.sqrt(self_a * self_b) + 1e-6))


def neighbour_measures(
    rows: Tensor, measures: Iterable[str], k: int, pairs: Optional[Sequence[tuple[int, int]]] = None
) -> dict[str, Tensor]:
    """Each of ``measures`` (:data:`NEIGHBOUR_MEASURES`) between the layers of ``rows`` (L, n, d): (L, L) float64.

    ``pairs``: the (row, column) pairs to compute (None: all), NaN elsewhere; NaN everywhere when n <= k (mutual
    k-NN) or n <= max(k, 3) (CKNNA: the unbiased HSIC divides by n - 3). Memory: two (L, n, n) tensors.
    """
    wanted = [name for name in NEIGHBOUR_MEASURES if name in tuple(measures)]
    layers, n = rows.shape[0], rows.shape[1]
    out = {name: torch.full((layers, layers), float("nan"), dtype=torch.float64) for name in wanted}
    if not wanted or n <= k:
        return out
    kernel, mask = neighbour_masks(rows, k)
    todo = [(i, j) for i in range(layers) for j in range(layers)] if pairs is None else list(pairs)
    if "mutual_knn" in out:
        for i, j in todo:
            out["mutual_knn"][i, j] = mutual_knn(mask[i], mask[j], k)
    if "cknna" in out and n > 3:
        own = [hsic_unbiased(mask[i] * kernel[i], mask[i] * kernel[i]) for i in range(layers)]
        for i, j in todo:
            out["cknna"][i, j] = cknna(kernel[i], kernel[j], mask[i], mask[j], own[i], own[j])
    return out
