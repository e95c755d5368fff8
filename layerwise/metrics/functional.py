"""Pure tensor functions behind the layer-wise metrics.

Shapes: ``features`` (L, B, d) — L layers, B samples, width d, any float dtype; ``logits`` (L, B, C) — the
model's own classifier applied at every layer; ``targets`` (B,) integer class indices in [0, C). Layers are
indexed 0..L-1 in tensors; reported layer *numbers* are 1-based.

Every ``_xxx_update`` returns additive sufficient statistics of one batch (float64, so several batches and
several processes are merged by summation) and every ``_xxx_compute`` turns the summed statistics into the
metric. Inputs are cast to float64 *before* any product, so no statistic goes through a TF32 or bf16 matmul.
The public helpers (``layer_cosine_similarity``, ``linear_cka``, ...) apply the pair to a single tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, Optional, Union

import torch
from torch import Tensor

from layerwise.metrics.functional_distribution import _histogram_update

_F64 = torch.float64


# ----------------------------------------------------------------------------------------------------- validation
def _check_features(
    features: Tensor, num_layers: Optional[int], dim: Optional[int] = None, name: str = "features"
) -> None:
    """Raise a ValueError unless ``features`` is a floating (num_layers, B, dim) tensor (``None``: any size)."""
    if (
        features.ndim != 3
        or (num_layers is not None and features.shape[0] != num_layers)
        or (dim is not None and features.shape[2] != dim)
    ):
        expected = f"({'L' if num_layers is None else num_layers}, B, {'d' if dim is None else dim})"
        raise ValueError(f"Expected `{name}` of shape {expected} (layers, batch, width), got {tuple(features.shape)}.")
    if not features.is_floating_point():
        raise ValueError(f"Expected `{name}` to be a floating-point tensor, got dtype {features.dtype}.")


def _check_logits(logits: Tensor, num_layers: Optional[int]) -> None:
    """Raise a ValueError unless ``logits`` is a floating (num_layers, B, C) tensor."""
    _check_features(logits, num_layers, name="logits")


def _check_index(index: Tensor, batch_size: int, name: str) -> None:
    """Raise a ValueError unless ``index`` is an integer tensor of shape (batch_size,)."""
    if index.shape != (batch_size,):
        raise ValueError(f"Expected `{name}` of shape ({batch_size},) to match the batch, got {tuple(index.shape)}.")
    if index.is_floating_point() or index.is_complex() or index.dtype == torch.bool:
        raise ValueError(f"Expected `{name}` to be an integer tensor, got dtype {index.dtype}.")


# --------------------------------------------------------------------------------------------- cosine similarity
def _count(index: Tensor, size: int) -> Tensor:
    """Float64 histogram (size,) of a long index tensor, without the host sync of ``torch.bincount`` on CUDA."""
    return torch.zeros(size, dtype=_F64, device=index.device).index_add_(0, index, torch.ones_like(index, dtype=_F64))


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


# ---------------------------------------------------------------------------------------- accuracy and saturation
class Readout(NamedTuple):
    """What the classifier reads out of every layer, per sample: all a prediction metric needs, without logits.

    ``predictions`` (L, B) long argmax (ties to the lowest index), ``max_prob`` (L, B) float64 top-1 softmax
    probability, ``nll`` (L, B) float64 cross-entropy of the target (None without targets), ``entropy`` (L, B)
    float64 softmax entropy in nats (only where asked for: early exit's entropy criterion).
    """

    predictions: Tensor
    max_prob: Tensor
    nll: Optional[Tensor]
    entropy: Optional[Tensor] = None


def group_logits(logits: Tensor, groups: Sequence[Sequence[int]], how: str = "max") -> Tensor:
    """Logits (..., C) over a model's classes -> (..., G) over the data's, one per group of model classes.

    ``how="max"``: a group's best logit, so the argmax over groups is the group of the argmax over classes (HANS's
    rule for MNLI models); ``"logsumexp"``: the log of the group's summed probability (up to the shared partition),
    so the cross-entropy is the grouped likelihood.
    """
    columns = [logits[..., list(group)] for group in groups]
    if how == "max":
        return torch.stack([column.max(dim=-1).values for column in columns], dim=-1)
    if how == "logsumexp":
        return torch.stack([torch.logsumexp(column, dim=-1) for column in columns], dim=-1)
    raise ValueError(f"`grouping={how!r}` must be 'max' or 'logsumexp'.")


def readout_rows(logits: Tensor, targets: Optional[Tensor]) -> tuple[Tensor, Tensor, Optional[Tensor]]:
    """Argmax, top-1 probability and target cross-entropy of logits (..., C), normalised in float64.

    The argmax is taken on the logits as given; the log-partition in float64. Memory: one float64 copy of ``logits``.
    """
    log_partition = torch.logsumexp(logits.to(_F64), dim=-1)
    top, predictions = logits.max(dim=-1)
    max_prob = torch.exp(top.to(_F64) - log_partition)
    if targets is None:
        return predictions, max_prob, None
    target_logit = logits.gather(-1, targets.to(device=logits.device, dtype=torch.long).unsqueeze(-1)).squeeze(-1)
    return predictions, max_prob, log_partition - target_logit.to(_F64)


def readout_from_logits(logits: Tensor, targets: Optional[Tensor] = None) -> Readout:
    """The :class:`Readout` of per-layer logits (L, B, C) with optional targets (B,)."""
    _check_logits(logits, None)
    if targets is not None:
        _check_index(targets, logits.shape[1], "targets")
        targets = targets.view(1, -1).expand(logits.shape[0], -1)
    return Readout(*readout_rows(logits, targets))


def _as_readout(scores: Union[Tensor, Readout], targets: Optional[Tensor], num_layers: int) -> Readout:
    """Accept per-layer logits (L, B, C) or an already computed :class:`Readout`; check shapes."""
    if isinstance(scores, Tensor):
        _check_logits(scores, num_layers)
        return readout_from_logits(scores, targets)
    if scores.predictions.ndim != 2 or scores.predictions.shape[0] != num_layers:
        shape = tuple(scores.predictions.shape)
        raise ValueError(f"Expected readout predictions of shape ({num_layers}, B), got {shape}.")
    if targets is not None:
        _check_index(targets, scores.predictions.shape[1], "targets")
    return scores


def _layer_accuracy_update(
    scores: Union[Tensor, Readout], targets: Tensor, num_layers: int
) -> tuple[Tensor, Tensor, int]:
    """Per-layer number of correct argmax predictions (L,), summed float64 cross-entropy (L,) and the batch size.

    ``scores``: per-layer logits (L, B, C) or their :class:`Readout` (which must carry ``nll``).
    """
    readout = _as_readout(scores, targets, num_layers)
    targets = targets.to(device=readout.predictions.device, dtype=torch.long)
    correct = (readout.predictions == targets).sum(dim=1).to(_F64)
    if readout.nll is None:
        raise ValueError("Expected a Readout with `nll` (one read out with targets) to sum the loss, got nll=None.")
    loss = readout.nll.to(_F64).sum(dim=1)
    return correct, loss, readout.predictions.shape[1]


def _layer_accuracy_compute(correct: Tensor, loss_sum: Tensor, count: Union[Tensor, int]) -> tuple[Tensor, Tensor]:
    """Per-layer accuracy and mean cross-entropy (L,) each."""
    return correct / count, loss_sum / count


def layer_accuracy(logits: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
    """Per-layer accuracy and mean cross-entropy (two (L,) tensors) of logits (L, N, C) with targets (N,)."""
    _check_logits(logits, None)
    return _layer_accuracy_compute(*_layer_accuracy_update(logits, targets, logits.shape[0]))


def _binary_f1_update(
    scores: Union[Tensor, Readout], targets: Tensor, num_layers: int, positive: int = 1
) -> tuple[Tensor, Tensor, Tensor]:
    """True positives, false positives and false negatives (L,) float64 of the class ``positive`` at every layer."""
    readout = _as_readout(scores, targets, num_layers)
    predicted = readout.predictions == positive
    actual = (targets.to(device=predicted.device) == positive).unsqueeze(0)
    true_positives = (predicted & actual).sum(dim=1).to(_F64)
    false_positives = (predicted & ~actual).sum(dim=1).to(_F64)
    false_negatives = (~predicted & actual).sum(dim=1).to(_F64)
    return true_positives, false_positives, false_negatives


def _binary_f1_compute(true_positives: Tensor, false_positives: Tensor, false_negatives: Tensor) -> Tensor:
    """F1 = 2TP / (2TP + FP + FN) per layer; 0 where the class is never predicted nor present (as scikit-learn)."""
    denominator = 2 * true_positives + false_positives + false_negatives
    return torch.where(denominator > 0, 2 * true_positives / denominator.clamp_min(1), torch.zeros_like(denominator))


def saturation_layers(predictions: Tensor) -> Tensor:
    """0-based saturation layer of every sample: the smallest l with predictions[m] == predictions[L-1] for all m >= l.

    Args:
        predictions: (L, B) integer predictions at every layer.

    Returns:
        (B,) long tensor in [0, L-1].
    """
    if predictions.ndim != 2 or predictions.shape[0] == 0:
        raise ValueError(f"Expected `predictions` of shape (L, B) with L >= 1, got {tuple(predictions.shape)}.")
    agree = (predictions == predictions[-1:]).to(torch.long)
    trailing = agree.flip(0).cumprod(dim=0).sum(dim=0)  # number of final layers agreeing with the last one
    return predictions.shape[0] - trailing


def _saturation_histogram_update(scores: Union[Tensor, Readout], num_layers: int) -> Tensor:
    """Number of samples (L,) float64 whose argmax prediction saturates at each layer (logits or a Readout)."""
    if isinstance(scores, Tensor):
        _check_logits(scores, num_layers)
        return _count(saturation_layers(scores.argmax(dim=-1)), num_layers)
    return _count(saturation_layers(_as_readout(scores, None, num_layers).predictions), num_layers)


# ---------------------------------------------------------------------------------------------------- early exit
def _early_exit_update(
    scores: Union[Tensor, Readout], targets: Tensor, thresholds: Tensor, num_layers: int
) -> tuple[Tensor, Tensor, int]:
    """Confidence-based early exit for T thresholds: correct exits (T,), exit counts (T, L), batch size.

    A sample exits at the first layer whose max float64 softmax probability is >= tau, else at the last layer,
    and is correct when that layer's argmax equals its target.
    """
    readout = _as_readout(scores, targets, num_layers)
    confidence, prediction = readout.max_prob.to(_F64), readout.predictions  # (L, B)
    thresholds = thresholds.to(device=confidence.device, dtype=_F64)
    exits = confidence.unsqueeze(0) >= thresholds.view(-1, 1, 1)  # (T, L, B)
    exits[:, -1] = True
    exit_layer = (exits.cumsum(dim=1) == 0).sum(dim=1)  # (T, B): layers passed before the first confident one
    exit_prediction = prediction.gather(0, exit_layer)
    correct = (exit_prediction == targets.to(device=prediction.device).view(1, -1)).sum(dim=1).to(_F64)
    exit_counts = torch.zeros(thresholds.numel(), num_layers, dtype=_F64, device=confidence.device)
    exit_counts.scatter_add_(1, exit_layer, torch.ones_like(exit_layer, dtype=_F64))
    return correct, exit_counts, prediction.shape[1]


def _early_exit_compute(
    correct: Tensor, exit_counts: Tensor, count: Union[Tensor, int], layer_numbers: Tensor, depth: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Accuracy (T,), exit counts (T, L) and speedup (T,) = sum_l D m_l / sum_l n_l m_l."""
    layer_numbers = layer_numbers.to(device=exit_counts.device, dtype=_F64)
    speedup = depth * exit_counts.sum(dim=1) / (exit_counts * layer_numbers).sum(dim=1)
    return correct / count, exit_counts, speedup


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
