"""Pure tensor functions of feature similarity across layers: COS, the COS of saturated samples, CKA.

Cosine similarity (COS), the COS of the samples saturated at each layer, exact linear CKA and minibatch CKA.

Shapes and conventions as in :mod:`layerwise.metrics.functional`: ``features`` (L, B, d); every ``_xxx_update``
returns additive float64 sufficient statistics of one batch, every ``_xxx_compute`` the metric from their sums.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor

from layerwise.metrics.functional import _F64, _check_features, _check_index
from layerwise.metrics.functional_distribution import _histogram_update


# --------------------------------------------------------------------------------------------- cosine similarity
def _unit(x: Tensor) -> Tensor:
    """Normalise the last dimension of a float64 tensor to unit norm; zero vectors stay zero (cosine 0)."""
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(torch.finfo(_F64).tiny)


def _feature_sum_update(features: Tensor, num_layers: int, dim: Optional[int] = None) -> tuple[Tensor, int]:
    """Per-layer float64 sum (L, d) of the batch and its size, the statistics of the per-layer mean."""
    _check_features(features, num_layers, dim)
    return features.to(_F64).sum(dim=1), features.shape[1]


def _cosine_update(features: Tensor, num_layers: int, center: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    """Sum over the batch of cos(h_i^a - c^a, h_i^b - c^b) for all layer pairs (L, L), and how many samples count.

    ``center`` (L, d) is subtracted first when given (centered COS); ``None`` gives the uncentered variant. A
    sample whose vector is exactly zero at a layer (it sits on the center) has no direction: it is left out of
    every pair with that layer, so ``count[a, b]`` is the number of samples with a direction at both a and b.
    """
    _check_features(features, num_layers, None if center is None else center.shape[-1])
    x = features.to(_F64)
    if center is not None:
        x = x - center.to(device=x.device, dtype=_F64).unsqueeze(1)
    unit = _unit(x)
    has_direction = unit.abs().amax(dim=-1).gt(0).to(_F64)  # (L, B)
    return torch.einsum("lbd,mbd->lm", unit, unit), has_direction @ has_direction.T


def _cosine_distribution_update(
    features: Tensor, num_layers: int, bins: int, center: Optional[Tensor] = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``_cosine_update`` plus the distribution of the per-sample cosines, in one pass.

    Returns the cosine sum and count (L, L), the histogram (L, L, bins) of cos(h_i^a - c^a, h_i^b - c^b) on
    [-1, 1] over the samples with a direction at both layers, and how many of those cosines are negative (L, L).
    """
    _check_features(features, num_layers, None if center is None else center.shape[-1])
    x = features.to(_F64)
    if center is not None:
        x = x - center.to(device=x.device, dtype=_F64).unsqueeze(1)
    unit = _unit(x)
    has_direction = unit.abs().amax(dim=-1).gt(0)  # (L, B)
    cosines = torch.einsum("lbd,mbd->lmb", unit, unit)  # (L, L, B)
    valid = has_direction.unsqueeze(1) & has_direction.unsqueeze(0)
    histogram = _histogram_update(cosines, valid, -1.0, 1.0, bins)
    negative = (valid & (cosines < 0)).sum(-1).to(_F64)
    return cosines.sum(-1), valid.sum(-1).to(_F64), histogram, negative


def _cosine_compute(cos_sum: Tensor, count: Tensor) -> Tensor:
    """Mean cosine (L, L) from the summed cosines; NaN where no sample has a direction at both layers."""
    return torch.where(count > 0, cos_sum / count.clamp_min(1), torch.full_like(cos_sum, float("nan")))


def layer_cosine_similarity(features: Tensor, center: bool = True) -> Tensor:
    """COS matrix of one set of features: C[a, b] = mean_i cos(h_i^a - mu^a, h_i^b - mu^b).

    Args:
        features: (L, N, d) features of N samples at L layers.
        center: subtract the per-layer mean mu^l over the N samples first; ``False`` gives the uncentered COS.

    Returns:
        (L, L) float64 tensor; NaN for a pair where no sample has a direction (a constant layer when centred).
    """
    _check_features(features, None)
    mean = features.to(_F64).mean(dim=1) if center else None
    return _cosine_compute(*_cosine_update(features, features.shape[0], center=mean))


def _saturation_pairs(features: Tensor, saturation: Tensor, num_layers: int) -> tuple[Tensor, Tensor]:
    """Gather h_i^{s_i} and h_i^{L}: the (B, d) feature of every sample at its saturation layer and at the last."""
    _check_features(features, num_layers)
    _check_index(saturation, features.shape[1], "saturation")
    index = saturation.to(device=features.device, dtype=torch.long).view(1, -1, 1).expand(1, -1, features.shape[2])
    return features.gather(0, index).squeeze(0), features[-1]


def _saturation_cosine_update(
    selected: Tensor, last: Tensor, saturation: Tensor, num_layers: int, center: Optional[Tensor] = None
) -> tuple[Tensor, Tensor]:
    """Per saturation layer l: sum of cos(h^l - mu^l, h^L - mu^L) over samples saturating at l (L,), and their count.

    Samples with a zero vector at l or at L (no direction) are left out of both.

    Args:
        selected: (B, d) feature of every sample at its own saturation layer.
        last: (B, d) feature of every sample at the last layer.
        saturation: (B,) 0-based saturation layer of every sample.
        num_layers: L.
        center: optional (L, d) per-layer center mu (``None``: uncentered).
    """
    saturation = saturation.to(device=selected.device, dtype=torch.long)
    x, y = selected.to(_F64), last.to(_F64)
    if center is not None:
        center = center.to(device=x.device, dtype=_F64)
        x, y = x - center[saturation], y - center[-1]
    ux, uy = _unit(x), _unit(y)
    cos = (ux * uy).sum(dim=-1)
    has_direction = (ux.abs().amax(dim=-1).gt(0) & uy.abs().amax(dim=-1).gt(0)).to(_F64)
    cos_sum = torch.zeros(num_layers, dtype=_F64, device=x.device).index_add_(0, saturation, cos)
    count = torch.zeros(num_layers, dtype=_F64, device=x.device).index_add_(0, saturation, has_direction)
    return cos_sum, count


def _saturation_cosine_compute(cos_sum: Tensor, count: Tensor) -> Tensor:
    """Mean cosine per saturation layer (L,); NaN where no sample saturates (with a direction at l and L)."""
    return torch.where(count > 0, cos_sum / count.clamp_min(1), torch.full_like(cos_sum, float("nan")))


def saturation_cosine(features: Tensor, saturation: Tensor, center: bool = True) -> Tensor:
    """Per saturation layer l: mean over samples saturating at l of cos(h^l - mu^l, h^L - mu^L).

    Args:
        features: (L, N, d) features.
        saturation: (N,) 0-based saturation layer of every sample (see ``saturation_layers``).
        center: subtract the per-layer mean mu^l over all N samples first.

    Returns:
        (L,) float64 tensor, NaN where no sample saturates at that layer.
    """
    _check_features(features, None)
    num_layers = features.shape[0]
    selected, last = _saturation_pairs(features, saturation, num_layers)
    mean = features.to(_F64).mean(dim=1) if center else None
    return _saturation_cosine_compute(*_saturation_cosine_update(selected, last, saturation, num_layers, mean))


# ------------------------------------------------------------------------------------------------------- exact CKA
def _linear_cka_update(
    features: Tensor, num_layers: int, dim: int, cross: Optional[Tensor] = None
) -> tuple[Tensor, Tensor, int]:
    """Sufficient statistics of exact linear CKA for one batch: per-layer sums (L, d), Z^T Z (Ld, Ld), batch size.

    Z = [h^1 ... h^L] (B, L*d) stacks the layers of every sample, so a single float64 matmul gives all cross-moments.
    If ``cross`` (a float64 (Ld, Ld) state) is given, Z^T Z is added to it in place and it is returned, which
    avoids a transient (L*d)^2 buffer per batch.
    """
    _check_features(features, num_layers, dim)
    x = features.to(_F64)
    z = x.transpose(0, 1).reshape(x.shape[1], num_layers * dim)
    cross = z.T @ z if cross is None else cross.addmm_(z.T, z)
    return x.sum(dim=1), cross, features.shape[1]


def _recentred_moments(
    states: dict[str, Tensor], delta: Tensor, count: str, sums: str, cross: str
) -> dict[str, Tensor]:
    """First and second moments around ``c - delta`` instead of ``c``: exact re-expression of shifted sums.

    With x = h - c and x' = h - c' = x + delta: sum x' = sum x + n delta and
    sum x' x'^T = sum x x^T + m delta^T + delta m^T + n delta delta^T (m = sum x), per layer (``cross`` (L, d, d))
    or over the stacked layers (``cross`` (L*d, L*d)). ``sums`` is (L, d), or (L, K, d) per class with ``count``
    (K,) class counts. Returns new tensors for the three states.
    """
    n, m, s = states[count], states[sums], states[cross]
    delta = delta.to(device=m.device, dtype=_F64)
    if m.dim() == 3:  # per class (NC1): class sums move by n_k delta, the second moment by the total
        new_sums = m + n.view(1, -1, 1) * delta.unsqueeze(1)
        m, n = m.sum(dim=1), n.sum()
    else:
        new_sums = m + n * delta
    if s.dim() == 3:
        outer = torch.einsum("ld,le->lde", m, delta)
        new_cross = s + outer + outer.transpose(1, 2) + n * torch.einsum("ld,le->lde", delta, delta)
    else:
        flat_m, flat_delta = m.reshape(-1), delta.reshape(-1)
        outer = torch.outer(flat_m, flat_delta)
        new_cross = s + outer + outer.T + n * torch.outer(flat_delta, flat_delta)
    return {count: states[count], sums: new_sums, cross: new_cross}


def _linear_cka_compute(feature_sum: Tensor, cross: Tensor, count: Union[Tensor, int]) -> Tensor:
    """Linear CKA (L, L) from the summed statistics.

    K = S - n mu mu^T is the centred cross-covariance (times n); F[a, b] = ||K_ab||_F^2 for the (d, d) blocks and
    CKA = F / sqrt(diag F diag F^T). Blocks are formed one block-row at a time (peak extra memory d * L*d floats).
    NaN for a layer whose features are constant.
    """
    num_layers, dim = feature_sum.shape
    mean = feature_sum.reshape(-1) / count
    frob = torch.empty(num_layers, num_layers, dtype=_F64, device=cross.device)
    for a in range(num_layers):
        rows = slice(a * dim, (a + 1) * dim)
        block_row = cross[rows] - count * torch.outer(mean[rows], mean)
        frob[a] = block_row.reshape(dim, num_layers, dim).square().sum(dim=(0, 2))
    frob = (frob + frob.T) / 2
    diag = frob.diagonal()
    return frob / torch.sqrt(torch.outer(diag, diag))


def linear_cka(features: Tensor) -> Tensor:
    """Exact linear CKA (Kornblith et al., 2019) between all pairs of layers of one set of features.

    Args:
        features: (L, N, d) features.

    Returns:
        (L, L) float64 tensor, CKA(a, b) = ||X_a^T X_b||_F^2 / (||X_a^T X_a||_F ||X_b^T X_b||_F), X column-centred.
    """
    _check_features(features, None)
    num_layers, _, dim = features.shape
    x = features.to(_F64)
    feature_sum, cross, count = _linear_cka_update(x - x.mean(dim=1, keepdim=True), num_layers, dim)
    return _linear_cka_compute(feature_sum, cross, count)


# --------------------------------------------------------------------------------------------- minibatch CKA
def _minibatch_hsic_update(features: Tensor, num_layers: int) -> Tensor:
    """Unbiased HSIC_1 of the linear Grams of one minibatch for all layer pairs (L, L); needs n >= 4 samples.

    HSIC_1(K, L) = [tr(K~L~) + 1'K~1 1'L~1 / ((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n(n-3)), K~ = K with zero diagonal
    (Song et al., 2012; Nguyen et al., 2021). The estimator is exactly invariant to a shift of the features, so
    every layer is centred on its batch mean before the Gram purely for numerical accuracy (an uncentred Gram of
    features with |mean| >> std loses most of its digits).
    """
    _check_features(features, num_layers)
    n = features.shape[1]
    if n < 4:
        raise ValueError(f"The unbiased HSIC needs at least 4 samples per batch, got a batch of {n}.")
    x = features.to(_F64)
    x = x - x.mean(dim=1, keepdim=True)
    gram = x @ x.transpose(1, 2)
    gram.diagonal(dim1=1, dim2=2).zero_()
    flat = gram.reshape(num_layers, n * n)
    trace = flat @ flat.T  # tr(K~_a K~_b) = sum(K~_a * K~_b), the Grams being symmetric
    row = gram.sum(dim=2)
    total = row.sum(dim=1)
    return (trace + torch.outer(total, total) / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * (row @ row.T)) / (n * (n - 3))


def _minibatch_cka_compute(hsic_sum: Tensor) -> Tensor:
    """CKA (L, L) = S_ab / sqrt(S_aa S_bb) from the HSIC summed over minibatches (NaN if a diagonal is <= 0)."""
    diag = hsic_sum.diagonal()
    return hsic_sum / torch.sqrt(torch.outer(diag, diag))
