"""Alternating aligned training: last-layer CE and the aligned loss on alternate steps."""

from typing import Any, Literal

from torch import Tensor

from layerwise.features import Backbone
from layerwise.lightning_modules.aligned import Aligned


class AlternatingAligned(Aligned):
    """Last-layer CE on odd steps, the aligned loss ``Σ_l λ_l CE(head(h_l), y)`` on even steps.

    Steps are counted from 1. By default the step is the *optimizer* step (``trainer.global_step + 1``), so every
    micro-batch of one gradient-accumulation step uses the same objective, and resuming from a checkpoint continues
    the alternation where it stopped. ``alternate_by="micro_batch"`` counts training batches instead, as the
    authors' own code does (identical without gradient accumulation).

    Args:
        alternate_by: ``"optimizer_step"`` (default) or ``"micro_batch"``.
        Others (sampled exits included, which then apply on the aligned steps): see :class:`Aligned`.

    Logged keys: ``train/loss_last`` and ``train/loss_aligned``, each objective under its own name on the steps it
    runs (a logger writes every ``log_every_n_steps``; a key not logged at that step keeps its latest value, so with
    an even ``log_every_n_steps`` — every written step an aligned one — the last-layer curve still exists, from the
    step before); ``train/aligned_step`` (1 when the step used the aligned loss); plus those of the base
    (``train/loss`` is the objective of the step).
    """

    def __init__(
        self,
        backbone: Backbone,
        alternate_by: Literal["optimizer_step", "micro_batch"] = "optimizer_step",
        **kwargs: Any,
    ) -> None:
        super().__init__(backbone, **kwargs)
        if alternate_by not in ("optimizer_step", "micro_batch"):
            raise ValueError(
                f"`--model.init_args.alternate_by={alternate_by!r}` must be 'optimizer_step' or 'micro_batch'."
            )
        self.alternate_by = alternate_by

    def step_number(self) -> int:
        """The 1-based step that decides the objective of the current training batch."""
        if self.alternate_by == "optimizer_step":
            return self.trainer.global_step + 1
        return self.trainer.fit_loop.total_batch_idx + 1

    def compute_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        aligned = self.step_number() % 2 == 0
        self.log("train/aligned_step", float(aligned))
        loss = self.aligned_loss(outputs) if aligned else self.last_layer_loss(outputs)
        self.objective = "aligned" if aligned else "last"  # which loss this batch's train/loss is (progress lines)
        self.log(f"train/loss_{self.objective}", loss)
        return loss
