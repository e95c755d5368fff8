"""Residual norm ratio ||x|| / ||F(x)||: how much of the residual stream each block and branch rewrites."""

from typing import Any, NamedTuple

import torch
from torch import Tensor

from layerwise.metrics._base import _check_positive_int, _SumStateMetric
from layerwise.metrics.functional_distribution import _histogram_update, histogram_quantiles


class NormRatio(NamedTuple):
    """What ``ResidualNormRatio.compute`` returns (mean, quantiles at ``levels``, counts in and outside the range).

    Shapes: mean, count, below, above (P, L); quantiles (P, L, Q).
    """

    mean: Tensor
    quantiles: Tensor
    count: Tensor  # type: ignore[assignment]  # the field shadows tuple.count, on purpose
    below: Tensor
    above: Tensor


class ResidualNormRatio(_SumStateMetric):
    r"""Mean and quantiles of :math:`r = \|x\| / \|F(x)\|` per branch and block (App. B.2 of Jiang et al.).

    ``x`` is the residual stream a branch adds to and ``F(x)`` the branch (or the whole block's update), both at one
    token per sample (see :mod:`layerwise.features.branches`). States (float64, summed): ``ratio_sum`` and ``count``
    (P, L) for the exact mean, a histogram of :math:`\log_{10} r` with ``bins`` fixed bins on [low, high]
    (P, L, bins) and the counts ``below`` and ``above`` (P, L) of ratios outside that range. The quantiles are read
    from the histogram: over the whole range, :math:`10^{-10} \le r \le 10^{10}` by default (a LayerScale of 1e-6
    gives ratios near 1e6), their log10 is within half a bin, (high - low) / (2 bins), of ``numpy.quantile`` of
    :math:`\log_{10} r` (0.005 by default: a factor of 1.2 %). A quantile that needs a ratio outside the range is
    NaN (``null`` in the JSON), never the edge of the range, and the counts outside are returned. Samples whose
    ratio is not finite and positive (a zero or non-finite branch) are left out.

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
        bins: int = 2000,
        low: float = -10.0,
        high: float = 10.0,
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
        self._add_sum_state("below", self.shape)
        self._add_sum_state("above", self.shape)

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
        log_ratio = torch.log10(ratio)
        below, above = valid & (log_ratio < self.low), valid & (log_ratio > self.high)
        self.below += below.sum(-1).to(torch.float64)
        self.above += above.sum(-1).to(torch.float64)
        self.log_histogram += _histogram_update(log_ratio, valid & ~below & ~above, self.low, self.high, self.bins)

    def compute(self) -> NormRatio:
        """Mean ratio (P, L), quantiles (P, L, Q) at ``levels`` (NaN where empty or outside the range), the counts."""
        mean = torch.where(self.count > 0, self.ratio_sum / self.count.clamp_min(1), torch.nan)
        log_quantiles = histogram_quantiles(
            self.log_histogram, self.levels, self.low, self.high, below=self.below, above=self.above
        )
        return NormRatio(mean, torch.pow(10.0, log_quantiles), self.count, self.below, self.above)
