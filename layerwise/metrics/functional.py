"""Pure tensor functions behind the layer-wise metrics: the shared input checks, and the readout of every layer.

The readout (``Readout``, ``readout_rows``: argmax, top-1 probability and loss of each row), layer accuracy, binary
F1, saturation layers and early exit live here; similarity (COS, CKA) in
:mod:`~layerwise.metrics.functional_similarity`, NC1 and effective depth in
:mod:`~layerwise.metrics.functional_collapse`, and the cross-model, distribution and block-dynamics functions in the
other ``functional_*`` modules.

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


def _count(index: Tensor, size: int) -> Tensor:
    """Float64 histogram (size,) of a long index tensor, without the host sync of ``torch.bincount`` on CUDA."""
    return torch.zeros(size, dtype=_F64, device=index.device).index_add_(0, index, torch.ones_like(index, dtype=_F64))


# ---------------------------------------------------------------------------------------- accuracy and saturation
class Readout(NamedTuple):
    """What the classifier reads out of every layer, per sample: all a prediction metric needs, without logits.

    ``predictions`` (L, B) long argmax (ties to the lowest index), ``max_prob`` (L, B) float64 top-1 softmax
    probability, ``nll`` (L, B) float64 cross-entropy of the target (None without targets), ``entropy`` (L, B)
    float64 softmax entropy in nats (only where asked for: early exit's entropy criterion, the lens statistics).
    Only where asked for (they need the reference layer's logits beside every layer's, :func:`reference_rows`):
    ``kl_to_final`` (L, B) float64 ``KL(p_ref || p_l)`` in nats from the reference (last) layer's distribution, and
    ``final_rank`` (L, B) float64 the 1-based rank of the reference layer's top-1 class in layer l's distribution.
    """

    predictions: Tensor
    max_prob: Tensor
    nll: Optional[Tensor]
    entropy: Optional[Tensor] = None
    kl_to_final: Optional[Tensor] = None
    final_rank: Optional[Tensor] = None


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


def reference_rows(logits: Tensor, reference: Tensor) -> tuple[Tensor, Tensor]:
    """``KL(p_ref || p)`` and the 1-based rank of the reference's argmax under ``logits``, per row, in float64.

    Args:
        logits: (..., C) one layer's logits.
        reference: (..., C) the reference (final) layer's logits of the same rows.

    Returns:
        ``kl`` (...) float64 nats ``Σ_c p_ref,c (log p_ref,c - log p_c)``; ``rank`` (...) float64
        ``1 + #{c : z_c > z_c*}`` with ``c* = argmax reference`` (1: the layer's top-1 is the reference's, as
        tuned-lens's ``PredictionTrajectory.rank`` counts, ties in the layer's favour).
    """
    log_p = torch.log_softmax(logits.to(_F64), dim=-1)
    log_ref = torch.log_softmax(reference.to(_F64), dim=-1)
    kl = torch.nn.functional.kl_div(log_p, log_ref, reduction="none", log_target=True).sum(dim=-1)
    top = reference.argmax(dim=-1, keepdim=True)
    chosen = logits.gather(-1, top)
    rank = 1 + (logits > chosen).sum(dim=-1)
    return kl, rank.to(_F64)


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


LENS_FIELDS = ("kl_to_final", "entropy", "final_rank")  # the lens statistics of a Readout read with ``reference``


def _lens_statistics_update(readout: Readout, num_layers: int) -> tuple[Tensor, int]:
    """Per-layer sums (3, L) float64 of ``kl_to_final``, ``entropy`` and ``final_rank`` of a batch, and its size."""
    values = [getattr(readout, field) for field in LENS_FIELDS]
    if any(value is None for value in values):
        raise ValueError(
            "Expected a Readout with kl_to_final, entropy and final_rank (chunked_readout(..., reference=True)), got "
            f"{[field for field, value in zip(LENS_FIELDS, values) if value is None]} as None."
        )
    stacked = torch.stack([value.to(_F64) for value in values if value is not None])
    if stacked.ndim != 3 or stacked.shape[1] != num_layers:
        raise ValueError(f"Expected lens statistics of shape ({num_layers}, B), got {tuple(stacked.shape[1:])}.")
    return stacked.sum(dim=2), stacked.shape[2]


def _lens_statistics_compute(sums: Tensor, count: Union[Tensor, int]) -> dict[str, Tensor]:
    """Per-layer means (L,) of the lens statistics, by name."""
    return {field: row / count for field, row in zip(LENS_FIELDS, sums)}


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
