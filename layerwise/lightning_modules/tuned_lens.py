"""The tuned lens (Belrose et al. 2023): a frozen model, one affine translator per layer, trained as a Lightning fit."""

from pathlib import Path
from typing import Any, Optional, Union, cast

import torch
from torch import Tensor

from layerwise.engines.checkpoint import frozen_backbone
from layerwise.engines.lens import TUNED_LENS_FILE, Translators, save_translators
from layerwise.engines.readout import DEFAULT_CHUNK_SIZE, Head, chunked_kl_divergence
from layerwise.features import FEATURES, IGNORE_INDEX, TARGETS, Backbone
from layerwise.lightning_modules.base import LayerwiseModule


class TunedLens(LayerwiseModule):
    """A frozen backbone and a tuned lens at every layer: ``head(h_l + A_l h_l + b_l)``, ``A_l = b_l = 0`` at start.

    The model's own head (final norm + classifier) reads layer ``l`` after an affine translator; the translators are
    trained so that the lens's distribution at every layer matches the model's final one. The objective is
    tuned-lens's ``LossChoice.KL`` (``scripts/train_loop.py``, abdac0c):

        loss = Σ_{l=1}^{L-1} mean_rows KL( softmax(head(h_L)) || softmax(head(h_l + A_l h_l + b_l)) )

    over every sample (classifiers: one pooled feature per image) or every token (language models: the positions
    with a next token, so padding is left out; tuned-lens's KL matches each position's own final distribution,
    ``token_shift=0``, as here). The last layer has no translator (tuned-lens: "the final layer ... does not need a
    translator"). Each layer's loss is read through the one readout's
    :func:`~layerwise.engines.readout.chunked_kl_divergence`, in checkpointed token chunks for language models.

    Defaults (tuned-lens's ``ingredients.Optimizer`` with ``optimizer=sgd``): SGD, Nesterov momentum 0.9,
    ``lr = lr_scale * (1 - momentum) = 0.1`` (tuned-lens undoes PyTorch's ``1 / (1 - β)`` scaling of momentum SGD),
    weight decay 1e-3 (towards the identity map, since ``A`` and ``b`` are added to ``h``), no warm-up for SGD, then
    a linear decay of the learning rate to 0 over the fit's optimizer steps
    (``get_linear_schedule_with_warmup``); gradient-norm clipping at 1.0 is the Trainer's ``gradient_clip_val``
    (set in the shipped configs). Not taken: tuned-lens's bf16 autocast of the loss (``--trainer.precision``) and its
    2^18 tokens per step (the shipped configs' batch).

    The backbone comes from a ``layerwise fit`` checkpoint or is given (any :class:`~layerwise.features.Backbone`:
    timm ViT, Hugging Face encoder or causal LM, a user's model through its layer paths); it is frozen and stays in
    evaluation mode. Evaluation reads every layer through the tuned lens (``layer_outputs``), so a
    :class:`~layerwise.callbacks.LayerwiseAnalysis` of the fit reports the tuned lens's per-layer accuracy and loss.
    At the end of the fit (and with every checkpoint) the translators are written to
    ``<log_dir>/tuned_lens.safetensors`` (:func:`~layerwise.engines.lens.save_translators`), which ``lens=`` of the
    logit-lens analysis and ``layerwise lens --lens`` read.

    Args:
        checkpoint: a ``layerwise fit`` checkpoint (``.ckpt``) whose backbone gets the lens.
        backbone: or the backbone itself; exactly one of the two.
        lr: SGD learning rate (PyTorch's; tuned-lens's ``lr_scale`` 1.0 times ``1 - momentum``).
        momentum: Nesterov momentum (0: plain SGD).
        weight_decay: SGD weight decay.
        warmup_steps: linear warm-up steps before the linear decay (tuned-lens: 0 for SGD).
        chunk_size: rows per chunk of the head.

    Logged: ``train/loss`` (the summed KL), ``train/kl/layer_XX``; evaluation as every layerwise module
    (``val/loss``, ``val/acc``: the last layer, where the lens is the model's head).
    """

    def __init__(
        self,
        checkpoint: Optional[str] = None,
        backbone: Optional[Backbone] = None,
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 1e-3,
        warmup_steps: int = 0,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> None:
        option = "--model.init_args"
        for name, value, low in (("lr", lr, 0.0), ("momentum", momentum, 0.0), ("weight_decay", weight_decay, 0.0)):
            if not isinstance(value, (int, float)) or not value >= low or (name == "momentum" and value >= 1):
                raise ValueError(
                    f"`{option}.{name}={value!r}` must be a number >= 0{' and < 1' * (name == 'momentum')}."
                )
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ValueError(f"`{option}.warmup_steps={warmup_steps!r}` must be an integer >= 0.")
        backbone = cast(Backbone, frozen_backbone("TunedLens", checkpoint, backbone))
        super().__init__(backbone, chunk_size=chunk_size)  # its hyper-parameters: these arguments too
        self.backbone.requires_grad_(False).eval()
        self.translators = Translators(backbone.num_layers, backbone.embed_dim)
        self.lr, self.momentum, self.weight_decay, self.warmup_steps = lr, momentum, weight_decay, warmup_steps

    def train(self, mode: bool = True) -> "TunedLens":
        """Train the translators; the frozen backbone stays in evaluation mode (no dropout)."""
        super().train(mode)
        self.backbone.eval()
        return self

    def reading_heads(self) -> Union[Head, list[Head]]:
        """Every layer read through its translator (the last layer: the head itself)."""
        return self.translators.heads(self.backbone.head)

    def samples(self, batch: Any) -> dict[str, Tensor]:
        with torch.no_grad():  # the frozen model: no graph
            return super().samples(batch)

    def layer_kl(self, outputs: dict[str, Tensor]) -> Tensor:
        """``(L - 1,)``: each layer's mean KL from the last layer's distribution to its tuned lens's."""
        features, targets = outputs[FEATURES], outputs[TARGETS]
        if self.backbone.token_level:  # every position with a next token: padding left out
            features = features[:, targets != IGNORE_INDEX]
        head, heads = self.backbone.head, self.translators.heads(self.backbone.head)
        recompute = self.backbone.token_level
        losses = [
            chunked_kl_divergence(heads[layer], head, features[layer], features[-1], 1.0, self.chunk_size, recompute)
            for layer in range(self.num_layers - 1)
        ]
        return torch.stack(losses) if losses else features.new_zeros(0)

    def compute_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        """The tuned-lens objective: the layers' KL summed."""
        kl = self.layer_kl(outputs)
        width = max(2, len(str(self.num_layers)))
        if self._trainer is not None:  # a loss computed by hand is not logged
            self.log_dict({f"train/kl/layer_{i:0{width}d}": value for i, value in enumerate(kl.detach(), 1)})
        return kl.sum()

    def head_parameter_report(self) -> str:
        translators = sum(p.numel() for p in self.translators.parameters())
        return (
            f"layerwise: a tuned lens of {self.num_layers - 1} affine translators ({translators:,} parameters) on a "
            f"frozen {sum(p.numel() for p in self.backbone.parameters()):,}-parameter model."
        )

    def configure_model(self) -> None:
        """Under FSDP2 the backbone is sharded as every module's, and each translator is its own unit."""
        super().configure_model()
        mesh = self.device_mesh
        if mesh is None or getattr(self, "_translators_sharded", False):
            return
        from torch.distributed.fsdp import fully_shard

        names = mesh.mesh_dim_names or ()
        for translator in self.translators.translators:
            fully_shard(translator, mesh=mesh["data_parallel"] if "data_parallel" in names else mesh)
        self._translators_sharded = True

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(
            self.translators.parameters(),
            lr=self.lr,
            momentum=self.momentum,
            nesterov=self.momentum > 0,
            weight_decay=self.weight_decay,
        )
        warmup, total = self.warmup_steps, max(1, int(self.trainer.estimated_stepping_batches))

        def factor(step: int) -> float:  # transformers' get_linear_schedule_with_warmup
            if step < warmup:
                return (step + 1) / warmup
            return max(0.0, (total - step) / max(1, total - warmup))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.save_lens()

    def on_fit_end(self) -> None:
        self.save_lens()

    def lens_file(self) -> Optional[Path]:
        """Where the fit writes the translators: ``<log_dir>/tuned_lens.safetensors`` (None: no log folder)."""
        log_dir = getattr(self.trainer, "log_dir", None) if self._trainer is not None else None
        return None if log_dir is None else Path(log_dir) / TUNED_LENS_FILE

    def save_lens(self, path: Optional[Path] = None) -> Optional[Path]:
        """Write the translators (global rank zero) to ``path`` or :meth:`lens_file`; returns the path."""
        path = path or self.lens_file()
        if path is None:
            return None
        translators = self._full_translators()
        if self.trainer.is_global_zero:
            save_translators(path, translators)
        return path

    def _full_translators(self) -> Translators:
        """The translators on the CPU, gathered from their shards under FSDP2 (a collective there)."""
        state = {
            name: value.full_tensor() if hasattr(value, "full_tensor") else value
            for name, value in self.translators.state_dict().items()
        }
        full = Translators(self.translators.num_layers, self.translators.d_model)
        full.load_state_dict({name: value.detach().cpu() for name, value in state.items()})
        return full
