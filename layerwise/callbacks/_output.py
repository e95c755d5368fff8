"""Where the analysis goes besides the JSON: every logger's charts and figures, and the optional saved features."""

from collections.abc import Callable
from pathlib import Path
from typing import Any, Optional

import torch
from lightning.pytorch import Trainer
from lightning.pytorch.utilities.rank_zero import WarningCache
from torch import Tensor

from layerwise._compat import already_reduced
from layerwise.analyses.layer_spec import LayerSpec
from layerwise.callbacks._drawing import draw_later, figures_in_process
from layerwise.callbacks._loggers import image_sinks, tensorboards
from layerwise.engines.readout import LayerOutputs
from layerwise.errors import LayerwiseWarning
from layerwise.figures.style import stage_name
from layerwise.results import summary_path, write_atomic


def log_scalars(trainer: Trainer, pl_module: Any, scalars: dict[str, Any]) -> None:
    """Log already-global values through Lightning, at ``trainer.global_step`` like the summary and the figures.

    Through Lightning, so that ``ModelCheckpoint(monitor=...)``, ``EarlyStopping`` and every logger see them; no
    sync (the states were reduced before), so no collective per scalar. Lightning files a validation's epoch-end
    values under its count of finished training batches, one behind ``global_step`` during a fit (the validation
    runs before that count is raised): the ``step`` value it reads from the logged metrics (its documented override,
    ``LoggerConnector.log_metrics``) puts them at the step the JSON summary, the figures and the console name. As
    host tensors: Lightning would copy each number to the module's device only for the loggers to read it back.
    """
    if not scalars:
        return
    values = {**scalars, "step": trainer.global_step}
    already_reduced(values)
    tensors = torch.tensor([float(v) for v in values.values()], dtype=torch.get_default_dtype()).unbind()
    pl_module.log_dict(
        dict(zip(values, tensors)), sync_dist=False, on_step=False, on_epoch=True, add_dataloader_idx=False
    )


def show(trainer: Trainer, text: str) -> None:
    """Print above the progress bar when there is one (Lightning's bars have ``print``), else to stdout."""
    bar = trainer.progress_bar_callback
    if bar is not None and hasattr(bar, "print"):
        bar.print(text)
    else:
        print(text, flush=True)


def layer_table(stage: str, epoch: int, step: int, results: dict[str, Any], spec: LayerSpec) -> str:
    """The numbers a user came for, one row per layer: accuracy, COS and CKA to the last layer, NC1."""

    def column(key: str, last: bool = False) -> Optional[list[Any]]:
        value = results.get(key)
        if value is None:
            return None
        rows = value.tolist() if hasattr(value, "tolist") else value
        return [row[-1] for row in rows] if last else rows

    columns = {
        "accuracy": column("accuracy"),
        "COS to last": column("cos", last=True),
        "CKA to last": column("cka", last=True),
        "NC1": column("nc1"),
    }
    columns = {name: values for name, values in columns.items() if values is not None}
    header = "layer " + "".join(f"{name:>13}" for name in columns)
    lines = [f"layerwise {stage_name(stage)}, epoch {epoch}, step {step}:", header]
    for row, number in enumerate(spec.layer_numbers):
        cells = "".join(f"{_cell(values[row]):>13}" for values in columns.values())
        lines.append(f"{number:>5} {cells}")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    return "-" if value is None or value != value else f"{float(value):.4f}"


def write_charts(trainer: Trainer, layout: dict[str, dict[str, list]]) -> None:
    """Write the Custom Scalars layout to every TensorBoard logger.

    W&B gets the same charts as line plots at the figure epochs (``AnalysisCallback``); MLflow and CSV have no
    multi-line chart of their own: their per-layer metrics carry the layer in the key (``val/acc/layer_03``).
    """
    if layout:
        for experiment in tensorboards(trainer):
            experiment.add_custom_scalars(layout)


def log_figures_later(trainer: Trainer, figures: Callable[[], dict[str, Any]]) -> None:
    """Log ``figures()`` (tag -> matplotlib figure) as images at the trainer's global step, drawn off the loop.

    The one door from the callbacks to the loggers' images: every logger of the trainer that takes images receives
    them through its own API, PNG files in the run folder stand in for those that do not (CSV, no logger);
    :mod:`layerwise.callbacks._loggers` decides. A :class:`~layerwise.figures.worker.FigureJob` is drawn in the
    drawing process (see :mod:`layerwise.callbacks._drawing`). The figures say their stage, epoch and step
    themselves: a job of :mod:`layerwise.figures.summary` stamps them from the summary.
    """
    draw_later(image_sinks(trainer), trainer.global_step, figures, in_process=figures_in_process())


class FeatureSaver:
    """Keeps the evaluated features of an epoch in CPU memory and writes them once, merged over ranks in order."""

    def __init__(self) -> None:
        self.indices: Optional[list[int]] = None
        self._saved: dict[str, list[Tensor]] = {}

    def keep(self, batch: LayerOutputs) -> None:
        """Add one batch (the sampled rows)."""
        rows = slice(None) if batch.sampled is None else batch.sampled
        parts = {
            "features": batch.sampled_features.float(),
            "labels": batch.targets[rows],
            "predictions": batch.readout.predictions[:, rows],
            "max_prob": batch.readout.max_prob[:, rows].float(),
        }
        for key, value in parts.items():
            self._saved.setdefault(key, []).append(value.detach().cpu())

    def write(self, trainer: Trainer, stage: str, log_dir: str) -> None:
        """Gather every rank's features (a collective under DDP) and write them on global rank zero."""
        local = {key: torch.cat(values, dim=-1 if key != "features" else 1) for key, values in self._saved.items()}
        self._saved = {}
        if trainer.world_size > 1:
            gathered: list[Any] = [None] * trainer.world_size
            torch.distributed.all_gather_object(gathered, (self.indices, local))
            local = _merge_ranks(gathered)
        if trainer.is_global_zero and local:
            path = summary_path(log_dir, stage, trainer.current_epoch, trainer.global_step)
            target = path.with_name(path.stem + "_features.pt")
            write_atomic(target, lambda file: torch.save(local, file))


def _merge_ranks(gathered: list[Any]) -> dict[str, Tensor]:
    """Concatenate every rank's saved features, in dataset order when every rank knows its indices."""
    parts = [part for _, part in gathered if part]
    if not parts:
        return {}
    merged = {key: torch.cat([p[key] for p in parts], dim=1 if key == "features" else -1) for key in parts[0]}
    indices = [index for index_list, part in gathered if part for index in (index_list or [])]
    if len(indices) == merged["labels"].shape[0]:
        order = torch.tensor(indices).argsort()
        merged = {
            key: value.index_select(1 if key == "features" else value.ndim - 1, order) for key, value in merged.items()
        }
    return merged


_NO_FOLDER = WarningCache()


def run_log_dir(trainer: Trainer) -> str:
    """The run folder the summaries go under (``trainer.log_dir``, a collective: every rank asks).

    A first logger that gives the run no folder (MLflow on a database: no ``save_dir``) leaves Lightning's
    ``default_root_dir``, the working folder unless set: said once, so that the summaries are not lost from view.
    """
    log_dir = trainer.log_dir
    if log_dir is None:
        folder = Path(trainer.default_root_dir).resolve()
        _NO_FOLDER.warn(
            f"layerwise: the first logger, {type(trainer.loggers[0]).__name__}, gives the run no folder; the summaries"
            f" go to {folder / 'layerwise'} (Trainer's default_root_dir; set it, or put a TensorBoard or CSV logger"
            " first).",
            category=LayerwiseWarning,
        )
        return str(folder)
    return str(log_dir)
