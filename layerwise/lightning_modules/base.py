"""The shared-head base that every training strategy builds on."""

import abc
from typing import Any, Literal, Optional

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor

from layerwise.features import FEATURES, LOGITS, TARGETS, TimmViT


class LayerwiseModule(LightningModule, abc.ABC):
    """Base LightningModule: one backbone pass gives every layer's feature and the shared head's logits per layer.

    Subclasses (the training strategies) override only :meth:`compute_loss` (and, for separate exit classifiers,
    :meth:`layer_outputs`). ``validation_step``, ``test_step`` and ``predict_step`` run the backbone once and return
    the dict described in :mod:`layerwise.features.outputs`: ``features`` ``(L, B, d)``, ``logits`` ``(L, B, C)``
    (the model's own final norm + classifier applied to every layer), ``targets`` ``(B,)``; the analysis callbacks
    read it, so they never run a second forward pass.

    Args:
        backbone: the layer tap, e.g. :class:`layerwise.features.TimmViT`.
        optimizer: optimizer factory (LightningCLI ``class_path``/``init_args``), called with the parameters.
        lr_scheduler: optional scheduler factory, called with the optimizer.
        scheduler_interval: whether the scheduler steps every ``"epoch"`` or every optimizer ``"step"``.
        label_smoothing: label smoothing of every cross-entropy term.

    Logged keys: ``train/loss``, ``train/acc`` (last layer), ``val/loss``, ``val/acc`` (last layer, shared head);
    ``test/...`` likewise.
    """

    def __init__(
        self,
        backbone: TimmViT,
        optimizer: OptimizerCallable = torch.optim.AdamW,
        lr_scheduler: Optional[LRSchedulerCallable] = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"`--model.init_args.label_smoothing={label_smoothing}` must lie in [0, 1).")
        # Under LightningCLI the hyper-parameters are the parsed config (class paths included), which is what
        # `load_from_checkpoint` needs; built in Python, the backbone and factories are objects, not hyper-parameters.
        self.save_hyperparameters(ignore=[] if _built_by_lightning_cli() else ["backbone", "optimizer", "lr_scheduler"])
        self.backbone = backbone
        self.optimizer_factory = optimizer
        self.lr_scheduler_factory = lr_scheduler
        self.scheduler_interval = scheduler_interval
        self.label_smoothing = label_smoothing

    @property
    def num_layers(self) -> int:
        """Number of transformer blocks ``L``."""
        return self.backbone.num_layers

    @property
    def num_classifiers(self) -> int:
        """How many classifiers the strategy trains: one shared head."""
        return 1

    def forward(self, x: Tensor) -> Tensor:
        """The model's own logits (shared head on the last layer)."""
        return self.backbone.head(self.backbone(x)[-1])

    def layer_outputs(self, x: Tensor) -> dict[str, Tensor]:
        """One backbone pass: per-layer features ``(L, B, d)`` and shared-head logits ``(L, B, C)``."""
        features = self.backbone(x)
        return {FEATURES: features, LOGITS: self.backbone.head(features)}

    @abc.abstractmethod
    def compute_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        """The strategy's training objective; ``outputs`` holds ``layer_outputs`` plus ``targets``."""

    def cross_entropy(self, logits: Tensor, targets: Tensor) -> Tensor:
        """Cross-entropy with the configured label smoothing; ``logits`` ``(..., B, C)`` gives shape ``(...)``."""
        if logits.ndim == 2:
            return F.cross_entropy(logits, targets, label_smoothing=self.label_smoothing)
        per_layer = [F.cross_entropy(layer, targets, label_smoothing=self.label_smoothing) for layer in logits]
        return torch.stack(per_layer)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = batch
        outputs = self.layer_outputs(x)
        outputs[TARGETS] = y
        loss = self.compute_loss(outputs)
        accuracy = (outputs[LOGITS][-1].argmax(-1) == y).float().mean()
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/acc", accuracy, prog_bar=True)
        return loss

    def _evaluation_step(self, batch: Any, stage: str) -> dict[str, Tensor]:
        x, y = batch
        outputs = self.layer_outputs(x)
        outputs[TARGETS] = y
        last = outputs[LOGITS][-1]
        self.log(f"{stage}/loss", F.cross_entropy(last, y), prog_bar=True, sync_dist=True)
        self.log(f"{stage}/acc", (last.argmax(-1) == y).float().mean(), prog_bar=True, sync_dist=True)
        return {key: value.detach() for key, value in outputs.items()}

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
        return self._evaluation_step(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
        return self._evaluation_step(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
        x = batch[0] if isinstance(batch, (tuple, list)) else batch
        outputs = {key: value.detach() for key, value in self.layer_outputs(x).items()}
        if isinstance(batch, (tuple, list)) and len(batch) > 1:
            outputs[TARGETS] = batch[1]
        outputs["predictions"] = outputs[LOGITS].argmax(-1)
        return outputs

    def setup(self, stage: str) -> None:
        check_data_compatible(self, getattr(self.trainer, "datamodule", None))
        if stage == "fit":
            rank_zero_info(self.head_parameter_report())

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


def _built_by_lightning_cli() -> bool:
    """Whether LightningCLI is instantiating this module (it hands its parsed config over as hyper-parameters)."""
    try:
        from lightning.pytorch.core.mixins.hparams_mixin import _given_hyperparameters
    except ImportError:  # older or newer Lightning without the mechanism: fall back to ignoring objects
        return False
    return _given_hyperparameters.get() is not None


def check_data_compatible(model: LayerwiseModule, datamodule: Any) -> None:
    """Raise a ValueError naming the flag when the model's class count disagrees with the data's."""
    data_classes = getattr(datamodule, "num_classes", None)
    model_classes = model.backbone.num_classes
    if data_classes is not None and data_classes != model_classes:
        raise ValueError(
            f"The model has `--model.init_args.backbone.init_args.num_classes={model_classes}` but the data has "
            f"{data_classes} classes; set num_classes={data_classes}."
        )
