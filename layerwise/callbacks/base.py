"""The orchestration every analysis callback shares: where features come from, when to update, compute, log."""

import abc
import uuid
import weakref
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Optional, Union

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from torch import Tensor, nn
from torchmetrics import Metric

from layerwise.callbacks._sampling import rank_indices, real_samples_on_rank
from layerwise.features import (
    EXIT_LOGITS,
    EXIT_PREFIX,
    FEATURES,
    LOGITS,
    MAX_PROB,
    NLL,
    POSITIONS,
    PREDICTIONS,
    SAMPLE_INDEX,
    TARGETS,
    check_layer_outputs,
    is_layer_outputs,
)
from layerwise.features.hooks import HookTap, hook_paths
from layerwise.features.layers import LayerSelection, select_layers
from layerwise.metrics import Readout, SampleCount, all_reduce_sum_states, readout_from_logits
from layerwise.results import merge_summary, summary_path, write_atomic

Source = Literal["auto", "outputs", "hooks"]

# One id per Trainer: every layerwise callback of a run writes into the same per-epoch summary under it.
_RUN_IDS: "weakref.WeakKeyDictionary[Trainer, str]" = weakref.WeakKeyDictionary()


def _run_id(trainer: Trainer) -> str:
    if trainer not in _RUN_IDS:
        _RUN_IDS[trainer] = uuid.uuid4().hex
    return _RUN_IDS[trainer]


@dataclass(frozen=True)
class LayerSpec:
    """What the metrics are built for: the selected 1-based layer numbers of a ``depth``-layer model."""

    layer_numbers: list[int]
    depth: int
    dim: int
    num_classes: int
    token_level: bool = False

    @property
    def num_layers(self) -> int:
        """Number of selected layers."""
        return len(self.layer_numbers)

    def key(self, number: int) -> str:
        """The logging suffix of a layer, e.g. ``layer_03``."""
        return f"layer_{number:0{max(2, len(str(self.depth)))}d}"


@dataclass
class LayerBatch:
    """One batch of the selected layers.

    ``features`` ``(L, N, d)``; ``readout`` the shared head's per-layer predictions, top-1 probability and loss
    ``(L, N)``; ``targets`` ``(N,)``; ``exit_readout`` that of separate exit heads, if any. ``sampled`` indexes the
    rows kept for the feature-similarity statistics (every row unless tokens are subsampled).
    """

    features: Tensor
    readout: Readout
    targets: Optional[Tensor]
    exit_readout: Optional[Readout] = None
    sampled: Optional[Tensor] = None

    @property
    def sampled_features(self) -> Tensor:
        """The features of the rows kept for COS/CKA/saturation-COS: ``(L, N', d)``."""
        return self.features if self.sampled is None else self.features[:, self.sampled]


class Family(abc.ABC):
    """One metric family: builds its metrics, feeds them, turns them into results, scalars and figures."""

    def configure(self, trainer: Trainer, spec: LayerSpec) -> None:  # noqa: B027 - an optional hook
        """Read what the family needs from the run (e.g. class frequencies) before ``build``; default: nothing."""

    @abc.abstractmethod
    def build(self, spec: LayerSpec) -> list[Metric]:
        """Create the metrics (constructed with ``sync_on_compute=False``) and return them."""

    @abc.abstractmethod
    def update(self, batch: LayerBatch) -> None:
        """Feed one batch."""

    @abc.abstractmethod
    def compute(self, spec: LayerSpec) -> dict[str, Any]:
        """Results keyed as in the JSON summary (states are already reduced across ranks)."""

    def scalars(self, results: dict[str, Any], spec: LayerSpec) -> dict[str, float]:
        """Scalars to log, keyed without the stage prefix, e.g. ``acc/layer_03``."""
        return {}

    def figures(self, results: dict[str, Any], spec: LayerSpec) -> dict[str, Any]:
        """Matplotlib figures to log as images, keyed by tag suffix."""
        return {}

    def charts(self) -> dict[str, str]:
        """TensorBoard multi-line charts: title -> regex of tag suffixes (all layers of one quantity)."""
        return {}


def _per_layer(values: Sequence[float], spec: LayerSpec, name: str) -> dict[str, float]:
    return {f"{name}/{spec.key(number)}": float(value) for number, value in zip(spec.layer_numbers, values)}


class LayerwiseMonitor(Callback):
    """Base of the analysis callbacks: feeds metric families with every validation (and test) batch.

    Features come from the module's ``validation_step`` output when it follows the contract of
    :mod:`layerwise.features.outputs` (every :class:`~layerwise.lightning_modules.LayerwiseModule` does), or from
    forward hooks on the blocks of any other model (``source="hooks"``; paths from the built-in table for timm ViTs
    and Hugging Face BERT/GPT-2/LLaMA, or from ``blocks``/``final_norm``/``classifier``). Hooks live only during
    the evaluation epoch and are always removed, also when the run fails.

    Exactness under DDP: every rank feeds only its own real samples (the padding that ``DistributedSampler`` adds
    to even out an uneven validation set is dropped), all metric states are summed with one all-reduce, and every
    rank computes the same result. Figures and the JSON summary are written on global rank zero.

    Args:
        every_n_epochs: analyse every n-th validation epoch while fitting (``validate``/``test`` always analyse).
        layers: which layers: None = all, int n = the last n, list = 0-based block indices (negatives allowed).
        save_features: also write ``<log_dir>/layerwise/<stage>_epoch_<EEE>_features.pt`` with ``features``
            (L x N x d float32), ``labels`` (N), ``predictions`` (L x N) and ``max_prob`` (L x N). Holds the
            evaluated features in CPU memory for the epoch.
        log_figures: draw heatmaps/histograms as TensorBoard images (global rank zero only).
        source: ``"outputs"`` reads the step's returned dict, ``"hooks"`` attaches forward hooks; ``"auto"`` uses hooks
            when paths are given or the module is not a layerwise module, else the outputs.
        blocks, final_norm, classifier: dotted paths, relative to the LightningModule, of the block list, the final
            norm(s) and the classifier module(s) (applied in order); only for the hook source.
        pooling: ``"cls"``, ``"mean"`` or ``"last"`` token of each block output (hook source; default from the table).
        token_stride: language models: COS, CKA and the saturation COS use only positions ``t`` with
            ``t % token_stride == 0`` (a subsample that does not depend on batching or the number of processes);
            accuracy, loss, saturation counts and early exit always use every token.
    """

    def __init__(
        self,
        every_n_epochs: int = 1,
        layers: LayerSelection = None,
        save_features: bool = False,
        log_figures: bool = True,
        source: Source = "auto",
        blocks: Optional[str] = None,
        final_norm: Union[str, list[str], None] = None,
        classifier: Union[str, list[str], None] = None,
        pooling: Optional[Literal["cls", "mean", "last"]] = None,
        token_stride: int = 1,
    ) -> None:
        if token_stride < 1:
            raise ValueError(f"`token_stride={token_stride}` must be >= 1.")
        if every_n_epochs < 1:
            raise ValueError(f"`every_n_epochs={every_n_epochs}` must be >= 1.")
        if source not in ("auto", "outputs", "hooks"):
            raise ValueError(f"`source={source!r}` must be 'auto', 'outputs' or 'hooks'.")
        if pooling is not None and pooling not in ("cls", "mean", "last"):
            raise ValueError(f"`pooling={pooling!r}` must be 'cls', 'mean' or 'last'.")
        self.every_n_epochs = every_n_epochs
        self.layers = layers
        self.save_features = save_features
        self.log_figures = log_figures
        self.source = source
        self.hook_paths = {"blocks": blocks, "final_norm": final_norm, "classifier": classifier, "pooling": pooling}
        self.token_stride = token_stride
        self.families: list[Family] = []
        self._stage: Optional[str] = None
        self._hooks = ExitStack()
        self._tap: Optional[HookTap] = None
        self._spec: Optional[LayerSpec] = None
        self._metrics: list[Metric] = []
        self._count: Optional[SampleCount] = None
        self._budget: Optional[int] = None
        self._indices: Optional[list[int]] = None
        self._saved: dict[str, list[Tensor]] = {}
        self._charts_written = False

    # -- when ---------------------------------------------------------------------------------------------------

    def _should_run(self, trainer: Trainer) -> bool:
        if trainer.sanity_checking:
            return False
        if trainer.state.fn == TrainerFn.FITTING:
            return (trainer.current_epoch + 1) % self.every_n_epochs == 0
        return True

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        for other in trainer.callbacks:
            if isinstance(other, LayerwiseMonitor) and other is not self and other.layers != self.layers:
                raise ValueError(
                    f"{type(self).__name__}(layers={self.layers!r}) and {type(other).__name__}(layers="
                    f"{other.layers!r}) would write one summary with different layers: give every layerwise callback "
                    "the same `layers`, or use one LayerwiseAnalysis."
                )

    def on_validation_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._begin(trainer, pl_module, "val", trainer.val_dataloaders)

    def on_test_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._begin(trainer, pl_module, "test", trainer.test_dataloaders)

    def on_validation_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._set_attention_mask(batch)

    def on_test_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int, dataloader_idx: int = 0
    ) -> None:
        self._set_attention_mask(batch)

    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._collect(outputs, batch, dataloader_idx)

    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._collect(outputs, batch, dataloader_idx)

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish(trainer, pl_module)

    def on_test_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._finish(trainer, pl_module)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._detach()
        self._stage = None
        for metric in self._metrics:
            metric.reset()

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._detach()

    # -- where features come from ---------------------------------------------------------------------------------

    def _uses_hooks(self, pl_module: LightningModule) -> bool:
        if self.source != "auto":
            return self.source == "hooks"
        explicit = self.hook_paths["blocks"] is not None or self.hook_paths["classifier"] is not None
        return explicit or not hasattr(pl_module, "layer_outputs")

    def _begin(self, trainer: Trainer, pl_module: LightningModule, stage: str, dataloaders: Any) -> None:
        self._detach()
        if not self._should_run(trainer):
            self._stage = None
            return
        self._stage = stage
        loader = dataloaders[0] if isinstance(dataloaders, (list, tuple)) else dataloaders
        self._budget = real_samples_on_rank(loader)
        self._indices = rank_indices(loader) if self.save_features and trainer.world_size > 1 else None
        self._saved = {}
        if self._uses_hooks(pl_module):
            self._tap = HookTap(pl_module, hook_paths(pl_module, **self.hook_paths))
            self._hooks.enter_context(self._tap.attached())
        self._build(pl_module)

    def _set_attention_mask(self, batch: Any) -> None:
        if self._tap is not None:
            self._tap.attention_mask = batch.get("attention_mask") if isinstance(batch, Mapping) else None

    def _detach(self) -> None:
        self._hooks.close()
        self._tap = None

    def _dims(self, pl_module: LightningModule) -> tuple[int, int, int, bool]:
        if self._tap is not None:
            linears = [m for head in self._tap.head_modules for m in head.modules() if isinstance(m, nn.Linear)]
            if not linears:
                raise ValueError("The classifier modules hold no nn.Linear; cannot tell the feature width.")
            return self._tap.num_layers, linears[0].in_features, linears[-1].out_features, False
        backbone = pl_module.backbone
        return backbone.num_layers, backbone.embed_dim, backbone.num_classes, bool(backbone.token_level)

    def _build(self, pl_module: LightningModule) -> None:
        depth, dim, num_classes, token_level = self._dims(pl_module)
        numbers = [index + 1 for index in select_layers(self.layers, depth)]
        spec = LayerSpec(numbers, depth, dim, num_classes, token_level)
        if spec != self._spec or not self._metrics:
            for family in self.families:
                family.configure(pl_module.trainer, spec)
            self._spec = spec
            self._count = SampleCount(sync_on_compute=False)
            self._metrics = [self._count] + [metric for family in self.families for metric in family.build(spec)]
            self._selection = torch.tensor([number - 1 for number in numbers])
        for metric in self._metrics:  # already zero: fresh, or reset when the last epoch finished or failed
            metric.to(pl_module.device)

    def _layer_batch(self, outputs: Any, batch: Any) -> LayerBatch:
        if self._tap is not None:
            outputs = dict(self._tap.pop())
            outputs[TARGETS] = _targets(batch)
        elif not is_layer_outputs(outputs):
            raise TypeError(
                "The validation/test step returned no per-layer outputs (a dict with 'features' and 'logits'). "
                "Use a layerwise LightningModule, return that dict, or pass source='hooks' (with blocks=, "
                "final_norm=, classifier= for models outside the built-in path table)."
            )
        check_layer_outputs(outputs)
        rows = _real_rows(outputs, self._budget)
        if self._budget is not None:
            self._budget -= _samples_in(outputs, rows)
        selection = self._selection.to(outputs[FEATURES].device)

        def pick(value: Optional[Tensor]) -> Optional[Tensor]:
            return None if value is None else value.index_select(0, selection)[:, rows]

        targets = outputs.get(TARGETS)
        targets = None if targets is None else targets[rows]
        readout = _readout(outputs, "", targets, pick)
        exit_readout = _readout(outputs, EXIT_PREFIX, targets, pick)
        positions = outputs.get(POSITIONS)
        sampled = None
        if positions is not None and self.token_stride > 1:
            sampled = torch.nonzero(positions[rows] % self.token_stride == 0).flatten()
        return LayerBatch(pick(outputs[FEATURES]), readout, targets, exit_readout, sampled)

    def _collect(self, outputs: Any, batch: Any, dataloader_idx: int) -> None:
        if self._stage is None:
            return
        if dataloader_idx != 0:
            if self._tap is not None:
                self._tap.pop()
            return
        layer_batch = self._layer_batch(outputs, batch)
        if layer_batch.features.shape[1] == 0:
            return
        if layer_batch.targets is None or layer_batch.readout.nll is None:
            raise ValueError("The batch holds no targets: the analysis needs labels ('labels' key or batch[1]).")
        self._count.update(layer_batch.features.shape[1])
        for family in self.families:
            family.update(layer_batch)
        if self.save_features:
            self._keep_features(layer_batch)

    # -- results --------------------------------------------------------------------------------------------------

    def _finish(self, trainer: Trainer, pl_module: LightningModule) -> None:
        stage, self._stage = self._stage, None
        self._detach()
        if stage is None:
            return
        spec = self._spec
        all_reduce_sum_states(self._metrics)
        num_samples = int(self._count.compute().item())
        results: dict[str, Any] = {}
        for family in self.families:
            results.update(family.compute(spec))
        scalars = {
            f"{stage}/{key}": value for family in self.families for key, value in family.scalars(results, spec).items()
        }
        self._log_scalars(trainer, pl_module, scalars)
        log_dir = _log_dir(trainer)  # a collective (trainer.log_dir broadcasts from rank 0): every rank calls it
        if trainer.is_global_zero:
            header = {
                "stage": stage,
                "epoch": trainer.current_epoch,
                "global_step": trainer.global_step,
                "num_samples": num_samples,
                "depth": spec.depth,
                "layers": spec.layer_numbers,
            }
            merge_summary(summary_path(log_dir, stage, trainer.current_epoch), {**header, **results}, _run_id(trainer))
            if self.log_figures:
                self._log_figures(trainer, stage, results, spec)
        if self.save_features:
            self._write_features(trainer, stage, log_dir)
        for metric in self._metrics:
            metric.reset()

    def _log_scalars(self, trainer: Trainer, pl_module: LightningModule, scalars: dict[str, float]) -> None:
        # Through Lightning, so that ModelCheckpoint(monitor=...), EarlyStopping and every logger see the values by
        # design. They are already global (the states were reduced above): no sync, no collective per scalar.
        pl_module.log_dict(scalars, sync_dist=False, on_step=False, on_epoch=True, add_dataloader_idx=False)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                self._write_charts(logger)

    def _tensorboard(self, trainer: Trainer) -> Optional[Any]:
        for logger in trainer.loggers:
            experiment = getattr(logger, "experiment", None)
            if hasattr(experiment, "add_figure"):
                return experiment
        return None

    def _write_charts(self, logger: Any) -> None:
        experiment = getattr(logger, "experiment", None)
        if self._charts_written or not hasattr(experiment, "add_custom_scalars"):
            return
        layout: dict[str, dict[str, list]] = {}
        for stage in ("val", "test"):
            charts = {}
            for family in self.families:
                for title, pattern in family.charts().items():
                    charts[f"{stage} {title}"] = ["Multiline", [f"{stage}/{pattern}"]]
            layout[f"layerwise {stage}"] = charts
        experiment.add_custom_scalars(layout)
        self._charts_written = True

    def _log_figures(self, trainer: Trainer, stage: str, results: dict[str, Any], spec: LayerSpec) -> None:
        import matplotlib.pyplot as plt

        experiment = self._tensorboard(trainer)
        if experiment is None:
            return
        for family in self.families:
            for tag, figure in family.figures(results, spec).items():
                experiment.add_figure(f"{stage}/{tag}", figure, global_step=trainer.global_step)
                plt.close(figure)

    # -- save_features --------------------------------------------------------------------------------------------

    def _keep_features(self, batch: LayerBatch) -> None:
        rows = slice(None) if batch.sampled is None else batch.sampled
        parts = {
            "features": batch.sampled_features.float(),
            "labels": batch.targets[rows],
            "predictions": batch.readout.predictions[:, rows],
            "max_prob": batch.readout.max_prob[:, rows].float(),
        }
        for key, value in parts.items():
            self._saved.setdefault(key, []).append(value.detach().cpu())

    def _write_features(self, trainer: Trainer, stage: str, log_dir: str) -> None:
        local = {key: torch.cat(values, dim=-1 if key != "features" else 1) for key, values in self._saved.items()}
        self._saved = {}
        if trainer.world_size > 1:
            gathered: list[Any] = [None] * trainer.world_size
            torch.distributed.all_gather_object(gathered, (self._indices, local))
            local = _merge_ranks(gathered)
        if trainer.is_global_zero and local:
            path = summary_path(log_dir, stage, trainer.current_epoch)
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


def _real_rows(outputs: Mapping, budget: Optional[int]) -> Union[slice, Tensor]:
    """The rows of a step's outputs that belong to real samples (``DistributedSampler`` pads at the end)."""
    if budget is None:
        return slice(None)
    sample_index = outputs.get(SAMPLE_INDEX)
    if sample_index is None:
        return slice(0, budget)
    return torch.nonzero(sample_index < budget).flatten()


def _samples_in(outputs: Mapping, rows: Union[slice, Tensor]) -> int:
    """How many dataloader samples the kept rows cover (a language model's sequence has many rows)."""
    sample_index = outputs.get(SAMPLE_INDEX)
    if sample_index is None:
        return len(range(*rows.indices(outputs[FEATURES].shape[1]))) if isinstance(rows, slice) else rows.numel()
    kept = sample_index[rows]
    return 0 if kept.numel() == 0 else int(kept.max()) + 1


def _readout(outputs: Mapping, prefix: str, targets: Optional[Tensor], pick: Any) -> Optional[Readout]:
    """The readout under ``prefix`` ("" for the shared head, "exit_" for separate heads), from logits if needed."""
    if prefix + PREDICTIONS in outputs and (prefix + NLL in outputs or targets is None):
        predictions, max_prob = pick(outputs[prefix + PREDICTIONS]), pick(outputs[prefix + MAX_PROB])
        return Readout(predictions, max_prob, pick(outputs.get(prefix + NLL)))
    logits = outputs.get(EXIT_LOGITS if prefix else LOGITS)
    return None if logits is None else readout_from_logits(pick(logits), targets)


def _targets(batch: Any) -> Optional[Tensor]:
    if isinstance(batch, Mapping):
        for key in ("labels", "label", "targets", "target"):
            if key in batch:
                return batch[key]
        return None
    if isinstance(batch, (tuple, list)) and len(batch) > 1:
        return batch[1]
    return None


def _log_dir(trainer: Trainer) -> str:
    return str(trainer.log_dir or Path(trainer.default_root_dir))
