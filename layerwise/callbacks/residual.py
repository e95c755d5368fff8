"""Residual norm ratio per block and branch over the validation set (App. B.2, Fig. 11-12 of Jiang et al.)."""

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from typing import Any, Literal, Optional

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_warn
from torchmetrics import Metric

from layerwise.callbacks.lifecycle import AnalysisCallback
from layerwise.errors import LayerwiseWarning, UsageError
from layerwise.features.branches import BranchNorms, default_token, token_positions
from layerwise.features.paths import FAMILIES, find_layer_paths, get_blocks
from layerwise.figures.summary import residual_figures
from layerwise.metrics.residual import ResidualNormRatio

Token = Literal["auto", "cls", "last"]
LEVELS = (0.05, 0.25, 0.5, 0.75, 0.95)


class ResidualNormRatioMonitor(AnalysisCallback):
    """||x|| / ||F(x)|| of every block and of its attention and MLP branches, at one token per validation sample.

    x is the residual stream a branch adds to, F(x) the branch's output just before the addition, both read at
    the [CLS] token (ViT, BERT) or the last real token (decoders) — where the classifier or the next-token head
    reads. ``block`` is the whole block, x its input and F(x) = block(x) - x. A large ratio: the branch barely
    changes the stream (the skip dominates); the paper's observation is that it grows with depth. Where the ratio is
    taken per family is the ``branches`` entry of the family table (``layerwise/features/paths.py``): pre-LN blocks
    (timm ViT, GPT-2, LLaMA-family, GPT-NeoX's parallel branches) at the input of the branch's own norm and the
    output of the branch; **post-LN BERT/RoBERTa** before the LayerNorm that follows each branch: x the branch's
    residual input, F(x) the output dense layer (so the block ratio is the update after the LayerNorms).

    Exact over the validation set and under DDP: the mean is a float64 sum, the quantiles come from a fixed log10
    histogram (see :class:`~layerwise.metrics.residual.ResidualNormRatio`: within 1.2 % for ratios from 1e-10 to
    1e10; ratios outside are counted, and a quantile that needs one is ``null`` with a warning), the sampler's
    padding is dropped, and the states are all-reduced. Only the first validation dataloader is analysed.

    Outputs: the ``residual_norm_ratio`` key of the epoch's summary JSON (``branches``, ``layers``, ``token``,
    ``mean`` (P x L), ``quantile_levels``, ``quantiles`` (P x L x Q), ``log10_range`` (the histogram's [low,
    high]), ``below_range`` and ``above_range`` (P x L: ratios outside it)), scalars
    ``val/residual_ratio/<branch>/layer_XX`` (the mean) with one TensorBoard Custom Scalars chart per branch (all
    its layers), and a figure (TensorBoard, ``layerwise plot``) on the figure schedule of the other callbacks.

    Args:
        every_n_epochs: analyse every n-th validation epoch while fitting (``validate`` always analyses).
        token: ``"auto"`` ([CLS] where the model has one — BERT-like encoders, ViTs with a class token — else the
            last real token, as for decoders), ``"cls"`` or ``"last"``.
        log_figures: draw the figure as an image in every logger (PNG files without one; global rank zero).
        figures_every_n_epochs: while fitting, draw it only every n-th epoch and at the last one (as
            ``LayerwiseAnalysis(figures_every_n_epochs=...)``; default every analysed epoch); ``validate`` always
            draws. The JSON of every analysed epoch holds what ``layerwise plot`` draws.
    """

    key = "residual_norm_ratio"
    figures = staticmethod(residual_figures)

    def __init__(
        self,
        every_n_epochs: int = 1,
        token: Token = "auto",
        log_figures: bool = True,
        figures_every_n_epochs: int = 1,
    ) -> None:
        super().__init__(every_n_epochs, log_figures, figures_every_n_epochs)
        if token not in ("auto", "cls", "last"):
            raise ValueError(f"`token={token!r}` must be 'auto', 'cls' or 'last'.")
        self.token = token
        self._norms: Optional[BranchNorms] = None
        self._metric: Optional[ResidualNormRatio] = None
        self._hooks = ExitStack()

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        try:
            paths = find_layer_paths(pl_module, option="ResidualNormRatioMonitor")
        except UsageError as error:  # its message offers paths (blocks=...), which this callback does not take
            raise UsageError(
                f"ResidualNormRatioMonitor found no model of a known family (known: {sorted(FAMILIES)}) inside "
                f"{type(pl_module).__name__}: it reads the blocks and their attention/MLP branches from the family "
                "table and takes no paths. Add the family's entry to FAMILIES in layerwise/features/paths.py."
            ) from error
        blocks = get_blocks(pl_module, paths)
        self._norms = BranchNorms(blocks, paths.branches, option=f"ResidualNormRatioMonitor ({paths.family})")
        self._token = self.token if self.token != "auto" else default_token(paths)
        pooling = getattr(getattr(pl_module, "backbone", None), "pooling", None) or paths.pooling
        self._pooling = pooling if pooling in ("cls", "mean", "last") else None  # what the head reads, for the figure
        self._metric = ResidualNormRatio(len(self._norms.names), len(blocks), LEVELS, sync_on_compute=False)

    def start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._metric.reset()
        self._metric.to(pl_module.device)
        self._hooks.enter_context(self._norms.attached())

    def before_batch(self, trainer: Trainer, pl_module: LightningModule, batch: Any) -> None:
        mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None
        self._norms.token = token_positions(mask, self._token)

    def after_batch(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any) -> None:
        skip, branch = self._norms.pop()
        rows = self.real_rows(skip.shape[-1])
        if rows:
            self._metric.update(skip[..., :rows], branch[..., :rows])

    def stop(self) -> None:
        self._hooks.close()

    def metrics(self) -> list[Metric]:
        return [self._metric]

    def compute(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
        with torch.inference_mode(False):
            ratio = self._metric.compute()
        names, depth = self._norms.names, len(self._norms.blocks)
        mean, count = ratio.mean.reshape(len(names), depth), ratio.count
        below, above = ratio.below.reshape(len(names), depth), ratio.above.reshape(len(names), depth)
        outside = int((below + above).sum())
        if outside:
            rank_zero_warn(
                f"ResidualNormRatioMonitor: {outside} ratios ||x||/||F(x)|| fell outside [1e{self._metric.low:g}, "
                f"1e{self._metric.high:g}] (counted as `below_range`/`above_range` in the JSON); the quantiles that "
                "need them are null. The mean is exact.",
                category=LayerwiseWarning,
            )
        return {
            "branches": list(names),
            "layers": list(range(1, depth + 1)),
            "token": self._token,
            "pooling": self._pooling,
            "num_samples": int(count.reshape(len(names), depth)[0, 0]),
            "mean": mean,
            "quantile_levels": list(LEVELS),
            "quantiles": ratio.quantiles.reshape(len(names), depth, len(LEVELS)),
            "log10_range": [self._metric.low, self._metric.high],
            "below_range": below.round().long(),
            "above_range": above.round().long(),
        }

    def scalars(self, results: dict[str, Any]) -> dict[str, float]:
        mean, width = results["mean"], max(2, len(str(len(results["layers"]))))
        return {
            f"residual_ratio/{name}/layer_{layer:0{width}d}": float(mean[p, layer - 1])
            for p, name in enumerate(results["branches"])
            for layer in results["layers"]
        }

    def charts(self) -> dict[str, str]:
        names = self._norms.names if self._norms is not None else ()
        return {f"residual ratio {name} per layer": rf"residual_ratio/{name}/layer_\d+" for name in names}

    def line(self, results: dict[str, Any]) -> str:
        means = ", ".join(f"{name} {_range(row)}" for name, row in zip(results["branches"], results["mean"]))
        return f"residual norm ratio ||x||/||F(x)|| (layer 1 -> {len(results['layers'])}): {means}"


def _range(row: Sequence[Optional[float]]) -> str:
    first, last = row[0], row[-1]
    return f"{'-' if first is None else f'{first:.2f}'} -> {'-' if last is None else f'{last:.2f}'}"
