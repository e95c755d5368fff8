"""Where the figures and per-layer charts go: one sink per logger of the trainer, each through its own public API.

=================================  ==========================================  ====================================
logger                             figures (rendered once, RGB uint8 arrays)   per-layer charts
=================================  ==========================================  ====================================
``TensorBoardLogger`` (any logger  ``SummaryWriter.add_image``                 a run per layer (:class:`LayerRuns`),
whose experiment has ``add_image``)                                             Custom Scalars (``write_charts``) and
                                                                                a chart image per quantity (below)
``WandbLogger``                    ``WandbLogger.log_image``                   ``wandb.plot.line_series`` per quantity
``MLFlowLogger``                   ``MlflowClient.log_image(key=, step=)``     its metrics, layer in the key
``CSVLogger``, no logger, any      PNG files under                             the CSV's columns
other (``CometLogger``,            ``<run folder>/layerwise/images/``
``LitLogger``)
=================================  ==========================================  ====================================

Threads: the drawing thread (``_drawing.py``) renders every figure once and hands the array to each sink. A sink marked
``on_main_thread`` gets it on the training loop's thread instead, at the next :func:`~._drawing.draw_later` or at
:func:`~._drawing.wait_for_figures` (teardown, exception): ``wandb.log`` is not thread-safe (its maintainers say so,
wandb issue 1824; ``Run._log`` advances the run's step without a lock). TensorBoard's ``SummaryWriter`` queues events
under a lock (the design before the other loggers came); ``MlflowClient`` calls are stateless calls into the tracking
store and artifact repository (MLflow's own asynchronous logging makes them from its worker threads), given a run id
resolved on the main thread; the PNG files are layerwise's own.

TensorBoard colours runs, not tags: its Custom Scalars draw all layers of a chart in the run's one colour, told apart
only by a marker, the legend folded away. So each per-layer scalar (``val/acc/layer_03``) is also written to a run of
its layer, ``<run folder>/layers/layer_03/``, under the tag ``val/acc/layers`` (a tag the run itself never logs, so
that a chart of it holds exactly the layers, not the model's own ``val/acc`` beside them), as
``SummaryWriter.add_scalars`` writes its series: the Scalars tab then draws one chart per quantity with a line per
layer, each in its run's colour, the run (the layer) in the tooltip and the run selector (:class:`LayerRuns`, global
rank zero); the Custom Scalars' per-layer charts read those runs too (:func:`custom_scalars_regex`), a colour per
layer there as well. Scalars per threshold (``val/early_exit/accuracy/tau_0.9``, ``.../eps_0.05``) go the same way to
``<run folder>/thresholds/tau_0.9/`` under ``val/early_exit/accuracy/thresholds``: a line per τ in its own colour.
:func:`log_tensorboard_charts` also logs each chart as an image (``figures/curves.py``: the figures' colour per layer
and a legend) under ``layerwise <stage>/<title>``, the Custom Scalars' section and chart names: one image per chart at
each figure epoch, drawn off the loop like the figures, at a journal column's width (3.3 in, 7-8 pt text, 100 dpi):
TensorBoard shows an image about 330 px wide, where a page-wide chart's text shrank to 5 px.
"""

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from layerwise.errors import LayerwiseWarning
from layerwise.results import WriteError, write_atomic


@dataclass(frozen=True)
class ImageSink:
    """One destination of the figures: ``log(tag, image, step)`` with an (H, W, 3) uint8 ``image``."""

    name: str
    log: Callable[[str, np.ndarray, int], None]
    on_main_thread: bool = False


def image_sinks(trainer: Trainer) -> list[ImageSink]:
    """Every logger of the trainer that can take images, and PNG files where a logger cannot (global rank zero).

    Called on the main thread: the loggers' experiments and runs are resolved here, not on the drawing thread.
    """
    sinks: list[ImageSink] = []
    folders: list[str] = []
    for logger in trainer.loggers:
        if isinstance(logger, WandbLogger):
            sinks.append(_wandb_images(logger))
        elif isinstance(logger, MLFlowLogger):
            sinks.append(_mlflow_images(logger))
        elif isinstance(logger, CSVLogger):
            folders.append(logger.log_dir)
        elif hasattr(getattr(logger, "experiment", None), "add_image"):
            sinks.append(_tensorboard_images(logger.experiment))
        else:
            folders.append(run_folder(trainer))
    if not trainer.loggers:
        folders.append(run_folder(trainer))
    sinks.extend(_png_files(folder) for folder in dict.fromkeys(folders))
    return sinks


def tensorboards(trainer: Trainer) -> list[Any]:
    """The experiments of every TensorBoard-like logger (``SummaryWriter``: ``add_image``, ``add_custom_scalars``)."""
    experiments = []
    for logger in trainer.loggers:
        if isinstance(logger, (WandbLogger, MLFlowLogger, CSVLogger)):
            continue
        experiment = getattr(logger, "experiment", None)
        if hasattr(experiment, "add_custom_scalars"):
            experiments.append(experiment)
    return experiments


def wandb_loggers(trainer: Trainer) -> list[WandbLogger]:
    """The trainer's W&B loggers."""
    return [logger for logger in trainer.loggers if isinstance(logger, WandbLogger)]


def chart_loggers(trainer: Trainer) -> list[Any]:
    """The loggers that get per-layer charts from a stage's scalar history: W&B's and TensorBoard's experiments."""
    return [*wandb_loggers(trainer), *tensorboards(trainer)]


def run_folder(trainer: Trainer) -> str:
    """``trainer.log_dir`` without its broadcast (a collective; this runs on global rank zero only)."""
    first = trainer.loggers[0] if trainer.loggers else None
    if first is None:
        folder = trainer.default_root_dir
    elif isinstance(first, (TensorBoardLogger, CSVLogger)):
        folder = first.log_dir
    else:
        folder = first.save_dir
    return str(folder or trainer.default_root_dir)


LAYER_TAG = re.compile(r"(?P<tag>.+)/(?P<layer>layer_\d+)")  # a per-layer scalar: val/acc/layer_03
THRESHOLD_TAG = re.compile(r"(?P<tag>.+)/(?P<layer>(?:tau|eps)_[0-9.e+-]+)")  # a scalar per τ or ε: .../tau_0.9
PER_LAYER = r"/layer_\d+"  # how a per-layer chart's regex ends (``acc/layer_\d+``)
# the tag of a quantity in the series' runs: never one the run itself logs (val/acc is the model's own last layer)
SERIES_SUFFIX = {"layers": "/layers", "thresholds": "/thresholds"}


class LayerRuns:
    """One TensorBoard run per layer beside each TensorBoard run of the trainer, for a line per layer on one chart.

    ``log`` writes every per-layer scalar ``<tag>/layer_XX`` as ``<tag>/layers`` at ``step`` into the run
    ``<run folder>/layers/layer_XX/`` (and every ``<tag>/tau_T`` or ``<tag>/eps_E`` as ``<tag>/thresholds`` into
    ``<run folder>/thresholds/tau_T/``) of each TensorBoard logger (its own ``SummaryWriter``, flushed after each
    evaluation, so that a running TensorBoard shows it); ``close`` flushes and closes them (teardown, exception; a
    later ``log`` opens them again, as a ``test`` after a ``fit`` does). Global rank zero only, main thread.
    """

    def __init__(self) -> None:
        self._writers: dict[Path, Any] = {}

    def log(self, trainer: Trainer, scalars: dict[str, Any], step: int) -> None:
        """Write the per-layer ones of ``scalars`` (tag -> number) to the layer runs of every TensorBoard logger."""
        layers: dict[tuple[str, str], dict[str, float]] = {}
        for tag, value in scalars.items():
            for kind, pattern in (("layers", LAYER_TAG), ("thresholds", THRESHOLD_TAG)):
                match = pattern.fullmatch(tag)
                if match:
                    layers.setdefault((kind, match["layer"]), {})[match["tag"] + SERIES_SUFFIX[kind]] = float(value)
        folders = [folder for folder in map(_tensorboard_folder, tensorboards(trainer)) if folder is not None]
        for folder in dict.fromkeys(folders) if layers else ():
            for (kind, layer), values in sorted(layers.items()):
                writer = self._writer(folder / kind / layer)
                for tag, value in values.items():
                    writer.add_scalar(tag, value, global_step=step)
                writer.flush()

    def close(self) -> None:
        """Flush and close every layer run's writer."""
        writers, self._writers = self._writers, {}
        for writer in writers.values():
            writer.close()

    def _writer(self, folder: Path) -> Any:
        if folder not in self._writers:
            from torch.utils.tensorboard import SummaryWriter

            self._writers[folder] = SummaryWriter(log_dir=str(folder))
        return self._writers[folder]


def custom_scalars_regex(regex: str, tags: Optional[list[str]] = None) -> str:
    r"""A chart's tag regex for the Custom Scalars: a per-layer chart (``val/acc/layer_\d+``) draws the layer runs' tag.

    ``^val/acc/layers$`` matches that tag in every layer's run (:class:`LayerRuns`) and in no other run, so the
    Custom Scalars draw exactly a line per layer, each in its run's colour, the layers named in the run list. A chart
    whose logged ``tags`` (those the regex matches) are all per threshold (``val/early_exit/accuracy/.*``: ``tau_T``)
    draws the threshold runs' tag the same way, a line per τ in its own colour; any other keeps the run's own tags.
    """
    if regex.endswith(PER_LAYER):
        return f"^{regex[: -len(PER_LAYER)]}{SERIES_SUFFIX['layers']}$"
    matched = [tag for tag in tags or () if re.fullmatch(regex, tag)]
    if regex.endswith("/.*") and matched and all(THRESHOLD_TAG.fullmatch(tag) for tag in matched):
        return f"^{regex[: -len('/.*')]}{SERIES_SUFFIX['thresholds']}$"
    return regex


def _tensorboard_folder(experiment: Any) -> Optional[Path]:
    """The run folder of a TensorBoard experiment (torch's ``SummaryWriter.log_dir``, tensorboardX's ``logdir``)."""
    folder = getattr(experiment, "log_dir", None) or getattr(experiment, "logdir", None)
    return Path(folder) if isinstance(folder, (str, Path)) else None


def _tensorboard_images(experiment: Any) -> ImageSink:
    def log(tag: str, image: np.ndarray, step: int) -> None:
        experiment.add_image(tag, image, global_step=step, dataformats="HWC")

    folder = getattr(experiment, "log_dir", None)
    return ImageSink("TensorBoard" + (f" ({folder})" if folder else ""), log)


def _wandb_images(logger: WandbLogger) -> ImageSink:
    def log(tag: str, image: np.ndarray, step: int) -> None:
        logger.log_image(key=tag, images=[image], step=step)

    return ImageSink("W&B", log, on_main_thread=True)


def _mlflow_images(logger: MLFlowLogger) -> ImageSink:
    client, run_id = logger.experiment, logger.run_id  # on the main thread: the run exists before the worker logs

    def log(tag: str, image: np.ndarray, step: int) -> None:
        client.log_image(run_id, image, key=mlflow_key(tag), step=step)

    return ImageSink("MLflow", log)


def mlflow_key(tag: str) -> str:
    """``tag`` in MLflow's key charset (alphanumerics, ``_ - . /`` and space), the others dropped as from metric keys.

    Lightning's MLFlowLogger drops them from the metrics' keys the same way: an image and its metrics share a prefix.
    """
    return re.sub(r"[^a-zA-Z0-9_\-./ ]+", "", tag)


def _png_files(folder: str) -> ImageSink:
    """PNG files under ``<folder>/layerwise/images/``; one that cannot be written (a full disk) is skipped.

    A figure is not worth a run: the first failure is warned once (the path and the cause), later ones are skipped
    quietly, and the fit goes on (a summary or a checkpoint that cannot be written stops it).
    """
    root = Path(folder) / "layerwise" / "images"

    def log(tag: str, image: np.ndarray, step: int) -> None:
        from PIL import Image

        parts = [re.sub(r"[^\w.-]+", "_", part) for part in tag.split("/") if part not in ("", ".", "..")]
        path = _unused(root.joinpath(*parts[:-1], f"{parts[-1]}_step_{step:07d}.png"))
        try:
            write_atomic(path, lambda file: Image.fromarray(image).save(file, format="png"))
        except WriteError as error:
            if root not in _UNWRITABLE:  # once per run folder, for every analysis callback's sink together
                _UNWRITABLE.add(root)
                rank_zero_warn(
                    f"layerwise: {error} The run goes on; figures that cannot be written are skipped from now on "
                    f"(`layerwise plot` draws them from the summaries later).",
                    category=LayerwiseWarning,
                )

    return ImageSink(f"PNG files in {root}/", log)


_UNWRITABLE: set[Path] = set()  # the figure folders whose failed writes were warned of


def _unused(path: Path) -> Path:
    """``path``, or ``<stem>_2.png``, ``_3``, ... when taken (a second validation at one step): never overwritten."""
    candidate, number = path, 1
    while candidate.exists():
        number += 1
        candidate = path.with_name(f"{path.stem}_{number}{path.suffix}")
    return candidate


# -- per-layer charts for W&B -------------------------------------------------------------------------------------

# The scalars of every analysed evaluation of one stage so far, as the run's analysis callbacks keep them
# (``lifecycle.RunRecord.history``): tag -> [(global step, value)].
History = dict[str, list[tuple[int, float]]]


def chart_series(history: History, charts: dict[str, str]) -> dict[str, dict[str, list[tuple[int, float]]]]:
    r"""Each chart's finite points from one stage's ``history``: title -> tag -> [(global step, value)].

    ``charts`` maps a title to the regex of its tags (``val/acc/layer_\d+``); a chart without a point is left out.
    """
    found = {}
    logged = sorted(history.items())
    for title, regex in charts.items():
        series = {tag: points for tag, points in logged if re.fullmatch(regex, tag)}
        series = {tag: [(x, y) for x, y in points if math.isfinite(y)] for tag, points in series.items()}
        series = {tag: points for tag, points in series.items() if points}
        if series:
            found[title] = series
    return found


def log_layer_charts(trainer: Trainer, stage: str, charts: dict[str, str], history: History) -> None:
    r"""Per quantity one W&B line plot with one series per layer over the global step (as TensorBoard's Custom Scalars).

    ``charts`` maps a title to the regex of its tags (``val/acc/layer_\d+``); each plot is logged under
    ``layerwise <stage>/<title>`` (the section and chart names of the Custom Scalars layout) from the stage's
    ``history``, again at every figure epoch with the whole history (W&B shows the latest). Main thread only.
    """
    loggers = wandb_loggers(trainer)
    if not loggers:
        return
    import wandb

    plots = {}
    for title, series in chart_series(history, charts).items():
        plots[f"layerwise {stage}/{title}"] = wandb.plot.line_series(
            xs=[[x for x, _ in points] for points in series.values()],
            ys=[[y for _, y in points] for points in series.values()],
            keys=[tag.rsplit("/", 1)[-1] for tag in series],
            title=f"{stage} {title}",
            xname="trainer/global_step",
        )
    for logger in loggers:
        if plots:
            logger.experiment.log(dict(plots))


def log_tensorboard_charts(trainer: Trainer, stage: str, charts: dict[str, str], history: History) -> None:
    r"""Per quantity one image in every TensorBoard of the trainer: a line per layer over the global step.

    Each layer in its colour and a legend (what the Custom Scalars lack), drawn off the loop as the figures are.
    ``charts`` as for :func:`log_layer_charts`; each image is logged under ``layerwise <stage>/<title>`` at the
    latest step of the stage's ``history``, again at every figure epoch with the whole history. Main thread only.
    """
    from layerwise.callbacks._drawing import FigureJob, draw_later, figures_in_process
    from layerwise.figures.curves import tensorboard_chart_figures

    sinks = [_tensorboard_images(experiment) for experiment in tensorboards(trainer)]
    found = chart_series(history, charts) if sinks else {}
    if not found:
        return
    step = max(x for series in found.values() for points in series.values() for x, _ in points)
    draw_later(sinks, step, FigureJob(tensorboard_chart_figures, (stage, found)), in_process=figures_in_process())
