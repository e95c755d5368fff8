"""Similarity measures read from second moments: debiased CKA, the CCA family, shape metrics, effective rank.

Pure tensor functions, exact on the whole set.

Every measure here is a function of the centred (sum-form) second moments ``C_ab = X_a^T X_b`` of column-centred
(N, d) features, the statistic :class:`~layerwise.metrics.LayerCKA` and
:class:`~layerwise.metrics.CrossModelCKA` already accumulate, plus, for debiased CKA only, two more sums. Which
published variant each follows and how the anchors differ: ``docs/similarity-measures.md``.

- **Debiased CKA** (Song et al. 2012's unbiased HSIC; platonic-rep ``unbiased_cka``, anatome ``reduce_bias``):
  with ``q_i^l = ||x_i^l||^2`` of the centred features, ``HSIC_1(a, b) = [||C_ab||_F^2 - n/(n-2) Q_ab
  + t_a t_b / ((n-1)(n-2))] / (n(n-3))``, ``Q_ab = sum_i q_i^a q_i^b``, ``t_l = tr C_ll``; CKA = HSIC_1(a, b) /
  sqrt(HSIC_1(a, a) HSIC_1(b, b)). Streamed around any shift: ``Q`` (L, L) and ``R[a, b] = sum_i q_i^b x_i^a``
  (L, L, d), re-expressed around the mean at the end (:func:`_recentred_norm_products`).
- **CCA** (mean of the canonical correlations rho, the singular values of ``W_a^T C_ab W_b`` with
  ``W = V_r Lambda_r^{-1/2}`` the whitener of a layer on its r non-null principal directions).
- **SVCCA** (Raghu et al. 2017): the same on the fewest principal directions of each layer that keep ``variance``
  of its variance (eigenvalues of the covariance), mean over min(k_a, k_b) correlations.
- **PWCCA** (Morcos et al. 2018): ``sum_i alpha_i rho_i``, ``alpha_i`` proportional to ``sum_j |<v_i, x_j>|``, the
  projections of the neurons x_j of the narrower layer (the row layer for equal widths) on its i-th unit-norm
  canonical variate v_i: ``|C_aa a_i|_1`` for the canonical direction a_i.
- **Procrustes** (Ding et al. 2021): ``sqrt(2 - 2 ||C_ab||_* / sqrt(t_a t_b))``, the distance between the
  Frobenius-normalised centred features after the best rotation.
- **Angular shape metric** (Williams et al. 2021, netrep ``LinearMetric(alpha, score_method="angular")``):
  ``arccos(||Z_a C_ab Z_b||_* / sqrt(tr(Z_a C_aa Z_a) tr(Z_b C_bb Z_b)))``, ``Z = V diag(alpha + (1 - alpha)
  lambda^{-1/2}) V^T`` with netrep's eigenvalue floor 1e-7; alpha = 1 is the angular Procrustes distance,
  alpha = 0 arccos of the mean CCA.
- **Effective rank** (Roy & Vetterli 2007; RankMe, Garrido et al. 2023): ``exp(-sum p_k log p_k)``, ``p_k =
  sigma_k / sum sigma``, sigma the singular values of the centred (N, d) features (``spectrum="singular"``), or
  ``p_k = lambda_k / sum lambda`` on the covariance eigenvalues (``spectrum="covariance"``).

Distances (Procrustes, shape) are 0 for equal representations; similarities (CKA, CCA) 1.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import NamedTuple, Optional, Union

import torch
from torch import Tensor

from layerwise.metrics.functional import _F64, _check_features

PAIR_MEASURES = ("cca", "svcca", "pwcca", "procrustes", "shape")
MEASURES = ("debiased_cka", *PAIR_MEASURES, "effective_rank")
SPECTRA = ("singular", "covariance")
DISTANCES = ("procrustes", "shape")  # 0 for equal representations; the others are similarities (1)
NETREP_EIGENVALUE_FLOOR = 1e-7  # netrep.utils.whiten's eigval_tol, on the sum-form covariance X^T X


def check_measures(measures: Iterable[str], option: str = "measures") -> tuple[str, ...]:
    """The measures as a tuple in :data:`MEASURES`' order; a ValueError naming ``option`` for an unknown one."""
    given = tuple(measures)
    unknown = [name for name in given if name not in MEASURES]
    if unknown:
        raise ValueError(f"Unknown `{option}` {unknown[0]!r}: choose from {', '.join(MEASURES)}.")
    return tuple(name for name in MEASURES if name in given)


def check_cross_measures(measures: Iterable[str], svcca_variance: float, alpha: float) -> tuple[str, ...]:
    """The measures across two models (every one but ``debiased_cka``), checked with their options."""
    names = check_measures(measures, "measure")
    if "debiased_cka" in names:
        raise ValueError("`measure` debiased_cka is not kept across models; choose from the other measures.")
    check_options(svcca_variance, alpha, "singular")
    return names


def check_options(variance: float, alpha: float, spectrum: str) -> None:
    """A ValueError naming the option unless 0 < variance <= 1, 0 <= alpha <= 1 and ``spectrum`` is known."""
    if not 0.0 < float(variance) <= 1.0:
        raise ValueError(f"Expected `svcca_variance` in (0, 1], got {variance!r}.")
    if not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"Expected `shape_alpha` in [0, 1] (0: CCA, 1: Procrustes), got {alpha!r}.")
    if spectrum not in SPECTRA:
        raise ValueError(f"Expected `rank_spectrum` 'singular' or 'covariance', got {spectrum!r}.")


# ------------------------------------------------------------------------------------------------- debiased CKA
def _norm_product_update(x: Tensor, num_layers: int) -> tuple[Tensor, Tensor]:
    """The debiased CKA's extra sums of one batch of (shifted) features (L, B, d).

    ``Q`` (L, L) = sum_i ||x_i^a||^2 ||x_i^b||^2 and ``R`` (L, L, d), ``R[a, b] = sum_i ||x_i^b||^2 x_i^a``.
    """
    _check_features(x, num_layers)
    x = x.to(_F64)
    sq = x.square().sum(dim=-1)  # (L, B)
    return sq @ sq.T, torch.einsum("bi,aid->abd", sq, x)


def _recentred_norm_products(
    count: Tensor, feature_sum: Tensor, cross: Tensor, norm_products: Tensor, weighted_sums: Tensor, delta: Tensor
) -> tuple[Tensor, Tensor]:
    """``Q``, ``R`` of the features moved by ``delta`` (L, d) (x' = x + delta), from the sums around the old shift.

    With q = ||x||^2, e = ||delta||^2, s = sum x, S_ab = sum x^a x^b^T and t_a = tr S_aa (exact algebra):
    Q'_ab = Q_ab + 2 delta_b.R[b, a] + 2 delta_a.R[a, b] + 4 delta_a^T S_ab delta_b + e_b t_a + e_a t_b
    + 2 e_b delta_a.s_a + 2 e_a delta_b.s_b + n e_a e_b, and
    R'[a, b] = R[a, b] + 2 S_ab delta_b + e_b s_a + t_b delta_a + 2 (delta_b.s_b) delta_a + n e_b delta_a.
    ``cross`` is the stacked (L d, L d) second moment.
    """
    layers, dim = feature_sum.shape
    delta = delta.to(device=cross.device, dtype=_F64).reshape(layers, dim)
    blocks = cross.reshape(layers, dim, layers, dim)
    s_delta = torch.einsum("adbe,be->abd", blocks, delta)  # S_ab delta_b, (L, L, d)
    trace = _block_traces(blocks)
    e = delta.square().sum(dim=-1)  # (L,)
    ds = (delta * feature_sum).sum(dim=-1)  # delta_a . s_a, (L,)
    r_delta = torch.einsum("abd,ad->ab", weighted_sums, delta)  # delta_a . R[a, b]
    quad = torch.einsum("ad,abd->ab", delta, s_delta)  # delta_a^T S_ab delta_b
    q = norm_products + 2 * r_delta + 2 * r_delta.T + 4 * quad
    q = q + torch.outer(trace, e) + torch.outer(e, trace) + 2 * torch.outer(ds, e) + 2 * torch.outer(e, ds)
    q = q + count * torch.outer(e, e)
    r = weighted_sums + 2 * s_delta + e.view(1, -1, 1) * feature_sum.unsqueeze(1)
    r = r + (trace + 2 * ds + count * e).view(1, -1, 1) * delta.unsqueeze(1)
    return q, r


def _block_traces(blocks: Tensor) -> Tensor:
    """The traces tr S_ll (L,) of the (L, d, L, d) stacked second moment."""
    return torch.stack([blocks[layer, :, layer].trace() for layer in range(blocks.shape[0])])


def _debiased_hsic(frob: Tensor, norm_products: Tensor, trace_a: Tensor, trace_b: Tensor, n: float) -> Tensor:
    """Song et al.'s unbiased HSIC_1 from the centred statistics: ||C_ab||_F^2, Q_ab, tr C_aa, tr C_bb."""
    value = frob - n / (n - 2) * norm_products + torch.outer(trace_a, trace_b) / ((n - 1) * (n - 2))
    return value / (n * (n - 3))


def _debiased_cka_compute(
    feature_sum: Tensor, cross: Tensor, count: Union[Tensor, float], norm_products: Tensor, weighted_sums: Tensor
) -> Tensor:
    """Debiased CKA (L, L) from the streamed sums (around any shift); NaN for fewer than 4 samples."""
    n = float(count)
    layers, dim = feature_sum.shape
    if n < 4:
        return torch.full((layers, layers), float("nan"), dtype=_F64, device=cross.device)
    mean = feature_sum / n
    q, _ = _recentred_norm_products(
        torch.tensor(n, dtype=_F64), feature_sum, cross, norm_products, weighted_sums, -mean
    )
    frob, trace = _centred_frobenius(feature_sum, cross, n)
    hsic = _debiased_hsic(frob, q, trace, trace, n)
    diag = hsic.diagonal()
    return hsic / torch.sqrt(torch.outer(diag, diag))


def _centred_frobenius(feature_sum: Tensor, cross: Tensor, n: float) -> tuple[Tensor, Tensor]:
    """||C_ab||_F^2 (L, L) and tr C_ll (L,) of the centred blocks, one block row at a time."""
    layers, dim = feature_sum.shape
    mean = feature_sum.reshape(-1) / n
    frob = torch.empty(layers, layers, dtype=_F64, device=cross.device)
    trace = torch.empty(layers, dtype=_F64, device=cross.device)
    for a in range(layers):
        rows = slice(a * dim, (a + 1) * dim)
        row = (cross[rows] - n * torch.outer(mean[rows], mean)).reshape(dim, layers, dim)
        frob[a] = row.square().sum(dim=(0, 2))
        trace[a] = row[:, a].trace()
    return (frob + frob.T) / 2, trace


def debiased_cka(features: Tensor) -> Tensor:
    """Debiased linear CKA (L, L) between all layers of (L, N, d) features (N >= 4), from the streamed sums."""
    _check_features(features, None)
    x = features.to(_F64)
    layers, n, dim = x.shape
    z = x.transpose(0, 1).reshape(n, layers * dim)
    q, r = _norm_product_update(x, layers)
    return _debiased_cka_compute(x.sum(dim=1), z.T @ z, n, q, r)


# ------------------------------------------------------------------------------------ one layer's second moments
class LayerSpectrum(NamedTuple):
    """A layer's centred (sum-form) covariance and its eigen-decomposition, eigenvalues in decreasing order."""

    cov: Tensor
    values: Tensor
    vectors: Tensor
    rank: int


def layer_spectrum(cov: Tensor) -> LayerSpectrum:
    """Eigen-decomposition of a centred (d, d) covariance; ``rank``: eigenvalues above d eps lambda_max."""
    values, vectors = torch.linalg.eigh(cov.to(_F64))
    values, vectors = values.flip(0), vectors.flip(1)
    top = float(values[0]) if values.numel() else 0.0
    tolerance = max(top, 0.0) * cov.shape[0] * torch.finfo(_F64).eps
    rank = int((values > tolerance).sum()) if top > 0 else 0
    return LayerSpectrum(cov, values.clamp_min(0.0), vectors, rank)


def _whitener(layer: LayerSpectrum, keep: int) -> Tensor:
    """(d, keep) W = V_k Lambda_k^{-1/2}: the layer's first ``keep`` principal directions at unit variance."""
    return layer.vectors[:, :keep] * layer.values[:keep].rsqrt()


def _svcca_keep(layer: LayerSpectrum, variance: float) -> int:
    """The fewest principal directions whose eigenvalues sum to at least ``variance`` of the total."""
    values = layer.values[: layer.rank]
    if layer.rank == 0:
        return 0
    cumulative = values.cumsum(0) / values.sum()
    return min(layer.rank, int((cumulative < variance - 1e-12).sum()) + 1)


def effective_rank_of(layer: LayerSpectrum, spectrum: str = "singular") -> float:
    """The exp of the entropy of the normalised singular values (or covariance eigenvalues) of one layer."""
    values = layer.values[: max(layer.rank, 1)]
    weights = values.sqrt() if spectrum == "singular" else values
    total = float(weights.sum())
    if total <= 0:
        return float("nan")
    p = weights / total
    p = p[p > 0]
    return math.exp(float(-(p * p.log()).sum()))


# ----------------------------------------------------------------------------------------------------- one pair
def canonical_correlations(
    a: LayerSpectrum, b: LayerSpectrum, cross: Tensor, keep_a: Optional[int] = None, keep_b: Optional[int] = None
) -> Tensor:
    """Canonical correlations (descending, min(k_a, k_b) of them) on the first k principal directions of each."""
    keep_a, keep_b = a.rank if keep_a is None else keep_a, b.rank if keep_b is None else keep_b
    if keep_a == 0 or keep_b == 0:
        return cross.new_zeros(0, dtype=_F64)
    product = _whitener(a, keep_a).T @ cross.to(_F64) @ _whitener(b, keep_b)
    return torch.linalg.svdvals(product).clamp(0.0, 1.0)


def pwcca_of(a: LayerSpectrum, b: LayerSpectrum, cross: Tensor) -> float:
    """Morcos et al.'s projection-weighted mean of the canonical correlations, weighted on the narrower layer."""
    if a.rank == 0 or b.rank == 0:
        return float("nan")
    w_a, w_b = _whitener(a, a.rank), _whitener(b, b.rank)
    u, rho, vh = torch.linalg.svd(w_a.T @ cross.to(_F64) @ w_b, full_matrices=False)
    weighted, rotation = (a, u) if a.cov.shape[0] <= b.cov.shape[0] else (b, vh.T)
    # C v_i for the canonical direction v_i = W u_i: V_r Lambda_r^{1/2} u_i, the projections of the neurons
    projections = (weighted.vectors[:, : weighted.rank] * weighted.values[: weighted.rank].sqrt()) @ rotation
    weights = projections.abs().sum(dim=0)
    return float((weights / weights.sum() * rho.clamp(0.0, 1.0)).sum())


def _netrep_whitening(layer: LayerSpectrum, alpha: float) -> Tensor:
    """Partial whitening Z = V diag(alpha + (1 - alpha) lambda^{-1/2}) V^T (its rescale cancels)."""
    floor = layer.values.clamp_min(NETREP_EIGENVALUE_FLOOR)
    return (layer.vectors * (alpha + (1 - alpha) * floor.rsqrt())) @ layer.vectors.T


def shape_distance_of(a: LayerSpectrum, b: LayerSpectrum, cross: Tensor, alpha: float) -> float:
    """The angular shape distance of netrep in [0, pi] (alpha = 1: angular Procrustes; alpha = 0: arccos mean CCA)."""
    if alpha > 1 - NETREP_EIGENVALUE_FLOOR:  # netrep does not whiten at all
        numerator = torch.linalg.matrix_norm(cross.to(_F64), ord="nuc")
        norm_a, norm_b = a.cov.trace(), b.cov.trace()
    else:
        z_a, z_b = _netrep_whitening(a, alpha), _netrep_whitening(b, alpha)
        numerator = torch.linalg.matrix_norm(z_a @ cross.to(_F64) @ z_b, ord="nuc")
        norm_a, norm_b = (z_a @ a.cov @ z_a).trace(), (z_b @ b.cov @ z_b).trace()
    return math.acos(max(-1.0, min(1.0, float(numerator / torch.sqrt(norm_a * norm_b)))))


def procrustes_of(a: LayerSpectrum, b: LayerSpectrum, cross: Tensor) -> float:
    """Ding et al.'s orthogonal Procrustes distance of the Frobenius-normalised centred features, in [0, 2]."""
    nuclear = float(torch.linalg.matrix_norm(cross.to(_F64), ord="nuc") / torch.sqrt(a.cov.trace() * b.cov.trace()))
    return math.sqrt(max(0.0, 2.0 - 2.0 * nuclear))


def pair_values(
    a: LayerSpectrum,
    b: LayerSpectrum,
    cross: Tensor,
    measures: Sequence[str],
    svcca_variance: float = 0.99,
    alpha: float = 0.5,
) -> dict[str, float]:
    """Every requested pair measure of ``PAIR_MEASURES`` from two layers' spectra and their centred cross block."""
    values: dict[str, float] = {}
    if "cca" in measures:
        rho = canonical_correlations(a, b, cross)
        values["cca"] = float(rho.mean()) if rho.numel() else float("nan")
    if "svcca" in measures:
        rho = canonical_correlations(a, b, cross, _svcca_keep(a, svcca_variance), _svcca_keep(b, svcca_variance))
        values["svcca"] = float(rho.mean()) if rho.numel() else float("nan")
    if "pwcca" in measures:
        values["pwcca"] = pwcca_of(a, b, cross)
    if "procrustes" in measures:
        values["procrustes"] = procrustes_of(a, b, cross)
    if "shape" in measures:
        values["shape"] = shape_distance_of(a, b, cross, alpha)
    return values


# -------------------------------------------------------------------------------------------- all pairs at once
def pair_measures(
    spectra_a: Sequence[LayerSpectrum],
    spectra_b: Sequence[LayerSpectrum],
    cross_block: Callable[[int, int], Tensor],
    measures: Sequence[str],
    pairs: Optional[Iterable[tuple[int, int]]] = None,
    svcca_variance: float = 0.99,
    alpha: float = 0.5,
    same: bool = False,
) -> dict[str, Tensor]:
    """Each pair measure (L_A, L_B) float64 over ``pairs`` (default: all; the others NaN).

    ``cross_block(i, j)`` gives the centred (d_A, d_B) cross moment of layer i of A and layer j of B; ``same``: A and
    B are one model, so the pairs (l, l) are exact (0 distance, similarity 1).
    """
    wanted = [name for name in PAIR_MEASURES if name in measures]
    shape = (len(spectra_a), len(spectra_b))
    out = {name: torch.full(shape, float("nan"), dtype=_F64) for name in wanted}
    if not wanted:
        return out
    todo = [(i, j) for i in range(shape[0]) for j in range(shape[1])] if pairs is None else list(pairs)
    for i, j in todo:
        if same and i == j:  # a layer against itself: exact, where sqrt and arccos would turn 1e-16 into 1e-8
            for name in wanted:
                out[name][i, j] = 0.0 if name in DISTANCES else 1.0
            continue
        values = pair_values(spectra_a[i], spectra_b[j], cross_block(i, j), wanted, svcca_variance, alpha)
        for name, value in values.items():
            out[name][i, j] = value
    return out


def _centred_stacked(feature_sum: Tensor, cross: Tensor, n: float) -> Callable[[int, int], Tensor]:
    """``(i, j) -> C_ij`` (d, d): a centred block of the stacked (L d, L d) second moment, made on demand."""
    dim = feature_sum.shape[1]

    def block(i: int, j: int) -> Tensor:
        rows, cols = slice(i * dim, (i + 1) * dim), slice(j * dim, (j + 1) * dim)
        return cross[rows, cols] - torch.outer(feature_sum[i], feature_sum[j]) / n

    return block


def second_moment_measures(
    feature_sum: Tensor,
    cross: Tensor,
    count: Union[Tensor, float],
    measures: Sequence[str],
    svcca_variance: float = 0.99,
    alpha: float = 0.5,
    spectrum: str = "singular",
    pairs: Optional[Iterable[tuple[int, int]]] = None,
    blocks: Optional[Sequence[tuple[int, int]]] = None,
) -> dict[str, Tensor]:
    """The pair measures (L, L) and ``effective_rank`` (L,) from ``LayerCKA``'s sums (around any shift).

    ``cross``: the stacked (L·d, L·d) cross-moments, or with ``blocks`` (``LayerCKA(pairs=...)``) the kept (K, d, d)
    blocks of those (a, b) pairs; ``pairs`` among them (default: every pair, or every kept pair off the diagonal).
    """
    if blocks is None:
        block = _centred_stacked(feature_sum.to(_F64), cross, float(count))
    else:
        block = _centred_blocks(blocks, feature_sum.to(_F64), cross, float(count))
        pairs = [pair for pair in blocks if pair[0] != pair[1]] if pairs is None else pairs
    return _measures_of(feature_sum, block, cross.device, measures, svcca_variance, alpha, spectrum, pairs)


def _measures_of(
    feature_sum: Tensor,
    block: Callable[[int, int], Tensor],
    device: torch.device,
    measures: Sequence[str],
    svcca_variance: float,
    alpha: float,
    spectrum: str,
    pairs: Optional[Iterable[tuple[int, int]]],
) -> dict[str, Tensor]:
    """The pair measures and ``effective_rank`` of one model from its centred blocks ``block(i, j)``."""
    check_options(svcca_variance, alpha, spectrum)
    spectra = [layer_spectrum(block(layer, layer)) for layer in range(feature_sum.shape[0])]
    values = pair_measures(spectra, spectra, block, measures, pairs, svcca_variance, alpha, same=True)
    out = {name: value.to(device) for name, value in values.items()}
    if "effective_rank" in measures:
        ranks = [effective_rank_of(layer, spectrum) for layer in spectra]
        out["effective_rank"] = torch.tensor(ranks, dtype=_F64, device=device)
    return out


# ------------------------------------------------------------------ the blocks of some layer pairs (``pairs``)
# ``LayerCKA(pairs="to_last" | "adjacent")`` keeps, instead of the stacked (L d, L d) second moment, only the (d, d)
# blocks S_ab of the layer pairs it needs: every diagonal block (a, a) and the off-diagonal pairs, a < b, so
# 2L - 1 blocks, O(L d^2). Debiased CKA's two extra sums are kept for the same blocks: Q_ab (K,) and
# R[a, b], R[b, a] (K, 2, d). Every formula is the stacked one restricted to the blocks (exact algebra).
PAIRS = ("all", "to_last", "adjacent")


def check_pairs(pairs: str, option: str = "pairs") -> str:
    """``pairs`` if one of :data:`PAIRS`, else a ValueError naming ``option``."""
    if pairs not in PAIRS:
        raise ValueError(f"`{option}={pairs!r}` must be 'all', 'to_last' or 'adjacent'.")
    return pairs


def computed_pairs(pairs: str, num_layers: int) -> Optional[list[tuple[int, int]]]:
    """The (a, b) pairs a measure is computed for: None for ``all``; (l, L) or (l, l + 1) (the last: (L, L))."""
    if check_pairs(pairs) == "all":
        return None
    last = num_layers - 1
    return [(layer, last if pairs == "to_last" else min(layer + 1, last)) for layer in range(num_layers)]


def kept_blocks(pairs: str, num_layers: int) -> Optional[list[tuple[int, int]]]:
    """The (a, b) blocks, a <= b, the state keeps for ``pairs``: every diagonal one, then the computed pairs."""
    computed = computed_pairs(pairs, num_layers)
    if computed is None:
        return None
    diagonal = [(layer, layer) for layer in range(num_layers)]
    return diagonal + sorted({(min(a, b), max(a, b)) for a, b in computed if a != b})


def _block_index(blocks: Sequence[tuple[int, int]], device: torch.device) -> tuple[Tensor, Tensor]:
    """The row layers a and column layers b of ``blocks``, as index tensors on ``device``."""
    index = torch.tensor(list(blocks), dtype=torch.long, device=device).reshape(-1, 2)
    return index[:, 0], index[:, 1]


def _block_moments_update(x: Tensor, blocks: Sequence[tuple[int, int]], moments: Tensor) -> Tensor:
    """Add sum_i x_i^a x_i^b^T of shifted float64 features x (L, B, d) to ``moments`` (K, d, d) in place.

    One (d, d) product per block: nothing of the batch's size is held beside ``x``.
    """
    for k, (a, b) in enumerate(blocks):
        moments[k].addmm_(x[a].T, x[b])
    return moments


def _block_norm_product_update(x: Tensor, blocks: Sequence[tuple[int, int]]) -> tuple[Tensor, Tensor]:
    """Debiased CKA's sums of one batch for ``blocks``: Q (K,) and (R[a, b], R[b, a]) (K, 2, d)."""
    sq = x.square().sum(dim=-1)  # (L, B)
    q = torch.stack([sq[a] @ sq[b] for a, b in blocks])
    r = torch.stack([torch.stack([sq[b] @ x[a], sq[a] @ x[b]]) for a, b in blocks])  # one block at a time
    return q, r


def _recentred_blocks(
    blocks: Sequence[tuple[int, int]],
    count: Tensor,
    feature_sum: Tensor,
    moments: Tensor,
    delta: Tensor,
    norm_products: Optional[Tensor] = None,
    weighted_sums: Optional[Tensor] = None,
    move_moments: bool = True,
) -> tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """The blocks (and Q, R) of the features moved by ``delta`` (L, d), from the sums around the old shift.

    The formulas of :func:`~layerwise.metrics.functional_similarity._recentred_moments` and
    :func:`_recentred_norm_products`, block by block: S'_ab = S_ab + s_a delta_b^T + delta_a s_b^T + n delta_a
    delta_b^T. The feature sums themselves move by n delta (the caller's). ``move_moments=False``: Q and R only.
    """
    rows, columns = _block_index(blocks, moments.device)
    delta = delta.to(device=moments.device, dtype=_F64).reshape(feature_sum.shape)
    m_a, m_b, d_a, d_b = feature_sum[rows], feature_sum[columns], delta[rows], delta[columns]
    moved = None
    if move_moments:  # one block at a time: one copy of the state, no (K, d, d) temporaries
        moved = moments.clone()
        for k in range(len(blocks)):
            moved[k] += torch.outer(m_a[k], d_b[k]) + torch.outer(d_a[k], m_b[k] + count * d_b[k])
    if norm_products is None or weighted_sums is None:
        return moved, None, None
    diagonal = {a: k for k, (a, b) in enumerate(blocks) if a == b}
    trace = torch.stack([moments[diagonal[layer]].trace() for layer in range(feature_sum.shape[0])])
    e = delta.square().sum(dim=-1)  # (L,)
    ds = (delta * feature_sum).sum(dim=-1)  # delta_l . s_l (L,)
    s_db = torch.einsum("kde,ke->kd", moments, d_b)  # S_ab delta_b
    s_da = torch.einsum("kde,kd->ke", moments, d_a)  # S_ba delta_a = S_ab^T delta_a
    r_ab, r_ba = weighted_sums[:, 0], weighted_sums[:, 1]
    q = norm_products + 2 * (d_b * r_ba).sum(-1) + 2 * (d_a * r_ab).sum(-1) + 4 * (d_a * s_db).sum(-1)
    q = q + e[columns] * trace[rows] + e[rows] * trace[columns] + 2 * e[columns] * ds[rows] + 2 * e[rows] * ds[columns]
    q = q + count * e[rows] * e[columns]
    new_ab = r_ab + 2 * s_db + e[columns, None] * m_a + (trace + 2 * ds + count * e)[columns, None] * d_a
    new_ba = r_ba + 2 * s_da + e[rows, None] * m_b + (trace + 2 * ds + count * e)[rows, None] * d_b
    return moved, q, torch.stack([new_ab, new_ba], dim=1)


def _centred_blocks(
    blocks: Sequence[tuple[int, int]], feature_sum: Tensor, moments: Tensor, n: float
) -> Callable[[int, int], Tensor]:
    """``(i, j) -> C_ij`` (d, d) for a pair among ``blocks`` (either order); a KeyError names any other pair."""
    where = {pair: k for k, pair in enumerate(blocks)}

    def block(i: int, j: int) -> Tensor:
        if (i, j) not in where and (j, i) not in where:
            raise KeyError(f"the layer pair ({i}, {j}) is not kept: the metric was built for other `pairs`")
        centred = (
            moments[where[(min(i, j), max(i, j))]] - torch.outer(feature_sum[min(i, j)], feature_sum[max(i, j)]) / n
        )
        return centred if i <= j else centred.T

    return block


def _block_frobenius(blocks: Sequence[tuple[int, int]], feature_sum: Tensor, moments: Tensor, n: float) -> Tensor:
    """||C_ab||_F^2 (K,) of the centred blocks, one block at a time."""
    block = _centred_blocks(blocks, feature_sum, moments, n)
    return torch.stack([block(a, b).square().sum() for a, b in blocks])


def _block_matrix(blocks: Sequence[tuple[int, int]], values: Tensor, num_layers: int) -> Tensor:
    """(L, L) float64 with ``values`` (K,) at (a, b) and (b, a) of each block, NaN at the pairs not kept."""
    out = torch.full((num_layers, num_layers), float("nan"), dtype=_F64, device=values.device)
    rows, columns = _block_index(blocks, values.device)
    out[rows, columns] = values.to(_F64)
    out[columns, rows] = values.to(_F64)
    return out


def _block_cka_compute(
    blocks: Sequence[tuple[int, int]], feature_sum: Tensor, moments: Tensor, count: Union[Tensor, float]
) -> Tensor:
    """Linear CKA (L, L) at the kept pairs (both orders), NaN elsewhere; NaN for a constant layer."""
    n = float(count)
    frob = _block_frobenius(blocks, feature_sum, moments, n)
    rows, columns = _block_index(blocks, moments.device)
    diagonal = frob[: feature_sum.shape[0]]  # kept_blocks puts the diagonal first
    return _block_matrix(blocks, frob / torch.sqrt(diagonal[rows] * diagonal[columns]), feature_sum.shape[0])


def _block_debiased_cka_compute(
    blocks: Sequence[tuple[int, int]],
    feature_sum: Tensor,
    moments: Tensor,
    count: Union[Tensor, float],
    norm_products: Tensor,
    weighted_sums: Tensor,
) -> Tensor:
    """Debiased CKA (L, L) at the kept pairs (both orders), NaN elsewhere and for fewer than 4 samples."""
    n, layers = float(count), feature_sum.shape[0]
    if n < 4:
        return torch.full((layers, layers), float("nan"), dtype=_F64, device=moments.device)
    total = torch.tensor(n, dtype=_F64, device=moments.device)
    mean = -feature_sum / n
    _, q, _ = _recentred_blocks(blocks, total, feature_sum, moments, mean, norm_products, weighted_sums, False)
    assert q is not None
    frob = _block_frobenius(blocks, feature_sum, moments, n)
    rows, columns = _block_index(blocks, moments.device)
    trace = torch.stack([_centred_blocks(blocks, feature_sum, moments, n)(a, a).trace() for a in range(layers)])
    hsic = frob - n / (n - 2) * q + trace[rows] * trace[columns] / ((n - 1) * (n - 2))
    hsic = hsic / (n * (n - 3))
    diagonal = hsic[:layers]
    return _block_matrix(blocks, hsic / torch.sqrt(diagonal[rows] * diagonal[columns]), layers)


def cross_model_measures(
    states: dict[str, Tensor],
    measures: Sequence[str],
    svcca_variance: float = 0.99,
    alpha: float = 0.5,
    spectrum: str = "singular",
) -> dict[str, Tensor]:
    """The pair measures (L_A, L_B) and each model's ``effective_rank_a``/``_b`` from ``CrossModelCKA``'s sums.

    A ``cross`` of shape (L, d_A, d_B) (``pairs="diagonal"``) gives the pairs (i, i) only, the others NaN.
    """
    check_options(svcca_variance, alpha, spectrum)
    n = float(states["count"])
    sum_a, sum_b = states["sum_a"].to(_F64), states["sum_b"].to(_F64)

    def spectra(moments: Tensor, sums: Tensor) -> list[LayerSpectrum]:
        return [layer_spectrum(moment - torch.outer(total, total) / n) for moment, total in zip(moments, sums)]

    spectra_a, spectra_b = spectra(states["self_a"], sum_a), spectra(states["self_b"], sum_b)
    cross, dim_a, dim_b = states["cross"], sum_a.shape[1], sum_b.shape[1]
    diagonal = cross.dim() == 3

    def block(i: int, j: int) -> Tensor:
        raw = cross[i] if diagonal else cross[i * dim_a : (i + 1) * dim_a, j * dim_b : (j + 1) * dim_b]
        return raw - torch.outer(sum_a[i], sum_b[j]) / n

    pairs = [(i, i) for i in range(len(spectra_a))] if diagonal else None
    values = pair_measures(spectra_a, spectra_b, block, measures, pairs, svcca_variance, alpha)
    out = {name: value.to(cross.device) for name, value in values.items()}
    if "effective_rank" in measures:
        for side, layers in (("a", spectra_a), ("b", spectra_b)):
            ranks = [effective_rank_of(layer, spectrum) for layer in layers]
            out[f"effective_rank_{side}"] = torch.tensor(ranks, dtype=_F64, device=cross.device)
    return out


def similarity_measures(
    features: Tensor,
    measures: Sequence[str] = MEASURES,
    svcca_variance: float = 0.99,
    alpha: float = 0.5,
    spectrum: str = "singular",
) -> dict[str, Tensor]:
    """Every measure of ``measures`` between the layers of one set of (L, N, d) features (see the module)."""
    _check_features(features, None)
    measures = check_measures(measures)
    x = features.to(_F64)
    x = x - x.mean(dim=1, keepdim=True)
    layers, n, dim = x.shape
    z = x.transpose(0, 1).reshape(n, layers * dim)
    feature_sum, cross = x.sum(dim=1), z.T @ z
    out = second_moment_measures(feature_sum, cross, n, measures, svcca_variance, alpha, spectrum)
    if "debiased_cka" in measures:
        out["debiased_cka"] = debiased_cka(features)
    return {name: out[name] for name in measures}
