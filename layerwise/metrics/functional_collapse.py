"""Pure tensor functions of class structure and depth: neural collapse (NC1, CDNV, NC2-NC4) and effective depth.

Shapes and conventions as in :mod:`layerwise.metrics.functional`: ``features`` (L, B, d), ``targets`` (B,); every
``_xxx_update`` returns additive float64 sufficient statistics of one batch, every ``_xxx_compute`` the metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import torch
from torch import Tensor

from layerwise.metrics.functional import _F64, _check_features, _check_index, _count


# ------------------------------------------------------------------------------------------------ neural collapse
def _nc1_update(
    features: Tensor, targets: Tensor, num_layers: int, dim: int, num_classes: int
) -> tuple[Tensor, Tensor, Tensor]:
    """NC1 statistics of one batch: class counts (K,), class sums (L, K, d), raw second moments (L, d, d)."""
    _check_features(features, num_layers, dim)
    _check_index(targets, features.shape[1], "targets")
    x = features.to(_F64)
    targets = targets.to(device=x.device, dtype=torch.long)
    counts = _count(targets, num_classes)
    class_sums = x.new_zeros(num_layers, num_classes, dim).index_add_(1, targets, x)
    return counts, class_sums, x.transpose(1, 2) @ x


_EIGH_RANGE = 1e-6  # eigenvalues of a Gram matrix above this fraction of its largest: accurate to ~1e-10 relative


def _left_singular(a: Tensor) -> tuple[Tensor, Tensor]:
    """Left singular vectors (L, d, r) and values (L, r), descending, of each (d, K) matrix of ``a`` (L, d, K).

    From ``eigh`` of the smaller Gram matrix (A A^T or A^T A) when every direction of the expected rank
    min(d, K - 1) (the columns are centred) is well determined, i.e. its eigenvalue is above ``_EIGH_RANGE`` times
    the largest: an eigenvalue of a float64 Gram matrix is off by about eps * lambda_max, so these are exact to
    ~1e-10 relative, and the structural null direction is dropped as the SVD's threshold drops it. Otherwise (a
    between-class spread of more than 1e3 in standard deviation, or fewer directions) the SVD itself. On a GPU
    ``eigh`` is the cheaper by far: 42 ms against 228 ms for 12 x (384 x 1000), an H100 (``svd`` there runs batched
    Jacobi rotations).
    """
    dim, k = a.shape[-2:]
    rank = min(dim, k - 1)
    if rank >= 1:
        small_side = a @ a.transpose(-1, -2) if dim <= k else a.transpose(-1, -2) @ a
        eigenvalues, vectors = torch.linalg.eigh(small_side)  # ascending
        eigenvalues, vectors = eigenvalues.flip(-1)[..., :rank], vectors.flip(-1)[..., :rank]
        if bool((eigenvalues[..., -1] > _EIGH_RANGE * eigenvalues[..., 0]).all()):
            s = eigenvalues.sqrt()
            return (vectors if dim <= k else (a @ vectors) / s.unsqueeze(-2)), s
    u, s, _ = torch.linalg.svd(a, full_matrices=False)
    return u, s


def _nc1_by_cholesky(centred: Tensor, within: Tensor) -> Optional[Tensor]:
    """sum_j u_j^T W u_j / s_j^2 = tr(W G^-1), G = A A^T (L, d, d), when every G is surely well conditioned, else None.

    With more classes than dimensions G has full rank and the SVD's threshold drops nothing, so NC1 is the trace
    with the plain inverse, which a Cholesky factor gives at a fraction of the cost of ``eigh`` (on an H100, 12 x
    384 x 384: ~80 ms of the epoch's end for ``eigh``, whose cuSOLVER path waits on the host per matrix). It is used
    only when cond(G) <= ||G||_F ||G^-1||_F (a sure bound: each norm is at least the extreme eigenvalue) is below
    1 / ``_EIGH_RANGE``, where the inverse is exact to about 1e-10 relative; otherwise the caller takes the
    ``eigh``/SVD path, which handles ill-conditioned and rank-deficient spreads.
    """
    gram = centred.transpose(1, 2) @ centred
    factor, info = torch.linalg.cholesky_ex(gram)
    inverse = torch.cholesky_inverse(factor)
    bound = torch.linalg.matrix_norm(gram) * torch.linalg.matrix_norm(inverse)
    if not bool(((info == 0) & (bound < 1.0 / _EIGH_RANGE)).all()):  # NaN bounds (a failed factor) fail too
        return None
    return (within * inverse).sum(dim=(-2, -1))


def _nc1_compute(class_counts: Tensor, class_sums: Tensor, second_moment: Tensor) -> Tensor:
    """NC1 (L,) = (1/K) tr(Sigma_W Sigma_B^+) over the K classes present; NaN with fewer than 2 distinct means.

    Sigma_W = (M - sum_k n_k mu_k mu_k^T) / N. Sigma_B = A A^T / K with A the (d, K) centred class means, so the
    pseudo-inverse comes from the SVD A = U S V^T: NC1 = sum_j u_j^T Sigma_W u_j / s_j^2 over s_j above
    max(d, K) * eps * s_max. A is centred twice: the second pass removes the rounding residue of the first,
    which for features with a large common mean would otherwise leave a spurious singular value in the null
    direction of Sigma_B (rank <= K - 1) and be inverted. U and S come from :func:`_left_singular`; with more
    classes than dimensions and a well-conditioned spread the same sum is the trace by a Cholesky factor
    (:func:`_nc1_by_cholesky`).
    """
    num_layers, _, dim = class_sums.shape
    present = class_counts > 0
    counts = class_counts[present]
    num_present = counts.numel()
    if num_present < 2:
        return torch.full((num_layers,), float("nan"), dtype=_F64, device=class_sums.device)
    sums = class_sums[:, present]
    means = sums / counts.view(1, -1, 1)
    within = (second_moment - torch.einsum("lkd,lke->lde", sums, means)) / counts.sum()
    centred = means - means.mean(dim=1, keepdim=True)
    centred = centred - centred.mean(dim=1, keepdim=True)
    finite = centred.isfinite().all(dim=(1, 2)) & within.isfinite().all(dim=(1, 2))  # inf features: NaN, no SVD error
    centred, within = centred.nan_to_num(0.0, 0.0, 0.0), within.nan_to_num(0.0, 0.0, 0.0)
    if dim < num_present:  # Sigma_B of full rank d: tr(Sigma_W Sigma_B^-1) by Cholesky, when surely well conditioned
        nc1 = _nc1_by_cholesky(centred, within)
        if nc1 is not None:
            return torch.where(finite, nc1, float("nan"))
    u, s = _left_singular(centred.transpose(1, 2))  # u (L, d, r), s (L, r)
    keep = s > max(dim, num_present) * torch.finfo(_F64).eps * s[:, :1]
    projected = torch.einsum("ldj,lde,lej->lj", u, within, u)
    nc1 = torch.where(keep, projected / s.square().clamp_min(torch.finfo(_F64).tiny), 0.0).sum(dim=1)
    return torch.where((s[:, 0] > 0) & finite, nc1, float("nan"))


def nc1(features: Tensor, targets: Tensor, num_classes: int) -> Tensor:
    """NC1 within-class variability collapse (Papyan et al., 2020) of every layer of one set of features.

    Args:
        features: (L, N, d) features.
        targets: (N,) class indices in [0, num_classes).
        num_classes: number of classes; classes absent from ``targets`` are excluded.

    Returns:
        (L,) float64 tensor.
    """
    _check_features(features, None)
    num_layers, _, dim = features.shape
    x = features.to(_F64)
    return _nc1_compute(*_nc1_update(x - x.mean(dim=1, keepdim=True), targets, num_layers, dim, num_classes))


# ------------------------------------------------------------------------------------ neural collapse NC1-NC4
def _class_square_update(features: Tensor, targets: Tensor, num_classes: int) -> Tensor:
    """Per-class sum of squared norms (L, K) of one batch (features (L, B, d), any shift already taken off)."""
    x = features.to(_F64)
    targets = targets.to(device=x.device, dtype=torch.long)
    return x.new_zeros(x.shape[0], num_classes).index_add_(1, targets, x.square().sum(dim=-1))


def _class_sum_update(features: Tensor, targets: Tensor, num_classes: int) -> Tensor:
    """Per-class sums (L, K, d') of one batch of features (L, B, d'), float64."""
    x = features.to(_F64)
    targets = targets.to(device=x.device, dtype=torch.long)
    return x.new_zeros(x.shape[0], num_classes, x.shape[2]).index_add_(1, targets, x)


def _present_means(class_counts: Tensor, class_sums: Tensor) -> tuple[Tensor, Tensor]:
    """Class means (L, K', d) of the K' classes present, and the boolean (K,) mask of those classes."""
    present = class_counts > 0
    return class_sums[:, present] / class_counts[present].view(1, -1, 1), present


def _centred(means: Tensor) -> Tensor:
    """Class means minus their mean (mu_G, the mean of the class means, as NC1's Sigma_B), centred twice."""
    centred = means - means.mean(dim=1, keepdim=True)
    return centred - centred.mean(dim=1, keepdim=True)


def _unit_rows(rows: Tensor) -> Tensor:
    """Rows divided by their norms (a zero row stays zero)."""
    return rows / rows.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(rows.dtype).tiny)


def _off_diagonal(square: Tensor) -> Tensor:
    """The off-diagonal entries (L, K(K-1)) of square matrices (L, K, K), row by row."""
    k = square.shape[-1]
    mask = ~torch.eye(k, dtype=torch.bool, device=square.device)
    return square[:, mask]


def _etf_distance(gram: Tensor) -> Tensor:
    """||G/||G||_F - (I - 11^T/K)/||I - 11^T/K||_F||_F per layer for Gram matrices G (L, K, K) (K >= 2)."""
    k = gram.shape[-1]
    etf = torch.eye(k, dtype=_F64, device=gram.device) - 1.0 / k
    etf = etf / etf.norm()
    scaled = gram / torch.linalg.matrix_norm(gram).clamp_min(torch.finfo(_F64).tiny).view(-1, 1, 1)
    return torch.linalg.matrix_norm(scaled - etf)


def _cdnv_compute(class_counts: Tensor, class_sums: Tensor, class_squares: Tensor) -> Tensor:
    """CDNV (L,): mean over ordered pairs c != c' of (s_c^2 + s_c'^2) / (2 ||mu_c - mu_c'||^2), classes present.

    s_c^2 = sum_{i in c} ||x_i||^2 / n_c - ||mu_c||^2, the mean squared distance of class c's features to its mean
    (clamped at 0 against rounding; the sums are of shifted features, which changes neither s_c nor the distances).
    NaN with fewer than two classes.
    """
    means, present = _present_means(class_counts, class_sums)
    num_layers, k = means.shape[:2]
    if k < 2:
        return torch.full((num_layers,), float("nan"), dtype=_F64, device=class_sums.device)
    variances = (class_squares[:, present] / class_counts[present] - means.square().sum(dim=-1)).clamp_min(0.0)
    gram = means @ means.transpose(1, 2)  # the exact form: ||a||^2 + ||b||^2 - 2 a.b on float64 means
    squares = gram.diagonal(dim1=1, dim2=2)
    distances = (squares.unsqueeze(2) + squares.unsqueeze(1) - 2 * gram).clamp_min(0.0)
    pairs = (variances.unsqueeze(2) + variances.unsqueeze(1)) / (2 * distances)
    return _off_diagonal(pairs).mean(dim=1)


def _nc2_compute(class_counts: Tensor, class_sums: Tensor) -> dict[str, Tensor]:
    """NC2 (each (L,)) of the centred class means M_c = mu_c - mu_G over the K classes present.

    ``equinorm``: std/mean of ||M_c|| (sample std, K - 1, as Papyan et al.'s ``torch.std``); ``cos_std``: the
    (population) std of the K(K-1)/2 pairwise cosines of the M_c; ``equiangular``: mean over pairs of
    |cos + 1/(K-1)|; ``etf``: ||M M^T/||M M^T||_F - (I - 11^T/K)/||I - 11^T/K||_F||_F (the simplex-ETF error,
    Kothapalli 2023). NaN with fewer than two classes.
    """
    means, _ = _present_means(class_counts, class_sums)
    num_layers, k = means.shape[:2]
    nan = torch.full((num_layers,), float("nan"), dtype=_F64, device=class_sums.device)
    if k < 2:
        return {"equinorm": nan, "cos_std": nan, "equiangular": nan, "etf": nan}
    centred = _centred(means)
    norms = centred.norm(dim=-1)  # (L, K)
    unit = _unit_rows(centred)
    cosines = _off_diagonal(unit @ unit.transpose(1, 2))  # (L, K(K-1)): each pair twice, the same moments
    return {
        "equinorm": norms.std(dim=1, correction=1) / norms.mean(dim=1),
        "cos_std": cosines.std(dim=1, correction=0),
        "equiangular": (cosines + 1.0 / (k - 1)).abs().mean(dim=1),
        "etf": _etf_distance(centred @ centred.transpose(1, 2)),
    }


def _nc3_compute(class_counts: Tensor, class_sums: Tensor, weight: Tensor) -> dict[str, Tensor]:
    """NC3 (each (L,)) between the centred class means of the head's input and the rows W_c of its last linear layer.

    ``distance``: mean over the classes present of ||W_c/||W_c|| - M_c/||M_c|||| (the neural-collapse package's
    ``distance_norms``); ``duality``: ||W M^T/||W M^T||_F - (I - 11^T/K)/||I - 11^T/K||_F||_F (its
    ``self_duality_error``, Kothapalli 2023). ``weight`` (K, d'), its rows in the order of the classes.
    """
    means, present = _present_means(class_counts, class_sums)
    num_layers, k = means.shape[:2]
    if k < 2:
        nan = torch.full((num_layers,), float("nan"), dtype=_F64, device=class_sums.device)
        return {"distance": nan, "duality": nan}
    centred = _centred(means)
    rows = weight.to(device=centred.device, dtype=_F64)[present]  # (K', d')
    distance = (_unit_rows(rows).unsqueeze(0) - _unit_rows(centred)).norm(dim=-1).mean(dim=1)
    return {"distance": distance, "duality": _etf_distance(rows @ centred.transpose(1, 2))}


def _ncc_update(
    features: Tensor, targets: Tensor, predictions: Tensor, class_counts: Tensor, class_sums: Tensor
) -> tuple[Tensor, Tensor]:
    """Nearest-class-centre counts (L,) of one batch: agreements with ``predictions`` (L, B) and correct ones.

    The NCC picks argmin_c ||x - mu_c||^2 = argmax_c (mu_c . x - ||mu_c||^2 / 2) over the classes present (ties to
    the lowest class), in float64; ``features`` and ``class_sums`` around the same shift (it cancels).
    """
    means, present = _present_means(class_counts, class_sums)
    classes = torch.nonzero(present).flatten()
    x = features.to(_F64)
    scores = x @ means.transpose(1, 2) - 0.5 * means.square().sum(dim=-1).unsqueeze(1)  # (L, B, K')
    nearest = classes[scores.argmax(dim=-1)]  # (L, B)
    agree = (nearest == predictions.to(nearest.device)).sum(dim=1).to(_F64)
    correct = (nearest == targets.to(nearest.device).view(1, -1)).sum(dim=1).to(_F64)
    return agree, correct


def neural_collapse_measures(
    features: Tensor,
    targets: Tensor,
    num_classes: int,
    predictions: Optional[Tensor] = None,
    head_inputs: Optional[Tensor] = None,
    weight: Optional[Tensor] = None,
) -> dict[str, Tensor]:
    """Every neural-collapse measure of every layer of one set of features (Papyan, Han & Donoho, 2020).

    Args:
        features: (L, N, d) features (NC1, CDNV, NC2, NC4).
        targets: (N,) class indices in [0, num_classes); absent classes are left out of K.
        num_classes: number of classes.
        predictions: (L, N) the head's prediction at every layer, for NC4 (agreement with the NCC).
        head_inputs: (L, N, d') the features the head's last linear layer reads, for NC3.
        weight: (num_classes, d') the weight of that layer, for NC3.

    Returns:
        ``nc1``, ``cdnv``, ``nc2_equinorm``, ``nc2_cos_std``, ``nc2_equiangular``, ``nc2_etf``; ``nc3``,
        ``nc3_duality`` with ``head_inputs``; ``nc4_agreement`` and ``nc4_ncc_accuracy`` (fractions of N) with
        ``predictions``; each (L,) float64.
    """
    _check_features(features, None)
    num_layers, rows, dim = features.shape
    x = features.to(_F64)
    x = x - x.mean(dim=1, keepdim=True)
    counts, class_sums, second_moment = _nc1_update(x, targets, num_layers, dim, num_classes)
    squares = _class_square_update(x, targets, num_classes)
    nc2 = _nc2_compute(counts, class_sums)
    result = {
        "nc1": _nc1_compute(counts, class_sums, second_moment),
        "cdnv": _cdnv_compute(counts, class_sums, squares),
        **{f"nc2_{name}": value for name, value in nc2.items()},
    }
    if head_inputs is not None:
        if weight is None:
            raise ValueError("`head_inputs` needs `weight`, the head's last linear layer (num_classes, d').")
        _check_features(head_inputs, num_layers, name="head_inputs")
        nc3 = _nc3_compute(counts, _class_sum_update(head_inputs, targets, num_classes), weight)
        result.update(nc3=nc3["distance"], nc3_duality=nc3["duality"])
    if predictions is not None:
        agree, correct = _ncc_update(x, targets, predictions, counts, class_sums)
        result.update(nc4_agreement=agree / rows, nc4_ncc_accuracy=correct / rows)
    return result


# ------------------------------------------------------------------------------------------------ effective depth
def effective_depth(
    accuracy: Union[Tensor, Sequence[float]],
    epsilons: Sequence[float],
    layer_numbers: Optional[Sequence[int]] = None,
    relative: bool = False,
) -> dict[str, int]:
    """Smallest layer number whose accuracy is within epsilon of perfect (or of the last layer).

    Args:
        accuracy: (L,) per-layer accuracy in [0, 1].
        epsilons: tolerances; one result per epsilon.
        layer_numbers: 1-based layer number of every entry (default 1..L).
        relative: compare with the last layer's accuracy (Acc >= Acc_last - eps) instead of with 1 (Acc >= 1 - eps).

    Returns:
        ``{str(eps): layer number}``, e.g. ``{"0.01": 7}``; the last layer number when no layer qualifies
        (including NaN accuracies).
    """
    acc = torch.as_tensor(accuracy, dtype=_F64).detach().cpu()
    if acc.ndim != 1 or acc.numel() == 0:
        raise ValueError(f"Expected `accuracy` of shape (L,) with L >= 1, got {tuple(acc.shape)}.")
    numbers = list(range(1, acc.numel() + 1)) if layer_numbers is None else [int(n) for n in layer_numbers]
    if len(numbers) != acc.numel():
        raise ValueError(f"Expected {acc.numel()} `layer_numbers`, got {len(numbers)}.")
    result = {}
    for eps in epsilons:
        target = (acc[-1] - eps) if relative else (1.0 - eps)
        reached = torch.nonzero(acc >= target).flatten()
        result[str(eps)] = numbers[int(reached[0])] if reached.numel() else numbers[-1]
    return result


def effective_depth_reached(
    accuracy: Union[Tensor, Sequence[float]], epsilons: Sequence[float], relative: bool = False
) -> dict[str, bool]:
    """Whether any layer reaches the accuracy :func:`effective_depth` asks for, per epsilon.

    Where none does, :func:`effective_depth` gives the last layer (the paper's convention); this says so, so that the
    last layer is never shown as if it reached ``1 - eps``.

    Returns:
        ``{str(eps): bool}``, e.g. ``{"0.01": False, "0.1": True}``.
    """
    acc = torch.as_tensor(accuracy, dtype=_F64).detach().cpu()
    if acc.ndim != 1 or acc.numel() == 0:
        raise ValueError(f"Expected `accuracy` of shape (L,) with L >= 1, got {tuple(acc.shape)}.")
    return {str(eps): bool((acc >= ((acc[-1] - eps) if relative else (1.0 - eps))).any()) for eps in epsilons}
