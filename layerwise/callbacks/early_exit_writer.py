"""Predict with early exit and write every sample's prediction and exit layer (CSV or JSON) plus a summary."""

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Optional

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torch import Tensor

from layerwise.engines.early_exit import EXIT_LAYERS, PREDICTIONS, TARGETS, check_criterion, layer_count_speedup
from layerwise.errors import LayerwiseWarning
from layerwise.features import IGNORE_INDEX
from layerwise.results import to_json, write_text_atomic

_OPTION = "--trainer.callbacks."
_COLUMNS = ("index", "dataloader", "prediction", "exit_layer", "target")


class EarlyExitPredictionWriter(BasePredictionWriter):
    r"""Turn ``predict`` into early-exit inference and write one row per sample, plus a summary.

    On predict start it sets the module's ``early_exit`` attribute, so that
    :meth:`~layerwise.lightning_modules.LayerwiseModule.predict_step` runs
    :func:`layerwise.engines.early_exit.early_exit_predict` (block by block; samples that meet the criterion leave
    the batch and skip the remaining blocks) instead of the full model, and resets it when predict ends. Give exactly
    one criterion (see :mod:`layerwise.engines.early_exit` for the exact definitions).

    Rows are collected on every rank, gathered to global rank zero (under DDP each process predicts a part of the
    data) and written there, ordered by dataset index, each sample once. Both files are written atomically
    (a temporary file renamed into place), so a crash never leaves half a file.

    Args:
        threshold: exit when the top-1 softmax probability of the shared head is ``>= threshold``.
        entropy: exit when the softmax entropy (nats) is ``<= entropy``.
        patience: exit when the top-1 prediction has stayed the same for ``patience`` consecutive layers.
        output_path: the per-sample file; the summary goes next to it as ``<stem>.summary.json``.
        format: ``"csv"`` or ``"json"``; ``None`` takes it from the suffix of ``output_path`` (``.json`` is JSON,
            anything else CSV).

    Files:
        ``output_path``: columns ``index`` (the sample's index in the predict dataset), ``prediction``,
        ``exit_layer`` (1-based), ``target`` (empty / ``null`` when the batch has no labels); a ``dataloader``
        column first when several predict dataloaders are used. JSON: a list of one object per sample.
        ``<stem>.summary.json``: ``criterion``, ``num_samples``, ``num_layers``, ``accuracy`` (over the samples
        with a target; ``null`` if none), ``num_with_target``, ``exit_counts`` (samples per exit layer 1..L),
        ``mean_exit_layer`` and ``layer_count_speedup`` (``Σ L·m_l / Σ l·m_l``).

    Example::

        layerwise predict --config quickstart --ckpt_path last.ckpt \
            --trainer.callbacks+=layerwise.callbacks.EarlyExitPredictionWriter \
            --trainer.callbacks.threshold=0.9 --trainer.callbacks.output_path=exits.csv
    """

    def __init__(
        self,
        threshold: Optional[float] = None,
        entropy: Optional[float] = None,
        patience: Optional[int] = None,
        output_path: str = "early_exit.csv",
        format: Optional[Literal["csv", "json"]] = None,
    ) -> None:
        super().__init__(write_interval="batch")
        self.criterion = check_criterion(threshold, entropy, patience, option_prefix=_OPTION)
        if format not in (None, "csv", "json"):
            raise ValueError(f"`{_OPTION}format={format!r}` must be 'csv' or 'json'.")
        self.output_path = Path(output_path)
        self.format = format or ("json" if self.output_path.suffix.lower() == ".json" else "csv")
        self._rows: list[Tensor] = []
        self._next_index = 0

    @property
    def summary_path(self) -> Path:
        """Where the summary is written: ``<stem>.summary.json`` next to ``output_path``."""
        return self.output_path.with_name(self.output_path.stem + ".summary.json")

    def on_predict_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if not hasattr(pl_module, "early_exit"):
            raise TypeError(
                f"EarlyExitPredictionWriter needs a layerwise LayerwiseModule (with `early_exit`), got "
                f"{type(pl_module).__name__}."
            )
        if pl_module.early_exit is not None:
            raise ValueError(f"Early exit is already set to {pl_module.early_exit}: use one EarlyExitPredictionWriter.")
        pl_module.early_exit = dict(self.criterion)
        self._rows, self._next_index = [], 0

    def write_on_batch_end(
        self,
        trainer: "pl.Trainer",
        pl_module: "pl.LightningModule",
        prediction: Any,
        batch_indices: Optional[Sequence[int]],
        batch: Any,
        batch_idx: int,
        dataloader_idx: int,
    ) -> None:
        if not isinstance(prediction, dict) or EXIT_LAYERS not in prediction:
            raise RuntimeError(
                f"predict_step returned no `{EXIT_LAYERS}`: {type(pl_module).__name__} ignores early exit."
            )
        predictions, exit_layers = prediction[PREDICTIONS].long(), prediction[EXIT_LAYERS].long()
        count = predictions.shape[0]
        if batch_indices is not None and len(batch_indices) == count:
            indices = torch.as_tensor(list(batch_indices), dtype=torch.long)
        else:  # not a DataLoader with a batch sampler: number the samples in the order they come
            if trainer.world_size > 1:
                rank_zero_warn(
                    "EarlyExitPredictionWriter: dataset indices unknown under DDP; rows are numbered per rank.",
                    category=LayerwiseWarning,
                )
            indices = torch.arange(self._next_index, self._next_index + count)
        self._next_index += count
        targets = prediction.get(TARGETS)
        targets = torch.full((count,), IGNORE_INDEX) if targets is None else targets.long().view(-1)
        columns = [indices, torch.full((count,), dataloader_idx), predictions, exit_layers, targets]
        self._rows.append(torch.stack([column.cpu() for column in columns], dim=1))

    def on_predict_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        pl_module.early_exit = None
        rows = torch.cat(self._rows) if self._rows else torch.zeros(0, len(_COLUMNS), dtype=torch.long)
        self._rows = []
        rows = _gather_rows(trainer, pl_module, rows)
        if trainer.is_global_zero:
            rows = _sorted_unique(rows)
            summary = self._summary(rows, pl_module.num_layers)
            write_text_atomic(self.output_path, self._render(rows))
            write_text_atomic(self.summary_path, json.dumps(to_json(summary), indent=1, allow_nan=False) + "\n")
            accuracy = "n/a" if summary["accuracy"] is None else f"{summary['accuracy']:.4f}"
            rank_zero_info(
                f"layerwise: early exit {self.criterion} on {summary['num_samples']} samples: layer-count speedup "
                f"{summary['layer_count_speedup']:.3f}, accuracy {accuracy}; wrote {self.output_path}."
            )
        trainer.strategy.barrier("early_exit_writer")

    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if stage == "predict" and hasattr(pl_module, "early_exit"):  # also after an interrupted predict
            pl_module.early_exit = None

    def _summary(self, rows: Tensor, num_layers: int) -> dict[str, Any]:
        exit_layers, targets = rows[:, 3], rows[:, 4]
        known = targets != IGNORE_INDEX
        correct = (rows[:, 2][known] == targets[known]).sum().item()
        return {
            "criterion": self.criterion,
            "num_samples": rows.shape[0],
            "num_layers": num_layers,
            "accuracy": correct / int(known.sum()) if known.any() else None,
            "num_with_target": int(known.sum()),
            "exit_counts": torch.bincount(exit_layers - 1, minlength=num_layers),
            "mean_exit_layer": exit_layers.double().mean().item() if rows.shape[0] else None,
            "layer_count_speedup": layer_count_speedup(exit_layers, num_layers),
        }

    def _render(self, rows: Tensor) -> str:
        columns = list(_COLUMNS) if bool((rows[:, 1] != 0).any()) else [c for c in _COLUMNS if c != "dataloader"]
        records = [dict(zip(_COLUMNS, row)) for row in rows.tolist()]
        for record in records:
            record["target"] = None if record["target"] == IGNORE_INDEX else record["target"]
        records = [{key: record[key] for key in columns} for record in records]
        if self.format == "json":
            return json.dumps(records, indent=0) + "\n"
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(records)
        return text.getvalue()


def _gather_rows(trainer: "pl.Trainer", pl_module: "pl.LightningModule", rows: Tensor) -> Tensor:
    """Every rank's rows ``(n_r, 5)``, concatenated on every rank (ranks may hold different numbers of rows)."""
    if trainer.world_size == 1:
        return rows
    device = pl_module.device
    counts = trainer.strategy.all_gather(torch.tensor([rows.shape[0]], device=device)).view(-1).tolist()
    padded = torch.full((max(counts), rows.shape[1]), -1, dtype=torch.long, device=device)
    padded[: rows.shape[0]] = rows.to(device)
    gathered = trainer.strategy.all_gather(padded).cpu()  # (world, max, 5)
    return torch.cat([gathered[rank, :count] for rank, count in enumerate(counts)])


def _sorted_unique(rows: Tensor) -> Tensor:
    """Rows ordered by (dataloader, index), each sample once (a sampler that pads would repeat some)."""
    if rows.shape[0] == 0:
        return rows
    order = torch.argsort(rows[:, 0], stable=True)
    rows = rows[order]
    rows = rows[torch.argsort(rows[:, 1], stable=True)]
    key = rows[:, :2]
    first = torch.ones(rows.shape[0], dtype=torch.bool)
    first[1:] = (key[1:] != key[:-1]).any(dim=1)
    return rows[first]
