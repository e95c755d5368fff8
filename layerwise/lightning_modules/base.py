"""The shared-head base that every training strategy builds on."""

import abc
from collections.abc import Sequence
from typing import Any, Literal, Optional, Union

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_warn
from torch import Tensor

from layerwise._compat import REDUCED_KEYS, built_by_lightning_cli
from layerwise.engines.checkpoint import use_checkpoint_reader
from layerwise.engines.early_exit import EXIT_LAYERS, PREDICTIONS, early_exit_predict
from layerwise.engines.readout import (
    DEFAULT_CHUNK_SIZE,
    Head,
    LayerOutputs,
    chunked_cross_entropy,
    chunked_readout,
    read_layers,
)
from layerwise.engines.sampling import evaluation_loaders, real_samples_on_rank
from layerwise.errors import LayerwiseWarning, UsageError
from layerwise.features import FEATURES, IGNORE_INDEX, TARGETS, Backbone
from layerwise.metrics.count import RowMean
from layerwise.metrics.functional import group_logits
from layerwise.results import loader_stages


class EvaluationSteps:
    """``validation_step``/``test_step`` of the evaluation contract.

    Each returns the module's ``layer_outputs(batch)`` for the analysis callbacks and logs the last layer's loss and
    accuracy (each evaluation dataloader under its own name). Shared by :class:`LayerwiseModule` and
    :class:`~layerwise.lightning_modules.LinearProbes`.
    """

    def _evaluation_step(self, batch: Any, batch_idx: int, stage: str, dataloader_idx: int) -> LayerOutputs:
        outputs = self.layer_outputs(batch)
        log_last_layer(self, outputs, stage, dataloader_idx, batch_idx)
        return outputs

    def validation_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> LayerOutputs:
        return self._evaluation_step(batch, batch_idx, "val", dataloader_idx)

    def test_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> LayerOutputs:
        return self._evaluation_step(batch, batch_idx, "test", dataloader_idx)


class LayerwiseModule(EvaluationSteps, LightningModule, abc.ABC):
    """Base LightningModule: one backbone pass gives every layer's feature; the model's own head reads every layer.

    Subclasses (the training strategies) override only :meth:`compute_loss` (and, for separate exit classifiers,
    :meth:`classifier_heads`). The same strategies serve classifiers (timm ViTs, Hugging Face encoders: one sample
    per input) and causal language models (every predicted token is a sample, its class the next token).

    Losses go through :meth:`layer_losses`, which applies a head to one layer at a time and, beyond ``chunk_size``
    rows, in checkpointed token chunks (:func:`~layerwise.engines.readout.chunked_cross_entropy`): the
    extra memory of even the all-layer aligned loss over a 50,257-token vocabulary is about one chunk of logits.

    ``validation_step``, ``test_step`` and ``predict_step`` run the backbone once and return one
    :class:`~layerwise.engines.readout.LayerOutputs`: ``features`` ``(L, N, d)``, the shared head's readout per layer
    (``predictions``, ``max_prob``, ``nll``, each ``(L, N)``, read by the one readout of
    :mod:`layerwise.engines.readout`), ``targets`` ``(N,)``; language models also ``sample_index`` and ``positions``
    of every token. The analysis callbacks read it, so they never run a second forward pass.

    Args:
        backbone: the layer tap: :class:`~layerwise.features.TimmViT`, :class:`~layerwise.features.HFEncoder`,
            :class:`~layerwise.features.HFCausalLM` or any :class:`~layerwise.features.Backbone`.
        optimizer: optimizer factory (LightningCLI ``class_path``/``init_args``), called with the parameters.
        lr_scheduler: optional scheduler factory, called with the optimizer.
        scheduler_interval: whether the scheduler steps every ``"epoch"`` or every optimizer ``"step"``.
        label_smoothing: label smoothing of every cross-entropy term.
        chunk_size: rows (tokens) per chunk when the head is applied to many rows.

    Logged keys: ``train/loss``, ``train/acc`` (last layer; classifiers only), ``val/loss``, ``val/acc`` (last
    layer, shared head); ``test/...`` likewise.
    """

    def __init__(
        self,
        backbone: Backbone,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: Optional[LRSchedulerCallable] = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        label_smoothing: float = 0.0,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> None:
        super().__init__()
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"`--model.init_args.label_smoothing={label_smoothing}` must lie in [0, 1).")
        if chunk_size < 1:
            raise ValueError(f"`--model.init_args.chunk_size={chunk_size}` must be >= 1.")
        # Under LightningCLI the hyper-parameters are the parsed config (class paths included), which is what
        # `load_from_checkpoint` needs; built in Python, the backbone and factories are objects, not hyper-parameters.
        self.save_hyperparameters(ignore=[] if built_by_lightning_cli() else ["backbone", "optimizer", "lr_scheduler"])
        self.backbone = backbone
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.scheduler_interval = scheduler_interval
        self.label_smoothing = label_smoothing
        self.chunk_size = chunk_size
        # The first optimizer step whose training loss was NaN/inf (-1: none yet), kept on the loss's device so that
        # watching costs no synchronisation; read at logging steps and warned about once per run.
        self._first_nonfinite_step: Optional[Tensor] = None  # (epoch, batch, step, rows) of the first, on device
        self._nonfinite_batches: Optional[Tensor] = None
        self._nonfinite_warned = False
        # Predict-time early exit ({"threshold": 0.9}, {"entropy": e} or {"patience": p}), set for the duration of
        # `predict` by layerwise.callbacks.EarlyExitPredictionWriter; None runs the full model.
        self.early_exit: Optional[dict[str, Any]] = None

    @property
    def num_layers(self) -> int:
        """Number of transformer blocks ``L``."""
        return self.backbone.num_layers

    @property
    def num_classifiers(self) -> int:
        """How many classifiers the strategy trains: one shared head."""
        return 1

    def classifier_heads(self) -> list[Head]:
        """The classifier the strategy trains at every layer: the shared head everywhere."""
        return [self.backbone.head] * self.num_layers

    def reading_heads(self) -> Union[Head, list[Head]]:
        """What evaluation reads every layer with: the shared head (a tuned lens: each layer's translated head)."""
        return self.backbone.head

    def forward(self, inputs: Any) -> Tensor:
        """The model's own logits (shared head on the last layer; ``(B, T, V)`` for a language model)."""
        return self.backbone.head(self.backbone(inputs)[-1])

    def samples(self, batch: Any) -> dict[str, Tensor]:
        """One backbone pass: ``features`` ``(L, N, d)`` and ``targets`` ``(N,)`` of every sample of the batch.

        For a language model the rows are the batch's positions (``N = B·T``, a view, no copy), and the targets of
        positions that predict nothing are ``-100`` (ignored by the losses).
        """
        inputs, targets = self.backbone.split_batch(batch)
        features = self.backbone(inputs)
        if self.backbone.token_level:
            features = features.flatten(1, 2)
            targets = targets.flatten()
        return {FEATURES: features, TARGETS: targets}

    @abc.abstractmethod
    def compute_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        """The strategy's training objective; ``outputs`` holds :meth:`samples`."""

    def layer_losses(self, outputs: dict[str, Tensor], layers: Sequence[int]) -> Tensor:
        """Cross-entropy ``(k,)`` of :meth:`classifier_heads` at the given 0-based layers, one layer at a time."""
        heads = self.classifier_heads()
        features, targets = outputs[FEATURES], outputs[TARGETS]
        # Vocabulary-sized logits are recomputed in backward, never kept per layer; a classifier's are kept (tiny).
        recompute = self.backbone.token_level
        losses = [
            chunked_cross_entropy(
                heads[layer], features[layer], targets, self.chunk_size, self.label_smoothing, recompute
            )
            for layer in layers
        ]
        return torch.stack(losses)

    def last_layer_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        """Cross-entropy of the last layer: the standard objective."""
        return self.layer_losses(outputs, [self.num_layers - 1])[0]

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        outputs = self.samples(batch)
        with torch.no_grad():  # samples whose last-layer feature is non-finite (a NaN at any layer reaches it)
            self._last_nonfinite_rows = (~torch.isfinite(outputs[FEATURES][-1])).any(dim=-1).sum()
        loss = self.compute_loss(outputs)
        self.log("train/loss", loss, prog_bar=True)
        if not self.backbone.token_level:
            last = chunked_readout(self.backbone.head, outputs[FEATURES][-1:].detach(), None, self.chunk_size)
            self.log("train/acc", (last.predictions[0] == outputs[TARGETS]).float().mean(), prog_bar=True)
        return loss

    def on_fit_start(self) -> None:
        self._first_nonfinite_step, self._nonfinite_warned = None, False  # once per run, not once per module
        self._nonfinite_batches: Optional[Tensor] = None

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        self._batch_step = self.trainer.global_step  # the step Lightning logs this batch's metrics under

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        """Watch the training loss: the first non-finite one is reported once, with its batch (see below).

        On the loss's device, so that watching costs no synchronisation: the first bad batch's epoch, batch index,
        step and non-finite sample rows, and the count of bad batches, read only when Lightning logs and at the end.
        """
        loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
        if not isinstance(loss, Tensor):
            return
        device = loss.device
        here = torch.tensor(
            [self.trainer.current_epoch, batch_idx, getattr(self, "_batch_step", self.trainer.global_step)],
            device=device,
        )
        if self._first_nonfinite_step is None:
            self._first_nonfinite_step = torch.full((4,), -1, dtype=torch.long, device=device)
            self._nonfinite_batches = torch.zeros((), dtype=torch.long, device=device)
        rows = getattr(self, "_last_nonfinite_rows", None)
        here = torch.cat([here, (rows if rows is not None else torch.zeros((), device=device)).long().view(1)])
        bad = ~torch.isfinite(loss.detach()).all()
        first = self._first_nonfinite_step
        self._first_nonfinite_step = torch.where(bad & (first[0] < 0), here, first)
        self._nonfinite_batches = self._nonfinite_batches + bad.long()
        if (batch_idx + 1) % max(1, self.trainer.log_every_n_steps) == 0:  # read (a sync) only when Lightning logs
            self._warn_nonfinite_loss()

    def on_train_epoch_end(self) -> None:
        self._warn_nonfinite_loss()

    def nonfinite_training(self) -> Optional[str]:
        """How many training batches had a non-finite loss, and the first (a sync); None when all were finite."""
        if self._first_nonfinite_step is None or int(self._nonfinite_batches) == 0:
            return None
        epoch, batch, step, rows = (int(value) for value in self._first_nonfinite_step.tolist())
        count = int(self._nonfinite_batches)
        return (
            f"{count} training batch{'es' if count > 1 else ''} with a non-finite loss (the first: epoch {epoch}, "
            f"batch {batch}, step {step}, {rows} sample{'' if rows == 1 else 's'} with non-finite features)"
        )

    def _warn_nonfinite_loss(self) -> None:
        if self._nonfinite_warned or self._first_nonfinite_step is None:
            return
        epoch, batch, step, rows = (int(value) for value in self._first_nonfinite_step.tolist())
        if epoch < 0:
            return
        self._nonfinite_warned = True
        rank_zero_warn(
            f"{type(self).__name__}: the training loss is not finite (NaN/inf) from epoch {epoch}, batch {batch} (step "
            f"{step}), whose features are non-finite in {rows} sample{'' if rows == 1 else 's'}; the run goes on "
            "(once NaN reaches the weights, every later value is NaN): `--trainer.detect_anomaly=true` stops it at "
            "the first non-finite gradient. Check the inputs for NaN/inf, or lower the learning rate.",
            category=LayerwiseWarning,
        )

    @torch.no_grad()
    def layer_outputs(self, batch: Any) -> LayerOutputs:
        """Every layer's features and the shared head's readout for one batch (the evaluation contract)."""
        outputs = self.samples(batch)
        features, targets = outputs[FEATURES], outputs[TARGETS]
        sample_index = positions = None
        if self.backbone.token_level:  # the positions that predict a token are the samples
            batch_size, length = self.backbone.split_batch(batch)[1].shape
            keep = targets != IGNORE_INDEX
            sample_index = torch.arange(batch_size, device=keep.device).repeat_interleave(length)[keep]
            positions = torch.arange(length, device=keep.device).repeat(batch_size)[keep]
            features, targets = features[:, keep], targets[keep]
        exit_heads = self.classifier_heads() if self.num_classifiers > 1 else None
        regroup = None if self.backbone.token_level else self.data_logits
        return read_layers(
            self.reading_heads(), features, targets, self.chunk_size, exit_heads, regroup, sample_index, positions
        )

    def data_logits(self, logits: Tensor) -> Tensor:
        """The model's logits over the data's classes (see :func:`data_logits`): every metric reads these."""
        return data_logits(self, logits)

    def predict_step(self, batch: Any, batch_idx: int) -> Union[LayerOutputs, dict[str, Tensor]]:
        """Every layer's features and readout, or early-exit inference while ``early_exit`` is set.

        With ``early_exit`` (set by :class:`~layerwise.callbacks.EarlyExitPredictionWriter`) the batch runs block by
        block and returns ``predictions`` and ``exit_layers`` ``(B,)`` (1-based), plus ``targets`` when labelled;
        samples that exit skip the remaining blocks, and the full model is not run.
        """
        inputs, targets = self.backbone.split_batch(batch)
        if self.early_exit is not None:  # block by block: exited samples skip the remaining blocks
            result = early_exit_predict(self.backbone, inputs, **self.early_exit)
            outputs = {PREDICTIONS: result.predictions, EXIT_LAYERS: result.exit_layers}
            return outputs if targets is None else {**outputs, TARGETS: targets}
        if targets is None and not self.backbone.token_level:  # unlabelled images: read every layer without targets
            return read_layers(
                self.reading_heads(), self.backbone(inputs), None, self.chunk_size, regroup=self.data_logits
            )
        return self.layer_outputs(batch)

    def configure_model(self) -> None:
        """Under Lightning's ``ModelParallelStrategy`` (FSDP2): shard every block, the shared head and the backbone.

        A no-op under every other strategy (``device_mesh`` is None there) and when already sharded.
        """
        mesh = self.device_mesh
        if mesh is None or getattr(self, "_sharded", False):
            return
        from layerwise.features.sharding import shard_backbone

        names = mesh.mesh_dim_names or ()
        if "tensor_parallel" in names and mesh["tensor_parallel"].size() > 1:
            raise ValueError(
                "layerwise shards with FSDP2 over data parallelism only: set `--trainer.strategy.init_args."
                "tensor_parallel_size=1` and data_parallel_size to the number of processes."
            )
        shard_backbone(self.backbone, mesh["data_parallel"] if "data_parallel" in names else mesh)
        self._sharded = True

    def setup(self, stage: str) -> None:
        check_data_compatible(self, getattr(self.trainer, "datamodule", None), after_setup=True)
        use_checkpoint_reader(self.trainer, stage)  # before Lightning restores --ckpt_path: one line for a bad file
        if stage == "fit" and self.trainer.is_global_zero:
            print(self.head_parameter_report(), flush=True)  # on stdout with the tables; no progress bar exists yet

    def head_parameter_report(self) -> str:
        """The paper's Table 1 quantity: parameters of one shared head versus a separate head at every layer."""
        head = self.backbone.head_parameters()
        layers = self.num_layers
        backbone = sum(p.numel() for p in self.backbone.parameters())
        saving = (layers - 1) * head
        return (
            f"layerwise: one shared head has {head:,} parameters; {layers} separate exit heads would have "
            f"{layers * head:,}. Sharing saves {saving:,} parameters ({100 * saving / backbone:.2f}% of the "
            f"{backbone:,}-parameter model). This module trains {self.num_classifiers} classifier(s)."
        )

    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer_factory(self.parameters())
        if self.lr_scheduler_factory is None:
            return optimizer
        scheduler = self.lr_scheduler_factory(optimizer)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": self.scheduler_interval}}


class LastLayerMeans:
    """The exact ``<stage>/loss`` and ``<stage>/acc`` of one evaluation dataloader: float64 sums of its real rows.

    Each rank feeds only its real samples (``DistributedSampler`` repeats samples at the end of a rank's share so
    that every rank gets as many; the padding budget of :func:`~layerwise.engines.sampling.real_samples_on_rank`,
    as the analysis callbacks count it), and the sums and counts are summed over the ranks when Lightning calls
    ``compute``: the mean over every sample once, equal to one process's, where a mean of per-rank means is not.
    """

    def __init__(self) -> None:
        self.loss, self.acc = RowMean(), RowMean()
        self.budget: Optional[int] = None  # real samples this rank has left in the dataloader (None: no padding)

    def start(self, loader: Any, device: torch.device) -> None:
        """A dataloader's first batch: forget the last evaluation, take this rank's budget of real samples."""
        for metric in (self.loss, self.acc):
            metric.reset()
            metric.to(device)
        self.budget = real_samples_on_rank(loader)

    def update(self, outputs: LayerOutputs) -> None:
        """Add the last layer's loss and correctness of the batch's real rows."""
        last = torch.tensor([outputs.features.shape[0] - 1])
        real, used = outputs.select(last, self.budget)
        if self.budget is not None:
            self.budget = max(0, self.budget - used)
        readout, targets = real.readout, real.targets
        assert readout.nll is not None and targets is not None  # an evaluation step reads labelled batches
        self.loss.update(readout.nll[0])
        self.acc.update(readout.predictions[0] == targets)


def log_last_layer(
    module: LightningModule, outputs: LayerOutputs, stage: str, dataloader_idx: int, batch_idx: int = 0
) -> None:
    """Log ``<stage>/loss`` and ``<stage>/acc`` of the last layer; another evaluation set under its own name.

    Exact under DDP (:class:`LastLayerMeans`): the sampler's repeated samples are not counted and the mean is over
    every sample, so these keys need no advice from Lightning (they join ``REDUCED_KEYS``).
    """
    loaders = None
    try:
        loaders = module.trainer.val_dataloaders if stage == "val" else module.trainer.test_dataloaders
    except RuntimeError:  # not attached to a Trainer (a step called by hand): one process, nothing to drop
        pass
    if dataloader_idx:  # as the analysis callbacks report it (val_<name>), not Lightning's /dataloader_idx_N
        stage = loader_stages(stage, loaders)[dataloader_idx]
    means: dict[str, LastLayerMeans] = module.__dict__.setdefault("_last_layer_means", {})
    if stage not in means or batch_idx == 0:  # Lightning numbers the batches of every dataloader from 0
        means.setdefault(stage, LastLayerMeans())
        loader = evaluation_loaders(loaders)[dataloader_idx] if loaders is not None else None
        means[stage].start(loader, outputs.features.device)
    means[stage].update(outputs)
    REDUCED_KEYS.update((f"{stage}/loss", f"{stage}/acc"))
    # the metrics are deliberately not submodules (no state_dict entries, no FSDP wrapping): named explicitly
    options = dict(prog_bar=True, add_dataloader_idx=False)
    module.log(f"{stage}/loss", means[stage].loss, metric_attribute=f"_last_layer_means.{stage}.loss", **options)
    module.log(f"{stage}/acc", means[stage].acc, metric_attribute=f"_last_layer_means.{stage}.acc", **options)


def data_logits(module: LightningModule, logits: Tensor) -> Tensor:
    """Logits (..., C) over the model's classes -> over the data's: grouped when the datamodule has ``label_groups``.

    A datamodule whose labels are groups of the model's classes (an MNLI model on HANS: entailment vs neutral +
    contradiction) gives ``label_groups`` and ``grouping``; the logits are then grouped by
    :func:`~layerwise.metrics.functional.group_logits` before any metric reads them. Otherwise unchanged.
    """
    try:
        datamodule = getattr(module.trainer, "datamodule", None)
    except RuntimeError:  # not attached to a Trainer: no datamodule, nothing to group
        return logits
    groups = getattr(datamodule, "label_groups", None)
    return logits if groups is None else group_logits(logits, groups, getattr(datamodule, "grouping", "max"))


def check_data_compatible(model: LayerwiseModule, datamodule: Any, after_setup: bool = False) -> None:
    """Raise a ValueError naming the flag when the model's classes or vocabulary disagree with the data's.

    The vocabulary of a trained tokenizer and the labels themselves are known only after the datamodule's ``setup``:
    ``after_setup`` checks them (:func:`check_labels`).
    """
    backbone = model.backbone
    data_classes = getattr(datamodule, "num_classes", None)
    if getattr(datamodule, "label_groups", None) is not None:  # the data's classes are groups of the model's
        data_classes = getattr(datamodule, "model_classes", data_classes)
    if data_classes is not None and not backbone.token_level and data_classes != backbone.num_classes:
        raise ValueError(
            f"The model has `--model.init_args.backbone.init_args.num_classes={backbone.num_classes}` but the data "
            f"has {data_classes} classes; set num_classes={data_classes}."
        )
    patch_embed = getattr(getattr(backbone, "model", None), "patch_embed", None)
    for name, data_value, model_value in (
        ("img_size", getattr(datamodule, "img_size", None), getattr(patch_embed, "img_size", None)),
        (
            "in_chans",
            getattr(datamodule, "in_chans", None),
            getattr(getattr(patch_embed, "proj", None), "in_channels", None),
        ),
    ):
        if data_value is None or model_value is None:
            continue
        expected = tuple(model_value) if isinstance(model_value, (tuple, list)) else (model_value,) * 2
        given = tuple(data_value) if isinstance(data_value, (tuple, list)) else (data_value,) * 2
        if expected[: len(given)] != given[: len(expected)]:
            raise ValueError(
                f"The model has `--model.init_args.backbone.init_args.{name}={model_value}` but the data gives "
                f"{data_value}; set {name}={data_value}."
            )
    if after_setup and not backbone.token_level:
        groups = getattr(datamodule, "label_groups", None)
        check_labels(datamodule, backbone.num_classes if groups is None else len(groups), grouped=groups is not None)
    model_vocab = getattr(backbone, "vocab_size", None)
    if not after_setup or model_vocab is None or getattr(datamodule, "tokenizer", None) is None:
        return
    data_vocab = datamodule.vocab_size
    if data_vocab > model_vocab:
        raise UsageError(
            f"The tokenizer has {data_vocab} tokens but the model's vocabulary has {model_vocab}: set "
            f"`--model.init_args.backbone.init_args.config_overrides` vocab_size (n_vocab) to at least {data_vocab}, "
            "or use the model's own tokenizer (`--data.init_args.tokenizer`)."
        )


def check_labels(datamodule: Any, num_classes: int, grouped: bool = False) -> None:
    """Raise a UsageError naming the set, its file and the label when a label lies outside ``0..num_classes-1``.

    Run before any training or evaluation step (``LayerwiseModule.setup``), so a label the head has no class for is
    not found by ``cross_entropy`` mid-training (``IndexError: Target 12 is out of bounds``). Reads only the labels
    (:func:`~layerwise.datamodules.labels.dataset_labels`); a dataset whose labels it cannot read is not checked.
    GLUE/HANS test rows without a label (-1) are allowed in the test set.
    """
    from layerwise.datamodules.labels import dataset_labels, labelled_sets

    for role, dataset in labelled_sets(datamodule):
        found = dataset_labels(dataset)
        if found is None or found[1].size == 0:
            continue
        source, labels = found
        bad = (labels < 0) | (labels >= num_classes)
        if role == "test":
            bad &= labels != -1
        if not bad.any():
            continue
        label, count = labels[bad][0].item(), int(bad.sum())
        where = f"`{source}` ({role} set)" if source else f"The {role} set of {type(datamodule).__name__}"
        whose = (
            f"the data's {num_classes} label groups"
            if grouped
            else f"the model's {num_classes} classes (`--model.init_args.backbone.init_args.num_classes={num_classes}`)"
        )
        raise UsageError(
            f"{where} has the label {label} ({count} of {labels.size} samples outside 0..{num_classes - 1}), but "
            f"{whose} have the ids 0..{num_classes - 1}: fix those labels or use data of these classes."
        )
