"""Fixed-bin histograms: exact, summable distributions of per-sample values, and the quantiles read from them.

A histogram with fixed edges is a sum state: adding the counts of two batches, or of two processes, gives the
histogram of their union, whatever the batching. Quantiles read from it are exact up to the bin width: the
estimate of ``histogram_quantiles`` is within half a bin of ``numpy.quantile`` (linear interpolation) on the
same values, see its docstring.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional, Union

import torch
from torch import Tensor

_F64 = torch.float64


def _histogram_update(values: Tensor, valid: Tensor, low: float, high: float, bins: int) -> Tensor:
    """Counts (..., bins) float64 of ``values`` (..., N) over the last dimension where ``valid`` (..., N) holds.

    Bin ``j`` holds ``low + j w <= v < low + (j + 1) w`` (``w = (high - low) / bins``); values outside
    ``[low, high]`` go to the first or last bin (a cosine rounded to 1 + 1e-16 stays in the last bin).
    """
    scaled = (values.to(_F64) - low) * (bins / (high - low))
    index = scaled.floor().clamp(0, bins - 1).long()
    counts = torch.zeros((*values.shape[:-1], bins), dtype=_F64, device=values.device)
    return counts.scatter_add_(-1, index, valid.to(_F64))


def histogram_quantiles(
    counts: Tensor,
    quantiles: Union[Sequence[float], Tensor],
    low: float,
    high: float,
    below: Optional[Tensor] = None,
    above: Optional[Tensor] = None,
) -> Tensor:
    """Quantiles (..., Q) of the values counted in ``counts`` (..., bins) on ``[low, high]``; NaN where empty.

    numpy's default quantile is ``(1 - f) x_(k) + f x_(k+1)`` with ``k + f = q (n - 1)`` on the sorted values.
    The estimate replaces ``x_(k)`` and ``x_(k+1)`` by the centres of the bins that hold them, so it is within
    half a bin width ``(high - low) / (2 bins)`` of ``numpy.quantile`` on the same values (for values inside
    ``[low, high]``).

    ``below`` and ``above`` (...): counts of values seen outside ``[low, high]`` and not in ``counts``. They take
    their place in the order, and a quantile that needs one of them (``x_(k)`` or, when ``f > 0``, ``x_(k+1)``
    outside the range) is NaN rather than the edge of the range: a quantile is either within half a bin or absent.
    """
    counts = counts.to(_F64)
    bins = counts.shape[-1]
    q = torch.as_tensor(quantiles, dtype=_F64, device=counts.device)
    if bool(((q < 0) | (q > 1)).any()):
        raise ValueError(f"Quantiles must lie in [0, 1], got {q.tolist()}.")
    zeros = torch.zeros(counts.shape[:-1], dtype=_F64, device=counts.device)
    below = zeros if below is None else below.to(device=counts.device, dtype=_F64)
    above = zeros if above is None else above.to(device=counts.device, dtype=_F64)
    inside = counts.sum(-1, keepdim=True)  # (..., 1)
    below, above = below.unsqueeze(-1), above.unsqueeze(-1)
    total = below + inside + above
    cumulative = counts.cumsum(-1)  # (..., bins), non-decreasing
    position = q * (total - 1).clamp_min(0)  # (..., Q)
    rank = position.floor()
    fraction = position - rank
    width = (high - low) / bins

    def centre_of(order: Tensor) -> Tensor:  # the centre of the bin holding the order statistic `order` (0-based)
        order = (order - below).clamp_min(0)
        index = torch.searchsorted(cumulative.contiguous(), order.contiguous(), right=True).clamp_max(bins - 1)
        return low + (index.to(_F64) + 0.5) * width

    def outside(order: Tensor) -> Tensor:
        return (order < below) | (order >= below + inside)

    upper = torch.minimum(rank + 1, (total - 1).clamp_min(0))
    estimate = (1 - fraction) * centre_of(rank) + fraction * centre_of(upper)
    unknown = (total <= 0) | outside(rank) | ((fraction > 0) & outside(upper))
    return torch.where(unknown, torch.full_like(estimate, float("nan")), estimate)


def counted_fraction(part: Tensor, counts: Tensor) -> Tensor:
    """``part`` (...) as a fraction of the values counted in ``counts`` (..., bins); NaN where nothing was counted."""
    total = counts.to(_F64).sum(-1)
    return torch.where(total > 0, part.to(_F64) / total.clamp_min(1), torch.full_like(total, float("nan")))
