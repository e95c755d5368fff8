"""All per-layer analyses in one callback, sharing one source of features and one all-reduce."""

from collections.abc import Sequence
from typing import Any, ClassVar, Union

from layerwise.callbacks.effective_depth import EffectiveDepthMonitor
from layerwise.callbacks.logit_lens import LogitLensMonitor
from layerwise.callbacks.monitor import LayerwiseMonitor
from layerwise.callbacks.neural_collapse import NeuralCollapseMonitor
from layerwise.callbacks.similarity import LayerSimilarityMonitor
from layerwise.callbacks.trajectory import TrajectoryMonitor
from layerwise.errors import UsageError


class LayerwiseAnalysis(LayerwiseMonitor):
    """Every layer-wise analysis at once: similarity, logit lens, neural collapse, effective depth, trajectory shape.

    Runs the per-layer analyses on one feature source: every analysis reads the same per-batch features and their
    states travel in one all-reduce. Each is ``True`` (its defaults), ``False`` (off) or the analysis itself with its
    own options, which are declared once, in its class, e.g. ``logit_lens=LogitLensMonitor(thresholds=[0.9])`` (in a
    config: ``logit_lens: {thresholds: [0.9]}``; on the command line
    ``--trainer.callbacks.logit_lens.thresholds=[0.9]``). A composed analysis runs on this callback's features, so
    the options of :class:`LayerwiseMonitor` (``layers``, ``every_n_epochs``, ...) are given here, not to it.

    Writes ``<log_dir>/layerwise/val_epoch_<EEE>_step_<SSSSSSS>.json`` (one per analysed validation) with the keys of
    the JSON summary page (docs/json-format.md), and logs the scalars listed in the callbacks' reference.

    Args:
        similarity: COS and CKA between every pair of layers (:class:`LayerSimilarityMonitor`: ``center``, ``cka``,
            ``max_buffered_samples``, ``cos_bins``).
        logit_lens: the shared head at every layer: accuracy, loss, saturation, early exit (:class:`LogitLensMonitor`:
            ``thresholds``, ``center``, ``max_buffered_samples``, ``f1``).
        neural_collapse: NC1 per layer (:class:`NeuralCollapseMonitor`: ``top_classes``; ``complete`` for CDNV, NC2
            and NC3, ``ncc`` for NC4). For a language model NC1 runs only when ``top_classes`` is set: over a whole
            vocabulary it is off by default.
        depth: the ε-effective depth (:class:`EffectiveDepthMonitor`: ``epsilons``); it reads the logit lens's
            accuracy when the lens runs.
        trajectory: the line-shape score and expodistance of the block outputs (:class:`TrajectoryMonitor`).
        more: further per-layer analyses of your own (subclasses of :class:`LayerwiseMonitor`), run on the same
            features after these.
        **kwargs: every option of :class:`LayerwiseMonitor`.
    """

    # Options LayerwiseAnalysis took until 0.2.0, and where each went: the command line's error names it
    moved_options: ClassVar[dict[str, str]] = {
        "thresholds": "logit_lens: {thresholds: [...]}",
        "f1": "logit_lens: {f1: ...}",
        "cka": "similarity: {cka: ...}",
        "cos_bins": "similarity: {cos_bins: ...}",
        "center": "similarity: {center: ...} and logit_lens: {center: ...}",
        "max_buffered_samples": "similarity: {max_buffered_samples: ...} and logit_lens: {max_buffered_samples: ...}",
        "epsilons": "depth: {epsilons: [...]}",
        "nc1_top_classes": "neural_collapse: {top_classes: ...}",
    }

    def __init__(
        self,
        similarity: Union[bool, LayerSimilarityMonitor] = True,
        logit_lens: Union[bool, LogitLensMonitor] = True,
        neural_collapse: Union[bool, NeuralCollapseMonitor] = True,
        depth: Union[bool, EffectiveDepthMonitor] = True,
        trajectory: Union[bool, TrajectoryMonitor] = True,
        more: Sequence[LayerwiseMonitor] = (),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        chosen: dict[str, tuple[Union[bool, LayerwiseMonitor], type[LayerwiseMonitor]]] = {
            "similarity": (similarity, LayerSimilarityMonitor),
            "logit_lens": (logit_lens, LogitLensMonitor),
            "neural_collapse": (neural_collapse, NeuralCollapseMonitor),
            "depth": (depth, EffectiveDepthMonitor),
            "trajectory": (trajectory, TrajectoryMonitor),
        }
        analyses: list[LayerwiseMonitor] = []
        for name, (value, kind) in chosen.items():
            if value is True:
                analyses.append(kind())
            elif isinstance(value, kind):
                analyses.append(value)
            elif value is not False:
                raise ValueError(f"`{name}={value!r}` must be True, False or a {kind.__name__}.")
        for analysis in more:
            if not isinstance(analysis, LayerwiseMonitor) or isinstance(analysis, LayerwiseAnalysis):
                raise ValueError(f"`more` takes per-layer analyses (LayerwiseMonitor subclasses), not {analysis!r}.")
            analyses.append(analysis)
        for analysis in analyses:
            if analysis.monitor_options:
                given = ", ".join(f"{name}={value!r}" for name, value in analysis.monitor_options.items())
                raise UsageError(
                    f"LayerwiseAnalysis runs its {type(analysis).__name__} on its own features: give {given} to "
                    "LayerwiseAnalysis, not to the analysis."
                )
        if not analyses:
            raise ValueError("LayerwiseAnalysis with every analysis switched off analyses nothing.")
        self._analyses = analyses

    @property
    def analyses(self) -> Sequence[LayerwiseMonitor]:
        return self._analyses
