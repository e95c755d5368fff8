"""All analyses in one callback, sharing one source of features and one all-reduce."""

from collections.abc import Sequence
from typing import Any, Optional

from layerwise.callbacks.effective_depth import DEFAULT_EPSILONS, EffectiveDepthFamily
from layerwise.callbacks.logit_lens import DEFAULT_THRESHOLDS, LogitLensFamily
from layerwise.callbacks.monitor import LayerwiseMonitor
from layerwise.callbacks.neural_collapse import NeuralCollapseFamily
from layerwise.callbacks.similarity import CKAEstimator, SimilarityFamily
from layerwise.callbacks.trajectory import TrajectoryFamily


class LayerwiseAnalysis(LayerwiseMonitor):
    """Every layer-wise analysis at once: similarity, logit lens, neural collapse, effective depth, trajectory shape.

    Equivalent to :class:`LayerSimilarityMonitor`, :class:`LogitLensMonitor`, :class:`NeuralCollapseMonitor` and
    :class:`EffectiveDepthMonitor` together, but all families read the same per-batch features and their states
    travel in one all-reduce. Each family can be switched off.

    Writes ``<log_dir>/layerwise/val_epoch_<EEE>_step_<SSSSSSS>.json`` (one per analysed validation) with the keys of
    the JSON summary page (docs/json-format.md), and logs the scalars listed in the callbacks' reference.

    Args:
        similarity: COS and CKA between every pair of layers (:class:`LayerSimilarityMonitor`); False: off.
        logit_lens: the shared head at every layer: accuracy, loss, saturation, early exit (:class:`LogitLensMonitor`).
        neural_collapse: NC1 per layer (:class:`NeuralCollapseMonitor`).
        depth: the ε-effective depth (:class:`EffectiveDepthMonitor`).
        trajectory: the line-shape score and expodistance of the block outputs (``TrajectoryFamily``).
        center: see :class:`LayerSimilarityMonitor`.
        cka: see :class:`LayerSimilarityMonitor`.
        max_buffered_samples: see :class:`LayerSimilarityMonitor`.
        cos_bins: see :class:`LayerSimilarityMonitor`.
        thresholds: early-exit confidences, see :class:`LogitLensMonitor` (default ``DEFAULT_THRESHOLDS``:
            0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99).
        f1: per-layer F1 of class 1, see :class:`LogitLensMonitor` (default: when the datamodule asks for it).
        epsilons: the ε of the effective depth, see :class:`EffectiveDepthMonitor` (default ``DEFAULT_EPSILONS``:
            0.01, 0.05, 0.1).
        nc1_top_classes: restrict NC1 to the most frequent classes (see :class:`NeuralCollapseMonitor`). For a
            language model NC1 runs only when this is set: over a whole vocabulary it is off by default.
        **kwargs: every option of :class:`LayerwiseMonitor`.
    """

    def __init__(
        self,
        similarity: bool = True,
        logit_lens: bool = True,
        neural_collapse: bool = True,
        depth: bool = True,
        trajectory: bool = True,
        center: bool = True,
        cka: CKAEstimator = "exact",
        max_buffered_samples: int = 65536,
        cos_bins: int = 400,
        thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
        epsilons: Sequence[float] = DEFAULT_EPSILONS,
        nc1_top_classes: Optional[int] = None,
        f1: Optional[bool] = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if similarity:
            self.families.append(SimilarityFamily(center, cka, max_buffered_samples, cos_bins))
        lens = LogitLensFamily(thresholds, center, max_buffered_samples, f1) if logit_lens else None
        if lens is not None:
            self.families.append(lens)
        if neural_collapse:
            self.families.append(NeuralCollapseFamily(nc1_top_classes))
        if depth:  # reads the logit lens's accuracy when it runs, instead of accumulating it a second time
            self.families.append(EffectiveDepthFamily(epsilons, accuracy_from=lens))
        if trajectory:
            self.families.append(TrajectoryFamily())
        if not self.families:
            raise ValueError("LayerwiseAnalysis with every family switched off analyses nothing.")
