"""Applying the shared head to every layer in token chunks, so no layers x tokens x vocabulary tensor ever exists.

For a classifier with ten classes the head's logits of every layer are tiny; for a language model with a 50,257-token
vocabulary one layer's logits over 8,192 tokens are already 1.6 GB in float32. Both functions here walk the
``(rows, d)`` features in chunks of ``chunk_size`` rows: the peak extra memory is about one chunk of logits
(``chunk_size x V``), whatever the number of layers and tokens.
"""

from collections.abc import Callable
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from layerwise.features.backbone import IGNORE_INDEX
from layerwise.metrics.functional import Readout, readout_rows

Head = Callable[[Tensor], Tensor]
DEFAULT_CHUNK_SIZE = 1024


def _at_least_float32(x: Tensor) -> Tensor:
    """Half-precision logits are upcast for the softmax; float32 and float64 stay as they are."""
    return x if x.dtype in (torch.float32, torch.float64) else x.float()


def _cross_entropy_sum(head: Head, features: Tensor, targets: Tensor, label_smoothing: float) -> Tensor:
    logits = head(features)
    return F.cross_entropy(
        _at_least_float32(logits), targets, label_smoothing=label_smoothing, reduction="sum", ignore_index=IGNORE_INDEX
    )


def chunked_cross_entropy(
    head: Head,
    features: Tensor,
    targets: Tensor,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    label_smoothing: float = 0.0,
    recompute: bool = True,
) -> Tensor:
    """Mean cross-entropy of ``head(features)`` against ``targets``, one chunk of rows at a time.

    With ``recompute`` (default), every chunk runs under activation checkpointing: its logits are freed after the
    forward pass and recomputed, one chunk at a time, in the backward pass — also when all rows fit in one chunk,
    since a loss over several layers would otherwise keep every layer's logits until the backward pass. So the extra
    peak memory of the loss, forward and backward, is about three ``(chunk_size, V)`` float32 tensors (logits,
    softmax, gradient) whatever the number of layers. ``recompute=False`` with at most ``chunk_size`` rows is the
    plain cross-entropy (for classifiers, whose logits are small: no recomputation cost).

    Args:
        head: the classifier (e.g. final norm + LM head), applied to features ``(n, d)``.
        features: ``(N, d)`` one layer's features.
        targets: ``(N,)`` class indices; rows with ``-100`` are ignored (the mean is over the other rows).
        chunk_size: rows per chunk.
        label_smoothing: as in ``torch.nn.functional.cross_entropy``.
        recompute: checkpoint the head even when the rows fit in one chunk.
    """
    rows = features.shape[0]
    counted = (targets != IGNORE_INDEX).sum().clamp_min(1)  # a tensor: no host synchronisation
    if rows <= chunk_size and not recompute:
        return _cross_entropy_sum(head, features, targets, label_smoothing) / counted
    total = features.new_zeros((), dtype=torch.promote_types(features.dtype, torch.float32))
    for start in range(0, rows, chunk_size):
        part = slice(start, start + chunk_size)
        total = total + checkpoint(
            _cross_entropy_sum, head, features[part], targets[part], label_smoothing, use_reentrant=False
        )
    return total / counted


def _kl_sum(student: Head, teacher: Head, low: Tensor, high: Tensor, temperature: float) -> Tensor:
    target = F.log_softmax(_at_least_float32(teacher(high).detach()) / temperature, dim=-1)
    prediction = F.log_softmax(_at_least_float32(student(low)) / temperature, dim=-1)
    return F.kl_div(prediction, target, log_target=True, reduction="sum")


def chunked_kl_divergence(
    student: Head,
    teacher: Head,
    student_features: Tensor,
    teacher_features: Tensor,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    recompute: bool = True,
) -> Tensor:
    """Mean over rows of ``KL(softmax(teacher(h')/T) || softmax(student(h)/T))``, teacher detached, in chunks.

    ``recompute`` as in :func:`chunked_cross_entropy`.
    """
    rows = student_features.shape[0]
    if rows <= chunk_size and not recompute:
        return _kl_sum(student, teacher, student_features, teacher_features, temperature) / max(rows, 1)
    total = student_features.new_zeros((), dtype=torch.promote_types(student_features.dtype, torch.float32))
    for start in range(0, rows, chunk_size):
        part = slice(start, start + chunk_size)
        total = total + checkpoint(
            _kl_sum,
            student,
            teacher,
            student_features[part],
            teacher_features[part],
            temperature,
            use_reentrant=False,
        )
    return total / rows


@torch.no_grad()
def chunked_readout(
    head: Head, features: Tensor, targets: Optional[Tensor] = None, chunk_size: int = DEFAULT_CHUNK_SIZE
) -> Readout:
    """The head's argmax, top-1 probability and target cross-entropy at every layer, without keeping any logits.

    Args:
        head: the shared head, or one head per layer as a sequence of length L.
        features: ``(L, N, d)``.
        targets: ``(N,)`` or None.
        chunk_size: rows (of one layer) per chunk; the extra peak memory is about one ``(chunk_size, V)`` float32
            logits tensor plus its float64 copy.

    Returns:
        :class:`~layerwise.metrics.functional.Readout` of ``(L, N)`` tensors (probabilities and losses float64).
    """
    layers, rows = features.shape[:2]
    heads = list(head) if isinstance(head, (list, tuple)) else [head] * layers
    predictions = torch.empty(layers, rows, dtype=torch.long, device=features.device)
    max_prob = torch.empty(layers, rows, dtype=torch.float64, device=features.device)
    nll = None if targets is None else torch.empty(layers, rows, dtype=torch.float64, device=features.device)
    for layer in range(layers):
        for start in range(0, rows, chunk_size):
            part = slice(start, start + chunk_size)
            chunk_targets = None if targets is None else targets[part]
            top, prob, loss = readout_rows(heads[layer](features[layer, part]), chunk_targets)
            predictions[layer, part], max_prob[layer, part] = top, prob
            if nll is not None:
                nll[layer, part] = loss
    return Readout(predictions, max_prob, nll)
