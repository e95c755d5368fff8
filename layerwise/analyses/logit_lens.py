"""What the model's own head reads from every layer: accuracy, loss, saturation, early exit."""

from collections.abc import Mapping, Sequence
from typing import Any, Optional

from torchmetrics import Metric

from layerwise.analyses.base import Analysis, Metrics, RunModel, Statistic, refuse_runner_options
from layerwise.analyses.layer_spec import LayerSpec, per_layer, shaped
from layerwise.analyses.statistics import layer_accuracy
from layerwise.engines.lens import LensReader
from layerwise.engines.readout import LayerOutputs, Readout
from layerwise.figures.summary import logit_lens_figures
from layerwise.metrics import (
    EarlyExit,
    LayerAccuracy,
    LayerF1,
    LensStatistics,
    SaturationCosine,
    SaturationHistogram,
    saturation_layers,
)

DEFAULT_THRESHOLDS = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)


class LogitLensMonitor(Analysis):
    """The model's own final norm + classifier applied to every layer ("logit lens"), exact over the evaluated set.

    - Accuracy and mean cross-entropy per layer: ``Acc^l = (1/N) Σ_i 1[argmax head(h_i^l) = y_i]``.
    - Saturation layer of a sample: the smallest ``l`` from which the top-1 prediction equals the last layer's at
      every deeper layer. Reported as a histogram over ``l`` and, per ``l``, the mean ``COS(h^l, h^L)`` of the
      samples saturating there (centred as the COS matrix; ``null`` where none saturate).
    - Early exit with the shared head: for each confidence ``τ`` in ``thresholds``, a sample exits at the first
      layer whose max softmax probability reaches ``τ`` (else the last) with that layer's prediction; reports the
      accuracy, exits per layer and ``speedup = Σ_l L·m_l / Σ_l l·m_l``.
    - Multi-exit models also get the separate heads' accuracy/loss per layer (``exit_accuracy``, ``exit_loss``) and
      early exit with the separate heads (``exit_early_exit``: the head of layer ``l`` decides whether to exit at
      ``l``; same thresholds, rule and speedup as the shared head's). ``layerwise sweep`` draws both accuracy-speedup
      curves.
    - Language models (every predicted token a sample) also get ``perplexity`` = exp(loss) per layer.
    - ``f1``: the F1 of class 1 per layer, as GLUE reports for MRPC and QQP. ``None`` (default) reports it when the
      datamodule lists ``"f1"`` in its ``metrics`` (``GLUEDataModule`` does for those tasks).
    - ``kl_to_final``, ``entropy``, ``final_rank`` per layer (``divergence``, default on): the mean ``KL(p_L || p_l)``
      from the final layer's distribution (the deepest selected layer's), the entropy of ``p_l`` (nats), and the
      1-based rank of the final layer's top-1 class in ``p_l`` (of the final prediction, not of the target), from
      float64 sums (:class:`~layerwise.metrics.LensStatistics`). They need every layer's logits beside the final
      layer's: the head reads the selected layers once more (``(L + 1) / L`` of the evaluation's head cost).
    - ``lens``: ``"logit"`` (default) reads every layer as the module does (the shared head; a ``TunedLens`` fit
      through its own translators); a tuned lens file (``tuned_lens.safetensors`` of a ``TunedLens`` fit) reads every
      layer through its translators and the model's head instead, for every quantity above (the effective depth
      still reads the model's own head).

    ``thresholds`` default to ``DEFAULT_THRESHOLDS``: 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99.

    With ``layers`` selecting a subset, saturation and early exit run over the selected layers (the deepest selected
    layer playing the last), and ``l`` in the speedup is the real layer number.

    Logged: ``val/acc/layer_XX``, ``val/loss/layer_XX``, ``val/saturation/layer_XX`` (fraction of samples),
    ``val/exit_acc/layer_XX``, ``val/early_exit/{accuracy,speedup}/tau_T``,
    ``val/exit_early_exit/{accuracy,speedup}/tau_T``; images ``val/saturation``, ``val/early_exit``. JSON keys:
    ``accuracy``, ``loss``, ``saturation_counts``, ``saturation_cos``, ``early_exit`` (list of ``threshold``,
    ``accuracy``, ``exit_counts``, ``speedup``); ``exit_accuracy``, ``exit_loss`` and ``exit_early_exit`` (same
    format as ``early_exit``) for multi-exit models; ``perplexity`` and
    ``val/perplexity/layer_XX`` for language models; ``f1`` and ``val/f1/layer_XX`` when F1 is reported;
    ``kl_to_final``, ``entropy``, ``final_rank`` and ``val/<key>/layer_XX`` with ``divergence`` or a lens file.
    """

    name = "logit_lens"
    provides = (
        "accuracy",
        "loss",
        "perplexity",
        "f1",
        "saturation_counts",
        "saturation_cos",
        "early_exit",
        "kl_to_final",
    )
    figures = staticmethod(logit_lens_figures)

    def __init__(
        self,
        thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
        center: bool = True,
        max_buffered_samples: int = 65536,
        f1: Optional[bool] = None,
        lens: str = "logit",
        divergence: bool = True,
        **refused: Any,
    ) -> None:
        refuse_runner_options(type(self).__name__, refused)
        self.lens, self.divergence = str(lens), bool(divergence)
        self._reader = LensReader(self.lens)  # a tuned lens file is read (and checked) here, before any work
        self._model: Optional[RunModel] = None
        self._attached = False
        self._memo: Optional[tuple[LayerOutputs, Readout]] = None
        if not isinstance(thresholds, Sequence) or isinstance(thresholds, str):
            raise ValueError(
                f"LogitLensMonitor(thresholds={thresholds!r}): give a list of confidences in [0, 1], "
                f"e.g. [{thresholds}]."
            )
        thresholds = [float(value) for value in thresholds]
        if not thresholds or any(not 0.0 <= value <= 1.0 for value in thresholds):
            raise ValueError(
                f"LogitLensMonitor(thresholds={thresholds}): give a non-empty list of confidences in [0, 1]."
            )
        self.thresholds = thresholds
        self.center = center
        self.max_buffered_samples = max_buffered_samples
        self.f1 = f1
        self._report_f1 = bool(f1)

    def use_model(self, model: RunModel) -> None:
        self._model, self._attached, self._memo = model, False, None

    def _read(self, batch: LayerOutputs) -> Readout:
        """The lens's readout of a group of batches (every layer beside the final one), once however many read it."""
        if self._memo is not None and self._memo[0] is batch:
            return self._memo[1]
        if not self._attached:
            assert self._model is not None, "LayerwiseAnalysis hands the model over before the first batch"
            spec = self.spec
            self._reader.attach(self._model.module, self._model.tap, spec.layer_numbers, spec.depth, spec.dim)
            self._attached = True
        readout = self._reader.read(batch.features, batch.targets)
        self._memo = (batch, readout)
        return readout

    def _readout_of(self) -> Any:
        """How every statistic reads a batch: the step's own readout, or the lens file's."""
        if self.lens == "logit":
            return lambda batch: batch.readout
        return self._read

    def configure(self, spec: LayerSpec, datamodule: Any) -> None:
        data_metrics = getattr(datamodule, "metrics", ())
        self._report_f1 = "f1" in data_metrics if self.f1 is None else self.f1
        if self._report_f1 and spec.num_classes != 2:
            raise ValueError(
                f"`f1=True` reports the F1 of class 1 of a binary task; this model has {spec.num_classes} classes."
            )

    def statistics(self, spec: LayerSpec) -> dict[str, Statistic]:
        layers, center, buffered, thresholds = spec.num_layers, self.center, self.max_buffered_samples, self.thresholds
        early_exit = dict(layer_numbers=spec.layer_numbers, depth=spec.depth, sync_on_compute=False)
        read = self._readout_of()
        own = self.lens == "logit"
        lens = "" if own else f", lens={self.lens}"  # statistics of another reading are not shared with the head's
        statistics = {
            "accuracy": layer_accuracy(spec)
            if own
            else Statistic(
                f"accuracy(lens={self.lens})",
                lambda: LayerAccuracy(layers, sync_on_compute=False),
                lambda metric, batch: metric.update(read(batch), batch.targets),
            ),
            "exit_accuracy": Statistic(
                "exit_accuracy", lambda: LayerAccuracy(layers, sync_on_compute=False), _feed_exit_heads
            ),
            "saturation_cos": Statistic(
                f"saturation_cos(center={center}, max_buffered_samples={buffered}{lens})",
                lambda: SaturationCosine(layers, center, buffered, dim=spec.dim, sync_on_compute=False),
                lambda metric, batch: _feed_saturation_cos(metric, batch, read(batch)),
            ),
            # counts over every sample; SaturationCosine averages over the (possibly subsampled) rows it sees
            "histogram": Statistic(
                "saturation_histogram" if own else f"saturation_histogram(lens={self.lens})",
                lambda: SaturationHistogram(layers, sync_on_compute=False),
                lambda metric, batch: metric.update(read(batch)),
            ),
            "early_exit": Statistic(
                f"early_exit(thresholds={thresholds}{lens})",
                lambda: EarlyExit(layers, thresholds, **early_exit),
                lambda metric, batch: metric.update(read(batch), batch.targets),
            ),
            "exit_early_exit": Statistic(
                f"exit_early_exit(thresholds={thresholds})",
                lambda: EarlyExit(layers, thresholds, **early_exit),
                _feed_exit_heads,
            ),
        }
        if self._report_f1:
            statistics["f1"] = Statistic(
                "f1" if own else f"f1(lens={self.lens})",
                lambda: LayerF1(layers, sync_on_compute=False),
                lambda metric, batch: metric.update(read(batch), batch.targets),
            )
        if self.divergence or not own:  # every layer read again beside the final one: the lens's own readout
            statistics["lens"] = Statistic(
                f"lens_statistics(lens={self.lens})",
                lambda: LensStatistics(layers, sync_on_compute=False),
                lambda metric, batch: metric.update(self._read(batch)),
            )
        return statistics

    def results(self, metrics: Metrics, earlier: Mapping[str, Any]) -> dict[str, Any]:
        spec = self.spec
        layers = spec.num_layers
        accuracy = metrics["accuracy"].compute()
        loss = shaped(accuracy["loss"], layers)
        results = {
            "accuracy": shaped(accuracy["accuracy"], layers),
            "loss": loss,
            **({"perplexity": loss.exp()} if spec.token_level else {}),
            **({"f1": shaped(metrics["f1"].compute(), layers)} if "f1" in metrics else {}),
            "saturation_counts": shaped(metrics["histogram"].compute(), layers).round().long(),
            "saturation_cos": shaped(metrics["saturation_cos"].compute(), layers),
            "early_exit": self._early_exit_rows(metrics["early_exit"]),
        }
        self._memo = None  # the last group is not held until the next evaluation
        if "lens" in metrics:
            results.update({name: shaped(value, layers) for name, value in metrics["lens"].compute().items()})
        # Whether any rank saw separate exit heads is itself global: the reduced count is non-zero.
        exit_heads: Any = metrics["exit_accuracy"]
        if float(exit_heads.count) > 0:
            exit_accuracy = exit_heads.compute()
            results["exit_accuracy"] = shaped(exit_accuracy["accuracy"], layers)
            results["exit_loss"] = shaped(exit_accuracy["loss"], layers)
            results["exit_early_exit"] = self._early_exit_rows(metrics["exit_early_exit"])
        return results

    def _early_exit_rows(self, metric: Metric) -> list[dict[str, Any]]:
        """One JSON row per threshold: ``threshold``, ``accuracy``, ``exit_counts`` (per layer), ``speedup``."""
        early_exit = metric.compute()
        count = len(self.thresholds)
        accuracy, speedup = shaped(early_exit["accuracy"], count), shaped(early_exit["speedup"], count)
        exit_counts = shaped(early_exit["exit_counts"], count, -1)
        return [
            {
                "threshold": threshold,
                "accuracy": float(accuracy[i]),
                "exit_counts": exit_counts[i].round().long().tolist(),
                "speedup": float(speedup[i]),
            }
            for i, threshold in enumerate(self.thresholds)
        ]

    def layer_scalars(self, results: Mapping[str, Any]) -> dict[str, float]:
        spec = self.spec
        scalars = per_layer(results["accuracy"], spec, "acc")
        scalars.update(per_layer(results["loss"], spec, "loss"))
        if "f1" in results:
            scalars.update(per_layer(results["f1"], spec, "f1"))
        if "perplexity" in results:
            scalars.update(per_layer(results["perplexity"], spec, "perplexity"))
        for key in ("kl_to_final", "entropy", "final_rank"):
            if key in results:
                scalars.update(per_layer(results[key], spec, key))
        total = max(1, int(results["saturation_counts"].sum()))
        scalars.update(per_layer(results["saturation_counts"].double() / total, spec, "saturation"))
        if "exit_accuracy" in results:
            scalars.update(per_layer(results["exit_accuracy"], spec, "exit_acc"))
        for key in ("early_exit", "exit_early_exit"):
            for row in results.get(key, ()):
                name = f"tau_{row['threshold']:g}"
                scalars[f"{key}/accuracy/{name}"] = row["accuracy"]
                scalars[f"{key}/speedup/{name}"] = row["speedup"]
        return scalars

    def layer_charts(self) -> dict[str, str]:
        return {
            "accuracy per layer": r"acc/layer_\d+",
            "loss per layer": r"loss/layer_\d+",
            "perplexity per layer": r"perplexity/layer_\d+",
            "F1 per layer": r"f1/layer_\d+",
            "KL to the final layer per layer": r"kl_to_final/layer_\d+",
            "entropy per layer": r"entropy/layer_\d+",
            "rank of the final prediction per layer": r"final_rank/layer_\d+",
            "saturation per layer": r"saturation/layer_\d+",
            "exit-head accuracy per layer": r"exit_acc/layer_\d+",
            "early-exit accuracy": r"early_exit/accuracy/.*",
            "early-exit speedup": r"early_exit/speedup/.*",
            "exit-head early-exit accuracy": r"exit_early_exit/accuracy/.*",
            "exit-head early-exit speedup": r"exit_early_exit/speedup/.*",
        }


def _feed_saturation_cos(metric: Any, batch: LayerOutputs, readout: Readout) -> None:
    """The COS to the last layer of the rows COS reads, grouped by the layer each sample saturates at."""
    saturation = saturation_layers(readout.predictions)
    if batch.sampled is not None:
        saturation = saturation[batch.sampled]
    metric.update(batch.sampled_features, saturation)


def _feed_exit_heads(metric: Any, batch: LayerOutputs) -> None:
    """A multi-exit model's separate heads (nothing for a model without them)."""
    if batch.exit_readout is not None:
        metric.update(batch.exit_readout, batch.targets)
