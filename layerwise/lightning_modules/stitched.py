"""Model stitching: B's blocks after m, fed A's residual stream after block l through a trained stitching layer."""

from typing import Any, Literal, Optional, Union

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import Tensor, nn

from layerwise.engines.checkpoint import load_model
from layerwise.features.hf import no_cache
from layerwise.features.hooks import replaced_block_input, residual_after
from layerwise.features.paths import get_blocks, layer_paths, model_width
from layerwise.features.truncate import kept_blocks
from layerwise.lightning_modules.base import data_logits

Task = Literal["causal_lm", "classification"]


class StitchingLayer(nn.Module):
    """phi(h) = h + (W0 + W) h + (b0 + b) (equal widths), or (W0 + W) h + (b0 + b) between widths.

    W, b are the trained parameters, zero-initialised; W0, b0 are the start (buffers, zero unless
    :meth:`fit_least_squares` set them), so phi is identity stitching (equal widths) at step 0, or the least-squares
    map, and weight decay on W, b pulls phi back towards that start rather than towards 0. phi stays one affine map
    (:attr:`weight`, :attr:`bias` are its effective parameters).

    ``norm``: ``"pre"`` puts a LayerNorm on h (width d_A) before, ``"post"`` one on phi(h) (width d_B) after.
    ``identity=True`` is phi = id, with no parameters (equal widths only).
    """

    def __init__(self, dim_a: int, dim_b: int, norm: Literal["none", "pre", "post"] = "none", identity: bool = False):
        super().__init__()
        if norm not in ("none", "pre", "post"):
            raise ValueError(f"`phi_norm={norm!r}` must be 'none', 'pre' or 'post'.")
        if identity and dim_a != dim_b:
            raise ValueError(f"Identity stitching needs equal widths; A has {dim_a}, B has {dim_b}: use phi='learned'.")
        self.identity, self.residual = identity, dim_a == dim_b
        self.pre = nn.LayerNorm(dim_a) if norm == "pre" and not identity else nn.Identity()
        self.post = nn.LayerNorm(dim_b) if norm == "post" and not identity else nn.Identity()
        self.linear = None if identity else nn.Linear(dim_a, dim_b)
        if self.linear is not None:
            nn.init.zeros_(self.linear.weight)
            nn.init.zeros_(self.linear.bias)
            self.register_buffer("start_weight", torch.zeros(dim_b, dim_a))
            self.register_buffer("start_bias", torch.zeros(dim_b))

    @property
    def weight(self) -> Tensor:
        """The effective W0 + W (d_B, d_A) (the identity of equal widths not included)."""
        return self.start_weight + self.linear.weight

    @property
    def bias(self) -> Tensor:
        """The effective b0 + b (d_B,)."""
        return self.start_bias + self.linear.bias

    @torch.no_grad()
    def fit_least_squares(self, h_a: Tensor, h_b: Tensor) -> None:
        """Start phi at the least-squares affine map from paired residuals (N, d_A) -> (N, d_B).

        W0, b0 solve min ||phi(h_a) - h_b||^2 (before any ``post`` norm); W, b restart at 0.
        """
        if self.linear is None:
            return
        x = torch.cat([self.pre(h_a).double(), torch.ones(h_a.shape[0], 1, dtype=torch.float64, device=h_a.device)], 1)
        target = h_b.double() - (self.pre(h_a).double() if self.residual else 0.0)
        solution = torch.linalg.lstsq(x.cpu(), target.cpu()).solution.to(h_a.device)  # (d_A + 1, d_B)
        self.start_weight.copy_(solution[:-1].T)
        self.start_bias.copy_(solution[-1])
        self.linear.weight.zero_()
        self.linear.bias.zero_()

    def forward(self, h: Tensor) -> Tensor:
        if self.linear is None:
            return h
        x = self.pre(h)
        out = F.linear(x.to(self.linear.weight.dtype), self.weight, self.bias).to(h.dtype)
        return self.post(x + out if self.residual else out)


class Stitched(LightningModule):
    """The stitched model B_{>m} ∘ phi ∘ A_{<=l}; A and B frozen, only phi trains.

    A runs its embeddings and blocks 1..l (its forward is stopped there); phi maps the residual stream; B's own
    forward then runs only its blocks m+1..L (``kept_blocks``), the first of them fed phi(h), so B's masks,
    positions and RoPE are its own, and ends in B's final norm and head. Loss: next-token cross-entropy over every
    real token (``causal_lm``) or the task's cross-entropy (``classification``, batches with ``labels``).

    Validation logs, on the held-out data given: ``val/loss_stitched``, ``val/loss_a``, ``val/loss_b`` (nats per
    token, token-weighted), ``val/penalty_b`` = stitched − B and ``val/penalty_a`` = stitched − A, plus the
    accuracies for classifiers.

    Recipe (tuned-lens's, as the paper reuses it; every number a value here): SGD with Nesterov momentum 0.9,
    lr 1.0 * (1 - 0.9) = 0.1, weight decay 1e-3, ``warmup_steps`` of linear warm-up then linear decay to 0 at
    ``max_steps``; gradient clipping 1.0 and bf16 autocast are Trainer options (``gradient_clip_val``,
    ``precision``).

    Args:
        model_a: hub ids, folders or layerwise ``.ckpt`` files (or modules holding a table-known model).
        model_b: hub ids, folders or layerwise ``.ckpt`` files (or modules holding a table-known model).
        layer_a: l, the number of A's blocks that run (0 = its embeddings only).
        layer_b: m, B runs its blocks m+1..L_B (0 <= m < L_B).
        phi: ``"learned"`` or ``"identity"`` (no training; equal widths).
        phi_norm: ``"none"``, ``"pre"`` or ``"post"`` LayerNorm.
        task: ``"causal_lm"`` or ``"classification"``.
        phi_init: ``"least_squares"`` (default: W0, b0 fitted from A's residual after l to B's after m on the first
            ``init_batches`` training batches, real tokens only, more batches while they hold fewer than 2 (d_A + 1)
            tokens; :meth:`initialise_phi`, or at the start of ``fit``) or ``"zero"`` (W0 = 0, b0 = 0: identity
            stitching at step 0 for equal widths, tuned-lens's start). SGD then trains phi on the stitched model's
            loss from there, its weight decay pulling towards the start.
        init_batches: training batches used by the least-squares initialisation.
        keep_best: phi ends at the validated step whose stitched loss on the fit's validation data is lowest (the
            start included when a full sanity check runs first, ``num_sanity_val_steps=-1``), not at the last step;
            :attr:`best_step` says which (logged with the check's loss as ``dev/best_step``, ``dev/loss_stitched``).
            Give it a dev slice of the *training* data (``layerwise stitch`` does:
            ``--dev_blocks``), not the held-out data the penalty is reported on. Off by default.
    """

    def __init__(
        self,
        model_a: Union[str, Any],
        model_b: Union[str, Any],
        layer_a: int,
        layer_b: int,
        phi: Literal["learned", "identity"] = "learned",
        phi_norm: Literal["none", "pre", "post"] = "none",
        task: Task = "causal_lm",
        phi_init: Literal["least_squares", "zero"] = "least_squares",
        init_batches: int = 4,
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 1e-3,
        warmup_steps: int = 200,
        max_steps: int = 2000,
        keep_best: bool = False,
    ) -> None:
        super().__init__()
        given_modules = not (isinstance(model_a, str) and isinstance(model_b, str))
        self.save_hyperparameters(ignore=["model_a", "model_b"] if given_modules else [])
        if task not in ("causal_lm", "classification"):
            raise ValueError(f"`--model.init_args.task={task!r}` must be 'causal_lm' or 'classification'.")
        if phi not in ("learned", "identity"):
            raise ValueError(f"`--model.init_args.phi={phi!r}` must be 'learned' or 'identity'.")
        self.model_a = load_model(model_a, "--model.init_args.model_a", task).eval().requires_grad_(False)
        self.model_b = load_model(model_b, "--model.init_args.model_b", task).eval().requires_grad_(False)
        self.blocks_a = get_blocks(self.model_a, layer_paths(self.model_a, "--model.init_args.model_a"))
        self.blocks_b = get_blocks(self.model_b, layer_paths(self.model_b, "--model.init_args.model_b"))
        if not 0 <= layer_a <= len(self.blocks_a):
            raise ValueError(f"`--model.init_args.layer_a={layer_a}` must lie in 0..{len(self.blocks_a)} (A's blocks).")
        if not 0 <= layer_b < len(self.blocks_b):
            raise ValueError(
                f"`--model.init_args.layer_b={layer_b}` must lie in 0..{len(self.blocks_b) - 1}: B runs blocks m+1..L."
            )
        self.layer_a, self.layer_b, self.task = layer_a, layer_b, task
        self._no_cache = no_cache(self.model_b)  # B's kept blocks keep their own layer_idx
        width_a, width_b = model_width(self.model_a), model_width(self.model_b)
        self.phi = StitchingLayer(width_a, width_b, phi_norm, identity=phi == "identity")
        if phi_init not in ("least_squares", "zero"):
            raise ValueError(f"`--model.init_args.phi_init={phi_init!r}` must be 'least_squares' or 'zero'.")
        self.phi_init, self.init_batches = phi_init, init_batches
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.warmup_steps, self.max_steps = warmup_steps, max_steps
        self.keep_best, self.best_step = keep_best, None
        self._phi_ready = phi_init == "zero" or self.phi.linear is None
        self._best: Optional[tuple[float, dict[str, Tensor]]] = None
        self._dev_sum: Optional[Tensor] = None  # (token-weighted loss sum, tokens) of a dev check

    def train(self, mode: bool = True) -> "Stitched":
        """Only phi follows the mode: A and B stay in eval mode (no dropout in the frozen models)."""
        super().train(mode)
        self.model_a.eval()
        self.model_b.eval()
        return self

    def on_train_start(self) -> None:
        """Least-squares initialisation of phi on the first training batches, unless done (``phi_init``)."""
        if not self._phi_ready:
            self.initialise_phi(self.trainer.train_dataloader)

    def initialise_phi(self, loader: Any) -> None:
        """The least-squares start of phi from the first ``init_batches`` batches of ``loader`` (``phi_init``).

        Call it before ``Trainer.fit`` to have the sanity check measure that start (``keep_best``); otherwise the fit
        calls it when training starts.
        """
        self._phi_ready, self._best = True, None
        if self.phi_init != "least_squares" or self.phi.linear is None:
            return
        pairs_a, pairs_b, rows_needed = [], [], 2 * (self.phi.linear.in_features + 1)
        for index, batch in enumerate(loader):
            if index >= self.init_batches and sum(len(h) for h in pairs_a) >= rows_needed:
                break
            batch = self.transfer_batch_to_device(batch, self.device, 0)
            h_b = self.residual_b(batch)
            h_a, mask = self.residual_a(batch), batch.get("attention_mask")
            rows = torch.ones(h_a.shape[:2], dtype=torch.bool, device=h_a.device) if mask is None else mask.bool()
            pairs_a.append(h_a[rows])
            pairs_b.append(h_b[rows])
        self.phi.fit_least_squares(torch.cat(pairs_a), torch.cat(pairs_b))

    # -- keep_best: phi of the validated step with the lowest stitched loss -----------------------------------------
    def _selecting(self) -> bool:
        return self.keep_best and self.phi.linear is not None and self.trainer.state.fn == "fit"

    def on_validation_epoch_start(self) -> None:
        self._dev_sum = None

    def on_validation_epoch_end(self) -> None:
        if not self._selecting() or self._dev_sum is None:
            return
        if self.trainer.sanity_checking and (not self._phi_ready or self.trainer.num_sanity_val_steps != float("inf")):
            return  # a partial pass, or a start that on_train_start replaces: not comparable
        total, count = self.trainer.strategy.reduce(self._dev_sum, reduce_op="sum").tolist()
        loss = total / count
        if self._best is None or loss < self._best[0]:
            self._best = (loss, {key: value.detach().clone() for key, value in self.phi.state_dict().items()})
            self.best_step = self.global_step
        if not self.trainer.sanity_checking:  # already summed over ranks: the same value on every rank
            self.log_dict({"dev/loss_stitched": loss, "dev/best_step": float(self.best_step)}, sync_dist=False)

    def on_fit_end(self) -> None:
        if self.keep_best and self._best is not None:
            self.phi.load_state_dict(self._best[1])

    # -- the stitched model ----------------------------------------------------------------------------------------
    def _inputs(self, batch: Any) -> dict[str, Tensor]:
        return {key: batch[key] for key in ("input_ids", "attention_mask", "token_type_ids") if key in batch}

    def residual_a(self, batch: Any) -> Tensor:
        """A's residual stream after block l, (B, T, d_A), no gradient."""
        with torch.no_grad():
            return residual_after(self.blocks_a, self.layer_a, lambda: self.model_a(**self._inputs(batch)))

    def residual_b(self, batch: Any) -> Tensor:
        """B's own residual stream after block m, (B, T, d_B), no gradient (the target of the least squares)."""
        with torch.no_grad():
            return residual_after(self.blocks_b, self.layer_b, lambda: self.model_b(**self._inputs(batch)))

    def forward(self, batch: Any) -> Tensor:
        """Logits of the stitched model: B runs only its blocks m+1..L, the first of them fed phi(h)."""
        hidden = self.phi(self.residual_a(batch))
        with kept_blocks(self.model_b, self.layer_b, len(self.blocks_b), option="--model.init_args.layer_b"):
            upper = get_blocks(self.model_b, layer_paths(self.model_b))
            with replaced_block_input(upper, 0, hidden):
                return self.model_b(**self._inputs(batch), **self._no_cache).logits

    def loss(self, logits: Tensor, batch: Any) -> tuple[Tensor, Tensor, Tensor]:
        """Mean loss, number of predictions and number correct."""
        if self.task == "classification":
            labels, logits = batch["labels"], data_logits(self, logits)  # grouped for HANS-style data
            loss = F.cross_entropy(logits.float(), labels)
            return loss, torch.tensor(labels.numel()), (logits.argmax(-1) == labels).sum()
        targets = batch["input_ids"][:, 1:]
        mask = batch.get("attention_mask")
        valid = torch.ones_like(targets, dtype=torch.bool) if mask is None else mask[:, 1:].bool() & mask[:, :-1].bool()
        flat = logits[:, :-1][valid].float()
        loss = F.cross_entropy(flat, targets[valid])
        return loss, valid.sum(), (flat.argmax(-1) == targets[valid]).sum()

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        loss, count, _ = self.loss(self(batch), batch)
        self.log("train/loss", loss, batch_size=int(count), prog_bar=True)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        stitched, count, correct = self.loss(self(batch), batch)
        if self._selecting():  # a dev check during fit: the stitched loss only (token-weighted, summed over ranks)
            weighted = torch.stack([stitched.detach().double() * count, count.to(stitched.device).double()])
            self._dev_sum = weighted if self._dev_sum is None else self._dev_sum + weighted
            return
        with torch.no_grad():
            loss_a, _, correct_a = self.loss(self.model_a(**self._inputs(batch)).logits, batch)
            loss_b, _, correct_b = self.loss(self.model_b(**self._inputs(batch)).logits, batch)
        size = int(count)
        values = {
            "val/loss_stitched": stitched,
            "val/loss_a": loss_a,
            "val/loss_b": loss_b,
            "val/penalty_b": stitched - loss_b,
            "val/penalty_a": stitched - loss_a,
        }
        if self.task == "classification":
            values.update(
                {
                    "val/acc_stitched": correct / count,
                    "val/acc_drop_b": (correct_b - correct) / count,
                    "val/acc_drop_a": (correct_a - correct) / count,
                }
            )
        self.log_dict(values, batch_size=size, sync_dist=True)

    def configure_optimizers(self) -> Any:
        parameters = [p for p in self.phi.parameters() if p.requires_grad]
        if not parameters:
            return None  # identity stitching: nothing to train
        optimizer = torch.optim.SGD(
            parameters, lr=self.lr, momentum=self.momentum, nesterov=self.momentum > 0, weight_decay=self.weight_decay
        )
        warmup, total = self.warmup_steps, self.max_steps

        def factor(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            return max(0.0, (total - step) / max(1, total - warmup))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
