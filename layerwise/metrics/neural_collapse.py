"""Neural-collapse metrics of the per-layer features: NC1 alone, and NC1-NC4 with CDNV."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor
from torchmetrics.utilities import rank_zero_warn

from layerwise.errors import LayerwiseWarning
from layerwise.metrics._base import _check_positive_int, _ShiftedSumStateMetric
from layerwise.metrics.functional import _check_features
from layerwise.metrics.functional_collapse import (
    _cdnv_compute,
    _class_square_update,
    _class_sum_update,
    _nc1_compute,
    _nc1_update,
    _nc2_compute,
    _nc3_compute,
    _ncc_update,
    nc1,
)
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


class LayerNeuralCollapse(_ShiftedSumStateMetric):
    r"""Neural collapse complete at every layer: NC1, CDNV, NC2, NC3 and NC4 (Papyan, Han & Donoho, 2020).

    On the K classes present, with :math:`\mu_c` the class means, :math:`\mu_G` the mean of the class means (as
    for NC1; the neural-collapse package's default, ``MeanAccumulator.compute(weighted=False)``) and
    :math:`M_c = \mu_c - \mu_G`:

    - ``nc1``: as :class:`LayerNC1`, from the same states (identical values).
    - ``cdnv``: mean over ordered pairs :math:`c \ne c'` of :math:`(\sigma_c^2 + \sigma_{c'}^2) /
      (2 \|\mu_c - \mu_{c'}\|^2)`, :math:`\sigma_c^2` the mean squared distance of class c's features to
      :math:`\mu_c` (Galanti et al., 2021).
    - ``nc2_equinorm``: std/mean of :math:`\|M_c\|` (sample std, K - 1, as Papyan et al.'s code);
      ``nc2_cos_std``: the std of the K(K-1)/2 pairwise cosines of the :math:`M_c`; ``nc2_equiangular``: their mean
      :math:`|\cos + 1/(K-1)|`; ``nc2_etf``: :math:`\|M M^T/\|M M^T\|_F - (I - 11^T/K)/\|I - 11^T/K\|_F\|_F`.
    - with ``head_dim`` and :attr:`classifier` (the weight W (K, d') of the head's last linear layer), on the
      features that layer reads (``head_inputs``): ``nc3``, the mean over classes of
      :math:`\|W_c/\|W_c\| - M_c/\|M_c\|\|`, and ``nc3_duality``,
      :math:`\|W M^T/\|W M^T\|_F - (I - 11^T/K)/\|I - 11^T/K\|_F\|_F` (Kothapalli, 2023).
    - with ``ncc=True`` and the head's ``predictions``: ``nc4_agreement``, the fraction of samples whose nearest
      class centre (argmin :math:`\|x - \mu_c\|`, this evaluation's own means) is the head's prediction, and
      ``nc4_ncc_accuracy``, the fraction where it is the target.

    Exact in one pass: NC1-NC3 from float64 sum states (those of :class:`LayerNC1`, the per-class sums of squared
    norms (L, K) and, for NC3, the per-class sums of the head's inputs (L, K, d')). NC4 needs the means before it
    can classify: every rank keeps its features, targets and predictions in a buffer (in the features' dtype, not a
    torchmetrics state), and ``compute`` classifies them with the global means and sums the counts over ranks with
    one more small all-reduce (a collective, as the centered :class:`LayerCosineSimilarity`). Beyond
    ``max_buffered_samples`` samples on a rank the buffer is dropped and NC4 is NaN (with a warning naming the
    option): exact or absent, never approximate.

    Args:
        num_layers: L.
        dim: feature width d.
        num_classes: number of classes K.
        head_dim: width d' of the features the head's last linear layer reads (None: no NC3).
        ncc: buffer the features for NC4.
        max_buffered_samples: per-rank limit of the NC4 buffer.
        kwargs: torchmetrics ``Metric`` options.

    Shapes:
        ``update(features, targets, predictions=None, head_inputs=None)``: features (L, B, d), targets (B,) in
        [0, K), predictions (L, B) (needed with ``ncc``), head_inputs (L, B, d') (needed with ``head_dim``).
        ``compute()``: a dict of (L,) float64 tensors, the keys above.
    """

    def __init__(
        self,
        num_layers: int,
        dim: int,
        num_classes: int,
        head_dim: Optional[int] = None,
        ncc: bool = False,
        max_buffered_samples: int = 65536,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.num_layers = _check_positive_int("num_layers", num_layers)
        self.dim = _check_positive_int("dim", dim)
        self.num_classes = _check_positive_int("num_classes", num_classes)
        self.head_dim = None if head_dim is None else _check_positive_int("head_dim", head_dim)
        if not isinstance(ncc, bool):
            raise ValueError(f"Expected `ncc` to be a bool, got {ncc!r}.")
        self.ncc = ncc
        self.max_buffered_samples = _check_positive_int("max_buffered_samples", max_buffered_samples)
        self._add_sum_state("class_counts", (num_classes,))
        self._add_sum_state("class_sums", (num_layers, num_classes, dim))
        self._add_sum_state("second_moment", (num_layers, dim, dim))
        self._add_sum_state("class_squares", (num_layers, num_classes))
        if self.head_dim is not None:
            self._add_sum_state("head_class_sums", (num_layers, num_classes, self.head_dim))
        self._add_shift_state((num_layers, dim))
        self.classifier: Optional[Tensor] = None  # W (K, d') of the head's last linear layer, set before compute
        self._buffer: list[tuple[Tensor, Tensor, Tensor]] = []
        self._num_buffered = 0
        self._overflowed = False

    def reset(self) -> None:
        """Reset the states and free the NC4 buffer."""
        super().reset()
        self._buffer, self._num_buffered, self._overflowed = [], 0, False

    def update(
        self,
        features: Tensor,
        targets: Tensor,
        predictions: Optional[Tensor] = None,
        head_inputs: Optional[Tensor] = None,
    ) -> None:
        """Accumulate a batch: features (L, B, d), targets (B,), predictions (L, B), head_inputs (L, B, d')."""
        _check_features(features, self.num_layers, self.dim)
        batch = features.shape[1]
        if self.head_dim is not None:
            if head_inputs is None:
                raise ValueError("LayerNeuralCollapse(head_dim=...) needs `head_inputs` (L, B, d') in update (NC3).")
            _check_features(head_inputs, self.num_layers, self.head_dim, name="head_inputs")
            if head_inputs.shape[1] != batch:
                raise ValueError(f"Expected `head_inputs` of {batch} rows, got {tuple(head_inputs.shape)}.")
        if self.ncc:
            if predictions is None or tuple(predictions.shape) != (self.num_layers, batch):
                shape = None if predictions is None else tuple(predictions.shape)
                raise ValueError(
                    f"LayerNeuralCollapse(ncc=True) needs `predictions` ({self.num_layers}, {batch}), got {shape}."
                )
        shifted = self._shifted(features)
        counts, class_sums, second_moment = _nc1_update(shifted, targets, self.num_layers, self.dim, self.num_classes)
        self.class_counts += counts
        self.class_sums += class_sums
        self.second_moment += second_moment
        self.class_squares += _class_square_update(shifted, targets, self.num_classes)
        if self.head_dim is not None:
            assert head_inputs is not None
            self.head_class_sums += _class_sum_update(head_inputs, targets, self.num_classes)
        if self.ncc and not self._overflowed:
            assert predictions is not None
            self._buffer_batch(features, targets, predictions)

    def _buffer_batch(self, features: Tensor, targets: Tensor, predictions: Tensor) -> None:
        if self._num_buffered + features.shape[1] > self.max_buffered_samples:
            rank_zero_warn(
                f"LayerNeuralCollapse: more than max_buffered_samples={self.max_buffered_samples} samples on this "
                "rank; NC4 (the nearest-class-centre agreement) is left out (NaN) for this evaluation. Raise "
                "`max_buffered_samples` (NeuralCollapseMonitor's `ncc_max_samples`) for it.",
                LayerwiseWarning,
            )
            self._buffer, self._num_buffered, self._overflowed = [], 0, True
            return
        self._buffer.append((features.detach().clone(), targets.detach().clone(), predictions.detach().clone()))
        self._num_buffered += features.shape[1]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Accumulate the batch like ``update``; the per-batch value is not computed (NC4 needs a whole set)."""
        self.update(*args, **kwargs)
        return None

    def compute(self) -> dict[str, Tensor]:
        """Every measure, (L,) float64 each (NC3 with ``head_dim`` and :attr:`classifier`, NC4 with ``ncc``)."""
        nc2 = _nc2_compute(self.class_counts, self.class_sums)
        results = {
            "nc1": _nc1_compute(self.class_counts, self.class_sums, self.second_moment),
            "cdnv": _cdnv_compute(self.class_counts, self.class_sums, self.class_squares),
            **{f"nc2_{name}": value for name, value in nc2.items()},
        }
        if self.head_dim is not None:
            results.update(self._nc3())
        if self.ncc:
            results.update(self._nc4())
        return results

    def _nc3(self) -> dict[str, Tensor]:
        weight = self.classifier
        if weight is None:
            nan = torch.full((self.num_layers,), float("nan"), dtype=torch.float64, device=self.class_sums.device)
            return {"nc3": nan, "nc3_duality": nan.clone()}
        if tuple(weight.shape) != (self.num_classes, self.head_dim):
            raise ValueError(
                f"Expected the classifier weight of shape ({self.num_classes}, {self.head_dim}) (classes, head input "
                f"width), got {tuple(weight.shape)}."
            )
        nc3 = _nc3_compute(self.class_counts, self.head_class_sums, weight)
        return {"nc3": nc3["distance"], "nc3_duality": nc3["duality"]}

    def _nc4(self) -> dict[str, Tensor]:
        """Classify the buffer with the global means; the counts summed over ranks (a collective when reduced)."""
        device = self.class_sums.device
        local = torch.zeros(2 * self.num_layers + 1, dtype=torch.float64, device=device)
        local[-1] = float(self._overflowed)
        if not self._overflowed and bool((self.class_counts > 0).any()):
            for features, targets, predictions in self._buffer:
                shifted = features.to(device=device, dtype=torch.float64) - self.shift.to(device).unsqueeze(1)
                agree, correct = _ncc_update(shifted, targets, predictions, self.class_counts, self.class_sums)
                local[: self.num_layers] += agree
                local[self.num_layers : -1] += correct
        self._all_reduce_if_global(local)
        total = self.class_counts.sum()
        if float(local[-1]) > 0 or float(total) == 0:
            nan = torch.full((self.num_layers,), float("nan"), dtype=torch.float64, device=device)
            return {"nc4_agreement": nan, "nc4_ncc_accuracy": nan.clone()}
        return {
            "nc4_agreement": local[: self.num_layers] / total,
            "nc4_ncc_accuracy": local[self.num_layers : -1] / total,
        }

    def merge_state(self, incoming_state: Any) -> None:
        """Add another instance's states; not with ``ncc=True`` (its buffer is no state)."""
        if self.ncc:
            raise NotImplementedError("merge_state is not supported with ncc=True (the NC4 buffer is no state).")
        super().merge_state(incoming_state)

    def _sample_count(self, states: dict[str, Tensor]) -> Tensor:
        return states["class_counts"].sum()

    def _recentred(self, states: dict[str, Tensor], delta: Tensor) -> dict[str, Tensor]:
        moved = _recentred_moments(states, delta, count="class_counts", sums="class_sums", cross="second_moment")
        delta = delta.to(device=states["class_sums"].device, dtype=torch.float64)
        # sum ||x + delta||^2 over class c = sum ||x||^2 + 2 delta . (sum x)_c + n_c ||delta||^2
        moved["class_squares"] = (
            states["class_squares"]
            + 2 * torch.einsum("lkd,ld->lk", states["class_sums"], delta)
            + states["class_counts"].view(1, -1) * delta.square().sum(dim=-1, keepdim=True)
        )
        if "head_class_sums" in states:  # raw sums of the head's inputs: no shift
            moved["head_class_sums"] = states["head_class_sums"]
        return moved
