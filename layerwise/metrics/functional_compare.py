"""Pure functions comparing two models layer by layer on the same tokens: CKA across models, arccos distance.

From Brown, Godfrey, Konz, Tu & Kvinge (EMNLP 2023), "Understanding the Inner Workings of Language Models Through
Representation Dissimilarity". Features are token-level: ``a`` (L_A, N, d_A) from model A and ``b`` (L_B, N, d_B)
from model B on the same N tokens (padding removed by the caller); the widths may differ.

- Exact linear CKA: ``CKA(i, j) = ||X_i^T Y_j||_F^2 / (||X_i^T X_i||_F ||Y_j^T Y_j||_F)`` on column-centred X, Y.
- Unbiased minibatch CKA (Nguyen, Raghu & Kornblith, 2021) over chunks of n tokens, with Grams ``K = X X^T``,
  ``L = Y Y^T`` of centred X, Y and ``K~``, ``L~`` their zero-diagonal copies:
  ``HSIC_1(K, L) = [tr(K~ L~) + 1'K~1 1'L~1 / ((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n(n-3))``; aggregated as (a) the
  mean over chunks of ``HSIC_1(K,L) / sqrt(HSIC_1(K,K) HSIC_1(L,L))`` (the paper's) or (b)
  ``sum HSIC_1(K,L) / sqrt(sum HSIC_1(K,K) sum HSIC_1(L,L))`` (Nguyen et al.'s). Raw values (may be < 0).
- Arccos distance of two models of equal depth: ``sqrt(sum_i arccos(clamp(CKA(i, i), -1, 1))^2)``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

_F64 = torch.float64


def _check_pair(a: Tensor, b: Tensor) -> None:
    if a.dim() != 3 or b.dim() != 3 or a.shape[1] != b.shape[1]:
        raise ValueError(
            "Expected features (L_A, N, d_A) and (L_B, N, d_B) of the same N tokens, got "
            f"{tuple(a.shape)} and {tuple(b.shape)}."
        )


def _flat(x: Tensor) -> Tensor:
    """(L, N, d) -> (N, L*d) float64."""
    return x.to(_F64).transpose(0, 1).reshape(x.shape[1], -1)


def _cross_cka_update(a: Tensor, b: Tensor) -> dict[str, Tensor]:
    """Sums of one batch of (already shifted) float64 features: first moments, per-layer self and cross moments."""
    x, y = a.to(_F64), b.to(_F64)
    return {
        "count": torch.tensor(float(x.shape[1]), dtype=_F64, device=x.device),
        "sum_a": x.sum(dim=1),
        "sum_b": y.sum(dim=1),
        "self_a": x.transpose(1, 2) @ x,
        "self_b": y.transpose(1, 2) @ y,
        "cross": _flat(x).T @ _flat(y),
    }


def _cross_cka_compute(states: dict[str, Tensor]) -> Tensor:
    """CKA (L_A, L_B) from the sums: centre every block (S - n mu nu^T) and take squared Frobenius norms."""
    n = states["count"]
    mean_a, mean_b = states["sum_a"] / n, states["sum_b"] / n  # (L_A, d_A), (L_B, d_B)
    layers_a, dim_a = mean_a.shape
    layers_b, dim_b = mean_b.shape
    self_a = states["self_a"] - n * torch.einsum("ld,le->lde", mean_a, mean_a)
    self_b = states["self_b"] - n * torch.einsum("ld,le->lde", mean_b, mean_b)
    norm_a = self_a.square().sum(dim=(1, 2)).sqrt()
    norm_b = self_b.square().sum(dim=(1, 2)).sqrt()
    if states["cross"].dim() == 3:  # only the pairs (i, i): (L, d_A, d_B); the other pairs are not known (NaN)
        cross = states["cross"] - n * torch.einsum("ld,le->lde", mean_a, mean_b)
        cka = torch.full((layers_a, layers_b), float("nan"), dtype=cross.dtype, device=cross.device)
        cka.diagonal().copy_(cross.square().sum(dim=(1, 2)) / (norm_a * norm_b))
        return cka
    cross = states["cross"] - n * torch.outer(mean_a.reshape(-1), mean_b.reshape(-1))
    frob = cross.reshape(layers_a, dim_a, layers_b, dim_b).square().sum(dim=(1, 3))
    return frob / torch.outer(norm_a, norm_b)


def cross_cka(a: Tensor, b: Tensor) -> Tensor:
    """Exact linear CKA (L_A, L_B) between every layer of A and every layer of B on the same N tokens."""
    _check_pair(a, b)
    x, y = a.to(_F64), b.to(_F64)
    return _cross_cka_compute(_cross_cka_update(x - x.mean(dim=1, keepdim=True), y - y.mean(dim=1, keepdim=True)))


def _zero_diagonal_grams(x: Tensor) -> Tensor:
    """Zero-diagonal Grams (L, n, n) of the centred float64 features (L, n, d)."""
    x = x.to(_F64)
    x = x - x.mean(dim=1, keepdim=True)
    gram = x @ x.transpose(1, 2)
    gram.diagonal(dim1=1, dim2=2).zero_()
    return gram


def _hsic_from_grams(k: Tensor, l: Tensor) -> Tensor:  # noqa: E741
    """Unbiased HSIC_1 (P, Q) between zero-diagonal Grams k (P, n, n) and l (Q, n, n)."""
    n = k.shape[-1]
    trace = k.reshape(k.shape[0], -1) @ l.reshape(l.shape[0], -1).T  # tr(K~ L~) = sum(K~ * L~), Grams symmetric
    row_k, row_l = k.sum(dim=2), l.sum(dim=2)
    total_k, total_l = row_k.sum(dim=1), row_l.sum(dim=1)
    value = trace + torch.outer(total_k, total_l) / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * (row_k @ row_l.T)
    return value / (n * (n - 3))


def chunk_hsic(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Unbiased HSIC_1 of one chunk of n >= 4 tokens: across (L_A, L_B), within A (L_A,), within B (L_B,)."""
    _check_pair(a, b)
    n = a.shape[1]
    if n < 4:
        raise ValueError(f"The unbiased HSIC needs at least 4 tokens per chunk, got {n}.")
    k, l = _zero_diagonal_grams(a), _zero_diagonal_grams(b)  # noqa: E741
    self_a = torch.stack([_hsic_from_grams(k[i : i + 1], k[i : i + 1])[0, 0] for i in range(k.shape[0])])
    self_b = torch.stack([_hsic_from_grams(l[j : j + 1], l[j : j + 1])[0, 0] for j in range(l.shape[0])])
    return _hsic_from_grams(k, l), self_a, self_b


def minibatch_cross_cka(a: Tensor, b: Tensor, chunk: int = 1024, aggregation: str = "mean") -> Tensor:
    """Unbiased minibatch CKA (L_A, L_B) over contiguous chunks of ``chunk`` tokens (a last chunk of >= 4 kept).

    ``aggregation="mean"``: the mean over chunks of each chunk's CKA (the paper's, (a)); ``"sum"``: the ratio of the
    HSIC sums (Nguyen et al.'s, (b)).
    """
    _check_pair(a, b)
    if aggregation not in ("mean", "sum"):
        raise ValueError(f"`aggregation` must be 'mean' or 'sum', got {aggregation!r}.")
    zero: Any = 0.0  # each sum is a tensor once a chunk is added, and at least one is
    cka_sum, across_sum, self_a_sum, self_b_sum, chunks = zero, zero, zero, zero, 0
    for start in range(0, a.shape[1], chunk):
        part_a, part_b = a[:, start : start + chunk], b[:, start : start + chunk]
        if part_a.shape[1] < 4:
            continue
        across, self_a, self_b = chunk_hsic(part_a, part_b)
        cka_sum = cka_sum + across / torch.sqrt(torch.outer(self_a, self_b))
        across_sum, self_a_sum, self_b_sum = across_sum + across, self_a_sum + self_a, self_b_sum + self_b
        chunks += 1
    if chunks == 0:
        raise ValueError(f"No chunk of at least 4 tokens among {a.shape[1]}.")
    if aggregation == "mean":
        return cka_sum / chunks
    return across_sum / torch.sqrt(torch.outer(self_a_sum, self_b_sum))


def arccos_distance(cka: Tensor) -> Tensor:
    """``sqrt(sum_i arccos(clamp(CKA[i, i], -1, 1))^2)`` of the (L, L) CKA matrix of two models of equal depth."""
    if cka.dim() != 2 or cka.shape[0] != cka.shape[1]:
        raise ValueError(
            f"The arccos distance needs models of equal depth: a square CKA matrix, got {tuple(cka.shape)}; "
            "compare models of different depth by their CKA matrix."
        )
    angles = torch.arccos(cka.diagonal().to(_F64).clamp(-1.0, 1.0))
    return angles.square().sum().sqrt()
