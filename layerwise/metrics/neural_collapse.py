"""Neural-collapse metrics of the per-layer features."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from layerwise.metrics._base import _check_positive_int, _ShiftedSumStateMetric
from layerwise.metrics.functional import _check_features
from layerwise.metrics.functional_collapse import _nc1_compute, _nc1_update, nc1
from layerwise.metrics.functional_similarity import _recentred_moments


class LayerNC1(_ShiftedSumStateMetric):
    r"""NC1 within-class variability collapse (Papyan, Han & Donoho, 2020) at every layer, in one pass.

    .. math:: \mathrm{NC1} = \frac{1}{K} \mathrm{tr}(\Sigma_W \Sigma_B^\dagger), \quad
        \Sigma_W = \frac{1}{N} \sum_k \sum_{i \in k} (h_i - \mu_k)(h_i - \mu_k)^T, \quad
        \Sigma_B = \frac{1}{K} \sum_k (\mu_k - \mu_G)(\mu_k - \mu_G)^T

    with :math:`\mu_G` the mean of the class means (not the sample mean, so class imbalance does not tilt
    :math:`\Sigma_B`). K counts only the classes present in the data: absent classes are excluded from K,
    :math:`\mu_G` and :math:`\Sigma_B`. The pseudo-inverse uses the SVD of the (d, K) centred class means with
    the cutoff max(d, K) * eps * s_max (:math:`\Sigma_B` has rank <= K - 1, a tiny rcond would invert noise).
    0 for fully collapsed features; NaN with fewer than 2 classes present or identical class means.

    States (float64, summed): ``class_counts`` (K,), ``class_sums`` (L, K, d), ``second_moment`` (L, d, d) =
    sum_i x_i x_i^T; 8 L d^2 bytes (57 MB for 12 x 768). Every sum is of x = h - shift, ``shift`` (L, d) the mean
    of the first batch of each rank, re-aligned across ranks before a reduction, so a common offset of 1e6 costs
    no digits (raw moments would lose 12 of 16).

    Args:
        num_layers: L.
        dim: feature width d.
        num_classes: number of classes K.
        kwargs: torchmetrics ``Metric`` options.

    Shapes:
        ``update(features, targets)``: features (L, B, d), targets (B,) integer in [0, K).
        ``compute()``: (L,) float64.
    """

    def __init__(self, num_layers: int, dim: int, num_classes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_layers = _check_positive_int("num_layers", num_layers)
        self.dim = _check_positive_int("dim", dim)
        self.num_classes = _check_positive_int("num_classes", num_classes)
        self._add_sum_state("class_counts", (num_classes,))
        self._add_sum_state("class_sums", (num_layers, num_classes, dim))
        self._add_sum_state("second_moment", (num_layers, dim, dim))
        self._add_shift_state((num_layers, dim))

    def update(self, features: Tensor, targets: Tensor) -> None:
        """Accumulate a batch of features (L, B, d) with targets (B,)."""
        _check_features(features, self.num_layers, self.dim)
        shifted = self._shifted(features)
        counts, class_sums, second_moment = _nc1_update(shifted, targets, self.num_layers, self.dim, self.num_classes)
        self.class_counts += counts
        self.class_sums += class_sums
        self.second_moment += second_moment

    def forward(self, features: Tensor, targets: Tensor) -> Tensor:
        """Accumulate the batch like ``update`` and return NC1 (L,) of this batch alone."""
        self.update(features, targets)
        self._forward_cache = nc1(features, targets, self.num_classes)
        return self._forward_cache

    def compute(self) -> Tensor:
        """Return NC1 (L,) float64."""
        return _nc1_compute(self.class_counts, self.class_sums, self.second_moment)

    def _sample_count(self, states: dict[str, Tensor]) -> Tensor:
        return states["class_counts"].sum()

    def _recentred(self, states: dict[str, Tensor], delta: Tensor) -> dict[str, Tensor]:
        return _recentred_moments(states, delta, count="class_counts", sums="class_sums", cross="second_moment")
