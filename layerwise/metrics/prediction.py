"""Prediction metrics of the per-layer classifier: accuracy and loss, saturation histogram, early exit."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Optional, Union

import torch
from torch import Tensor

from layerwise.metrics._base import _check_positive_int, _SumStateMetric
from layerwise.metrics.functional import (
    Readout,
    _binary_f1_compute,
    _binary_f1_update,
    _early_exit_compute,
    _early_exit_update,
    _layer_accuracy_compute,
    _layer_accuracy_update,
    _lens_statistics_compute,
    _lens_statistics_update,
    _saturation_histogram_update,
)


class LayerAccuracy(_SumStateMetric):
    """Top-1 accuracy and mean cross-entropy of the model's classifier applied at every layer.

    States (float64, summed): ``correct`` (L,), ``loss_sum`` (L,) (cross-entropy computed in float64 from the
    logits), ``count``. Ties in the argmax go to the lowest class index.

    Args:
        num_layers: L.
        kwargs: torchmetrics ``Metric`` options.

    Shapes:
        ``update(scores, targets)``: logits (L, B, C) any float dtype (or their :class:`Readout`, e.g. computed in
        token chunks for a vocabulary-sized classifier), targets (B,) integer in [0, C).
        ``compute()``: ``{"accuracy": (L,), "loss": (L,)}`` float64.
    """

    def __init__(self, num_layers: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_layers = _check_positive_int("num_layers", num_layers)
        self._add_sum_state("correct", (num_layers,))
        self._add_sum_state("loss_sum", (num_layers,))
        self._add_sum_state("count", ())

    def update(self, scores: Union[Tensor, Readout], targets: Tensor) -> None:
        """Accumulate a batch of per-layer logits (L, B, C), or their :class:`Readout`, with targets (B,)."""
        correct, loss_sum, batch_size = _layer_accuracy_update(scores, targets, self.num_layers)
        self.correct += correct
        self.loss_sum += loss_sum
        self.count += batch_size

    def compute(self) -> dict[str, Tensor]:
        """Return ``{"accuracy": (L,), "loss": (L,)}``."""
        accuracy, loss = _layer_accuracy_compute(self.correct, self.loss_sum, self.count)
        return {"accuracy": accuracy, "loss": loss}


class LensStatistics(_SumStateMetric):
    """How far each layer's lens is from the model's final distribution, and how sure it is, over the whole set.

    Per layer ``l``, means over the samples (tokens) of: ``kl_to_final`` = ``KL(p_L || p_l)`` in nats (tuned-lens's
    training objective and its ``PredictionTrajectory.kl_divergence`` direction: the final distribution first),
    ``entropy`` = ``H(p_l)`` in nats, and ``final_rank`` = the 1-based rank of the final layer's top-1 class in
    ``p_l`` (1 where the layer already predicts it; tuned-lens's ``rank`` ranks the *target* instead).

    States (float64, summed): ``sums`` (3, L), ``count``: exact under DDP after one all-reduce.

    Shapes:
        ``update(readout)``: a :class:`Readout` of (L, B) fields read with ``reference=True``
        (:func:`~layerwise.engines.readout.chunked_readout`). ``compute()``: ``{"kl_to_final", "entropy",
        "final_rank"}`` each (L,) float64.
    """

    def __init__(self, num_layers: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_layers = _check_positive_int("num_layers", num_layers)
        self._add_sum_state("sums", (3, num_layers))
        self._add_sum_state("count", ())

    def update(self, readout: Readout) -> None:
        """Accumulate a batch's lens statistics."""
        sums, batch_size = _lens_statistics_update(readout, self.num_layers)
        self.sums += sums
        self.count += batch_size

    def compute(self) -> dict[str, Tensor]:
        """Return ``{"kl_to_final": (L,), "entropy": (L,), "final_rank": (L,)}``."""
        return _lens_statistics_compute(self.sums, self.count)


class LayerF1(_SumStateMetric):
    """F1 of one class (the positive class of a binary task, as GLUE reports for MRPC and QQP) at every layer.

    ``F1 = 2TP / (2TP + FP + FN)`` from the summed true positives, false positives and false negatives (float64),
    so it is exact over the evaluated set and across processes; 0 where the class is neither predicted nor present.

    Args:
        num_layers: L.
        positive: the class counted as positive (default 1).
        kwargs: torchmetrics ``Metric`` options.

    Shapes:
        ``update(scores, targets)``: logits (L, B, C) or their :class:`Readout`, targets (B,).
        ``compute()``: (L,) float64.
    """

    def __init__(self, num_layers: int, positive: int = 1, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_layers = _check_positive_int("num_layers", num_layers)
        self.positive = positive
        self._add_sum_state("true_positives", (num_layers,))
        self._add_sum_state("false_positives", (num_layers,))
        self._add_sum_state("false_negatives", (num_layers,))

    def update(self, scores: Union[Tensor, Readout], targets: Tensor) -> None:
        """Accumulate a batch of per-layer logits (L, B, C), or their :class:`Readout`, with targets (B,)."""
        tp, fp, fn = _binary_f1_update(scores, targets, self.num_layers, self.positive)
        self.true_positives += tp
        self.false_positives += fp
        self.false_negatives += fn

    def compute(self) -> Tensor:
        """Return F1 (L,) float64."""
        return _binary_f1_compute(self.true_positives, self.false_positives, self.false_negatives)


class SaturationHistogram(_SumStateMetric):
    """Histogram of saturation layers: how many samples have their final prediction fixed from layer l onwards.

    The saturation layer of a sample is the smallest 0-based l such that the argmax prediction at every layer
    m >= l equals the last layer's (see ``saturation_layers``). State: ``counts`` (L,) float64 (exact integers).

    Args:
        num_layers: L.
        kwargs: torchmetrics ``Metric`` options.

    Shapes:
        ``update(logits)``: (L, B, C). ``compute()``: (L,) float64 counts (sum = number of samples).
    """

    def __init__(self, num_layers: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.num_layers = _check_positive_int("num_layers", num_layers)
        self._add_sum_state("counts", (num_layers,))

    def update(self, scores: Union[Tensor, Readout]) -> None:
        """Accumulate the saturation layers of a batch of per-layer logits (L, B, C) or their :class:`Readout`."""
        self.counts += _saturation_histogram_update(scores, self.num_layers)

    def compute(self) -> Tensor:
        """Return the counts (L,) float64."""
        return self.counts.clone()


class EarlyExit(_SumStateMetric):
    r"""Confidence-threshold early exit with the per-layer classifier.

    For every threshold :math:`\tau`, a sample exits at the first row l whose max softmax probability (float64) is
    :math:`\ge \tau`, else at the last row, and counts as correct when that row's argmax is its target. The speedup
    over always running the full model is

    .. math:: \mathrm{speedup} = \frac{\sum_l D \, m_l}{\sum_l n_l \, m_l}

    with :math:`m_l` the number of samples exiting at row l, :math:`n_l` its 1-based layer number and D the depth
    of the full model (the cost of the exit heads is ignored). States (float64, summed): ``correct`` (T,),
    ``exit_counts`` (T, L), ``count``.

    Args:
        num_layers: L, the number of rows of the logits.
        thresholds: T confidence thresholds in [0, 1].
        layer_numbers: 1-based layer number of every row, strictly increasing (default 1..L); use it when the
            logits cover a subset of the layers.
        depth: depth D of the full model (default ``max(layer_numbers)``), at least ``max(layer_numbers)``.
        kwargs: torchmetrics ``Metric`` options.

    Shapes:
        ``update(logits, targets)``: logits (L, B, C), targets (B,).
        ``compute()``: ``{"accuracy": (T,), "exit_counts": (T, L), "speedup": (T,)}`` float64.
    """

    def __init__(
        self,
        num_layers: int,
        thresholds: Sequence[float] = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99),
        layer_numbers: Optional[Sequence[int]] = None,
        depth: Optional[int] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.num_layers = _check_positive_int("num_layers", num_layers)
        self.thresholds = tuple(float(t) for t in thresholds)
        if not self.thresholds or not all(0.0 <= t <= 1.0 for t in self.thresholds):
            raise ValueError(f"Expected `thresholds` to be a non-empty sequence in [0, 1], got {thresholds!r}.")
        numbers = tuple(range(1, num_layers + 1)) if layer_numbers is None else tuple(layer_numbers)
        if (
            len(numbers) != num_layers
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in numbers)
            or any(b <= a for a, b in zip(numbers, numbers[1:]))
        ):
            raise ValueError(
                f"Expected `layer_numbers` to be {num_layers} strictly increasing positive ints, got {layer_numbers!r}."
            )
        self.layer_numbers = numbers
        self.depth = max(numbers) if depth is None else _check_positive_int("depth", depth)
        if self.depth < max(numbers):
            raise ValueError(f"Expected `depth` >= max(layer_numbers) = {max(numbers)}, got {depth}.")
        self._thresholds_tensor: Optional[Tensor] = None
        self._add_sum_state("correct", (len(self.thresholds),))
        self._add_sum_state("exit_counts", (len(self.thresholds), num_layers))
        self._add_sum_state("count", ())

    def update(self, scores: Union[Tensor, Readout], targets: Tensor) -> None:
        """Accumulate a batch of per-layer logits (L, B, C), or their :class:`Readout`, with targets (B,)."""
        correct, exit_counts, batch_size = _early_exit_update(scores, targets, self._thresholds(), self.num_layers)
        self.correct += correct
        self.exit_counts += exit_counts
        self.count += batch_size

    def _thresholds(self) -> Tensor:
        # made once per device: a tensor built from a list on a GPU is a copy the host waits for, at every batch
        device = self.count.device
        if self._thresholds_tensor is None or self._thresholds_tensor.device != device:
            self._thresholds_tensor = torch.tensor(self.thresholds, dtype=torch.float64, device=device)
        return self._thresholds_tensor

    def compute(self) -> dict[str, Tensor]:
        """Return ``{"accuracy": (T,), "exit_counts": (T, L), "speedup": (T,)}``."""
        layer_numbers = torch.tensor(self.layer_numbers, dtype=torch.float64)
        accuracy, exit_counts, speedup = _early_exit_compute(
            self.correct, self.exit_counts, self.count, layer_numbers, self.depth
        )
        return {"accuracy": accuracy, "exit_counts": exit_counts, "speedup": speedup}
