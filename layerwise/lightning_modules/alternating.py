"""Alternating aligned training: last-layer CE and the aligned loss on alternate steps."""

from typing import Any, Literal, Optional

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
        backbone: see :class:`Aligned`.
        layer_weights: see :class:`Aligned`.
        sampled_exits: see :class:`Aligned`.
        exit_sampling: see :class:`Aligned`.
        sampling_seed: see :class:`Aligned`.
        optimizer: see :class:`Aligned`.
        lr_scheduler: see :class:`Aligned`.
        scheduler_interval: see :class:`Aligned`.
        label_smoothing: see :class:`Aligned`.
        chunk_size: see :class:`Aligned`.

    Logged keys: ``train/loss_last`` and ``train/loss_aligned``, each the mean of that objective's losses over the
    steps since the logger last wrote (the window of ``log_every_n_steps`` optimizer steps ending at the written
    one), so both are curves of their own steps whatever ``log_every_n_steps`` is: with an even one every written
    step is an aligned step, and a value of that step alone would never show the last-layer objective (with
    ``log_every_n_steps: 1`` a window holds one step: the other objective's curve repeats its latest mean). Plus
    those of the base: ``train/loss`` and ``train/acc`` are the written step's own (the progress bar's), of one
    objective only at an even ``log_every_n_steps``.
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
        self._window: Optional[int] = None  # the logging window of the sums below
        self._sums: dict[str, tuple[Tensor, int]] = {}  # objective -> (sum of its losses, steps) in that window

    def step_number(self) -> int:
        """The 1-based step that decides the objective of the current training batch."""
        if self.alternate_by == "optimizer_step":
            return self.trainer.global_step + 1
        return self.trainer.fit_loop.total_batch_idx + 1

    def compute_loss(self, outputs: dict[str, Tensor]) -> Tensor:
        aligned = self.step_number() % 2 == 0
        loss = self.aligned_loss(outputs) if aligned else self.last_layer_loss(outputs)
        self.objective = "aligned" if aligned else "last"  # which loss this batch's train/loss is (progress lines)
        self._log_window_means(self.objective, loss)
        return loss

    def _log_window_means(self, objective: str, loss: Tensor) -> None:
        """Log each objective's mean loss over the current logging window (on the device: no sync)."""
        every = self.trainer.log_every_n_steps  # type: ignore[attr-defined]  # set by Lightning's logger connector
        window = self.trainer.global_step // every if every > 0 else 0  # Lightning writes each window's last step
        if window != self._window:
            self._window, self._sums = window, {}
        total, count = self._sums.get(objective, (loss.new_zeros(()), 0))
        self._sums[objective] = (total + loss.detach(), count + 1)
        for name, (total, count) in self._sums.items():
            self.log(f"train/loss_{name}", total / count)
