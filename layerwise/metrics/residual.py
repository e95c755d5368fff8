"""Residual norm ratio ||x|| / ||F(x)||: how much of the residual stream each block and branch rewrites."""

from typing import Any, NamedTuple

import torch
from torch import Tensor

from layerwise.metrics._base import _check_positive_int, _SumStateMetric
from layerwise.metrics.functional_distribution import _histogram_update, histogram_quantiles


class NormRatio(NamedTuple):
    """What ``ResidualNormRatio.compute`` returns: mean (P, L), quantiles (P, L, Q) at ``levels``, count (P, L)."""

    mean: Tensor
    quantiles: Tensor
    count: Tensor


class ResidualNormRatio(_SumStateMetric):
    r"""Mean and quantiles of :math:`r = \|x\| / \|F(x)\|` per branch and block (App. B.2 of Jiang et al.).

    ``x`` is the residual stream a branch adds to and ``F(x)`` the branch (or the whole block's update), both at one
    token per sample (see :mod:`layerwise.features.branches`). States (float64, summed): ``ratio_sum`` and ``count``
    (P, L) for the exact mean, and a histogram of :math:`\log_{10} r` with ``bins`` fixed bins on [low, high]
    (P, L, bins; values outside go to the end bins). The quantiles are read from that histogram: their log10 is
    within half a bin, (high - low) / (2 bins), of ``numpy.quantile`` of :math:`\log_{10} r` (0.005 by default, a
    factor of 1.2 %). Samples whose ratio is not finite and positive (a zero or non-finite branch) are left out.

    Args:
        num_branches: P (e.g. block, attention, MLP).
        num_layers: L.
        levels: the quantile levels returned by ``compute``.
        bins, low, high: the log10 histogram.
        kwargs: torchmetrics ``Metric`` options.

    Shapes:
        ``update(skip, branch)``: norms (P, L, B). ``compute()``: :class:`NormRatio`.
    """

    def __init__(
        self,
        num_branches: int,
        num_layers: int,
        levels: tuple[float, ...] = (0.05, 0.25, 0.5, 0.75, 0.95),
        bins: int = 600,
        low: float = -2.0,
        high: float = 4.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.shape = (_check_positive_int("num_branches", num_branches), _check_positive_int("num_layers", num_layers))
        self.bins = _check_positive_int("bins", bins)
        if not low < high:
            raise ValueError(f"Expected `low` < `high` for the log10 histogram, got {low} and {high}.")
        self.levels, self.low, self.high = tuple(levels), float(low), float(high)
        self._add_sum_state("ratio_sum", self.shape)
        self._add_sum_state("count", self.shape)
        self._add_sum_state("log_histogram", (*self.shape, bins))

    def update(self, skip: Tensor, branch: Tensor) -> None:
        """Accumulate the norms (P, L, B) of the skip and of the branch of a batch."""
        if skip.shape != branch.shape or skip.shape[:2] != self.shape:
            raise ValueError(
                f"Expected `skip` and `branch` of shape {(*self.shape, 'B')}, got {tuple(skip.shape)} and "
                f"{tuple(branch.shape)}."
            )
        ratio = skip.to(torch.float64) / branch.to(torch.float64)
        valid = torch.isfinite(ratio) & (ratio > 0)
        ratio = torch.where(valid, ratio, torch.ones_like(ratio))
        self.ratio_sum += torch.where(valid, ratio, torch.zeros_like(ratio)).sum(-1)
        self.count += valid.sum(-1).to(torch.float64)
        self.log_histogram += _histogram_update(torch.log10(ratio), valid, self.low, self.high, self.bins)

    def compute(self) -> NormRatio:
        """Mean ratio (P, L), quantiles (P, L, Q) of the ratio at ``levels``, and the counts (P, L); NaN where empty."""
        mean = torch.where(self.count > 0, self.ratio_sum / self.count.clamp_min(1), torch.nan)
        log_quantiles = histogram_quantiles(self.log_histogram, self.levels, self.low, self.high)
        return NormRatio(mean, torch.pow(10.0, log_quantiles), self.count)
